"""Training an eagle or EAGLE-3 head on torch: the twin of ``eagle_train.py``'s objectives and its
optimiser step, for ``train_head(..., stepper=TorchStepper(head, cfg, torch_target))``.

The loop, batches, log and checkpoints stay in ``eagle_train.py``; this trains the head's torch
twin (``torchpath.model.EagleHead`` or ``Eagle3Head``, built ``from_mlx``) and copies the weights
back into the MLX head whenever it is saved. The objectives are the MLX ones term for term
(``tests/test_eagle.py`` checks the values and gradients against them); the optimiser is
torch's AdamW, which corrects Adam's moment bias where MLX's does not, so the two backends'
runs start alike and drift apart, as two seeds would. On this CPU a step ran 2.3-2.9x faster than
MLX's on the same batches, run alternately (§18 of benchmarks/notes/2026-12-01-history.md), and 1.7x faster again once the
teacher's side of the losses was computed once per batch (§19 there).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
import torch
import torch.nn.functional as F

from mlxspec.core.drafters.eagle3 import Eagle3Head as MlxEagle3Head
from mlxspec.core.sampling import SamplingParams
from mlxspec.torchpath import sampling
from mlxspec.torchpath.model import Eagle3Head, EagleHead, Llama
from mlxspec.training.eagle_train import EagleTrainConfig
from mlxspec.training.train import warmup_cosine


class _StepKeys:
    """``training.eagle_train``'s stand-in cache for one unrolled step, in torch."""

    offset = 0  # positions are always given explicitly

    def __init__(self) -> None:
        self.keys: torch.Tensor | None = None
        self.values: torch.Tensor | None = None

    def update_and_fetch(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.keys is not None:
            k, v = torch.cat([self.keys, k], dim=2), torch.cat([self.values, v], dim=2)
        self.keys, self.values = k, v
        return k, v


def unroll_mask(length: int, step: int, device: Any) -> torch.Tensor:
    t = torch.arange(length, device=device)[:, None]
    s = torch.arange(length, device=device)[None, :]
    return torch.cat([s <= t - (step - 1)] + [s == t - (step - i) for i in range(2, step + 1)], dim=1)


def unroll(head: EagleHead | Eagle3Head, features: torch.Tensor, tokens: torch.Tensor, k: int) -> list[torch.Tensor]:
    length = features.shape[1]
    positions = torch.arange(length, device=features.device)
    keys, outs, inp = _StepKeys(), [], features
    for step in range(1, k + 1):
        pred = head.predict(inp, tokens, [keys], mask=unroll_mask(length, step, features.device), positions=positions)
        outs.append(pred)
        inp = torch.cat([torch.zeros_like(pred[:, :1]), pred[:, :-1]], dim=1)
    return outs


def _logprobs(x: torch.Tensor, temp: float) -> torch.Tensor:
    return torch.log_softmax(x if temp == 1.0 else x / temp, dim=-1)


def _masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    valid = mask > 0
    return torch.where(valid, values, 0.0).sum() / valid.sum().clamp(min=1)


# The losses below are ``training.losses``' term for term, arranged for speed on a CPU: half of a
# step went to elementwise work over (rows, head vocabulary) tensors, so the teacher's side is
# computed once per batch (``Teacher``) instead of once per unrolled step, and masks apply to each
# row's result, not to whole logit rows (every row scored here is finite).


class Teacher:
    """The teacher's distribution over the head's columns at the training temperature, with
    what each loss needs of it, computed once per batch."""

    def __init__(self, logits: torch.Tensor, temp: float, min_p: float = 0.0):
        self.log_p = _logprobs(logits.detach(), temp)
        self.p = self.log_p.exp()
        self.neg_entropy = (self.p * self.log_p).sum(-1)
        # At T = 1 the target's own probabilities, mass outside the head's columns left out (as
        # ``training.losses.wtv_acceptance``); at other temperatures p^T over the columns; at a
        # min-p, only the tokens the chat's sampler keeps, renormalised.
        self.p_accept = (sampling.probs(logits.detach(), SamplingParams(temp, min_p=min_p)) if min_p > 0
                         else logits.detach().exp() if temp == 1.0 else self.p)


def kl_rows(teacher: Teacher, log_q: torch.Tensor) -> torch.Tensor:
    """KL(p^T || q^T) per row, ``log_q`` the head's log-probabilities at the same temperature."""
    return teacher.neg_entropy - (teacher.p * log_q).sum(-1)


def eal_acceptance(log_q1: torch.Tensor, cols: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """q(argmax p) at T = 1, ``log_q1`` the head's log-probabilities at T = 1."""
    ok = (cols >= 0) & (mask > 0)
    log_a = log_q1.gather(-1, torch.where(ok, cols, 0).long()[..., None])[..., 0]
    return torch.where(ok, log_a.exp(), 0.0)


def wtv_acceptance(teacher: Teacher, log_q: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """sum min(p^T, q^T) per row."""
    return torch.where(mask > 0, torch.minimum(teacher.p_accept, log_q.exp()).sum(-1), 0.0)


def where_fit(a: torch.Tensor, z: torch.Tensor, cols: torch.Tensor, top: int) -> torch.Tensor:
    """``training.losses.where_fit(a, fits(z, cols, top))``."""
    z = z.detach()
    kth = z.topk(top, -1).values[..., -1]
    fit = (cols >= 0) & (z.gather(-1, cols.clamp(min=0).long()[..., None])[..., 0] >= kth)
    return torch.where(fit, a, a.detach())


def chain_expected_length(accepts: list[torch.Tensor]) -> torch.Tensor:
    run = torch.ones_like(accepts[0])
    total = torch.zeros_like(run)
    for j, a in enumerate(accepts):
        shifted = a if j == 0 else torch.cat([a[:, j:], a.new_zeros((a.shape[0], j))], dim=1)
        run = run * shifted
        total = total + run
    return total


def objectives(head: EagleHead | Eagle3Head, batch: dict[str, torch.Tensor], cfg: EagleTrainConfig, lam: float):
    """``training.eagle_train.objectives`` on torch: (loss, kl, feature loss, first-draft
    acceptance, chain length)."""
    B, length = batch["mask"].shape
    rows = batch["rows"]

    def flat(x: torch.Tensor) -> torch.Tensor:
        return x.reshape(B * length, *x.shape[2:])[rows][None]

    target = flat(batch["next_features"])
    teacher = Teacher(target @ batch["teacher_rows"].T - flat(batch["lse"])[..., None], cfg.temp, cfg.min_p)
    cols = flat(batch["cols"])
    kls, feat_losses, accepts = [], [], []
    regress = not isinstance(head, Eagle3Head)  # an EAGLE-3 head's output is in its own space
    for j, pred in enumerate(unroll(head, batch["features"], batch["tokens"], cfg.k)):
        mask = flat(batch["mask"] * (torch.arange(length, device=rows.device) >= j)[None, :])
        p = flat(pred)
        z = head.logits(p)
        log_q = _logprobs(z, cfg.temp)
        if cfg.loss == "kl" or lam > 0:
            kls.append(_masked_mean(kl_rows(teacher, log_q), mask))
        elif j == 0:
            kls.append(_masked_mean(kl_rows(teacher, log_q.detach()), mask))
        if regress:
            huber = F.smooth_l1_loss(p, target, reduction="none").mean(-1)
            feat_losses.append((huber * mask).sum() / mask.sum().clamp(min=1.0))
        else:
            feat_losses.append(p.new_zeros(()))
        if cfg.loss == "eal":
            a = eal_acceptance(log_q if cfg.temp == 1.0 else _logprobs(z, 1.0), cols, mask)
        else:
            a = wtv_acceptance(teacher, log_q, mask)
        if cfg.fit_top:
            a = where_fit(a, z, cols, cfg.fit_top)
        accepts.append(a.new_zeros(B * length).index_add(0, rows, a[0]).reshape(B, length))
    kl, feat = sum(kls) / len(kls), sum(feat_losses) / cfg.k
    count = batch["mask"].sum().clamp(min=1.0)
    chain = (chain_expected_length(accepts) * batch["mask"]).sum() / count
    first = (accepts[0] * batch["mask"]).sum() / count
    token = kl if cfg.loss == "kl" else lam * kl + (1.0 - lam) * (-chain / cfg.k)
    return token + cfg.feature_weight * feat, kl, feat, first, chain


def to_torch_batch(batch: dict[str, mx.array], device: torch.device) -> dict[str, torch.Tensor]:
    """``make_batch``'s arrays as float32 / int64 tensors on ``device``."""
    out = {}
    for k, v in batch.items():
        a = np.array(v.astype(mx.float32) if v.dtype in (mx.float16, mx.bfloat16) else v)
        t = torch.from_numpy(a)
        out[k] = (t.long() if k in ("tokens", "cols", "rows") else t.float()).to(device)
    return out


class TorchStepper:
    """``training.eagle_train.MlxStepper`` on torch: trains the head's twin, copies the weights
    back into the MLX head on ``sync``."""

    name = "torch"

    def __init__(self, head: Any, cfg: EagleTrainConfig, target: Llama):
        self.head, self.cfg, self.target = head, cfg, target
        self.device = target.device
        self.schedule = warmup_cosine(cfg.lr, cfg.warmup, cfg.steps)
        self.twin: EagleHead | None = None  # built on first use: a resumed head loads its weights first
        self.opt: torch.optim.Optimizer | None = None
        self.updates = 0
        self._rows: tuple[mx.array, torch.Tensor] | None = None  # the teacher's rows, converted once

    def _ready(self) -> None:
        if self.twin is None:
            twin = Eagle3Head if isinstance(self.head, MlxEagle3Head) else EagleHead
            self.twin = twin.from_mlx(self.head, self.target).float().requires_grad_(True)
            self.opt = torch.optim.AdamW(list(self.twin.parameters()), lr=self.cfg.lr, weight_decay=0.0)

    def step(self, batch: dict[str, mx.array], lam: float) -> tuple[float, float, float, float, float]:
        self._ready()
        governor = getattr(self.target, "threads", None)  # the target's thread governor, when it has one
        if governor is not None:
            # torch's threads wait for each other at every op: a second thread on a core another
            # process holds made steps ~5x slower here (two trainings side by side)
            governor.tick()
        for g in self.opt.param_groups:  # MLX's schedule, read at MLX's update count
            g["lr"] = float(self.schedule(mx.array(self.updates)).item())
        b = to_torch_batch({k: v for k, v in batch.items() if k != "teacher_rows"}, self.device)
        b["teacher_rows"] = self._teacher_rows(batch["teacher_rows"])
        loss, kl, feat, first, chain = objectives(self.twin, b, self.cfg, lam)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.twin.parameters(), self.cfg.clip)
        self.opt.step()
        self.updates += 1
        return loss.item(), kl.item(), feat.item(), first.item(), chain.item()

    def _teacher_rows(self, rows: mx.array) -> torch.Tensor:
        """The frozen teacher rows on torch: the same array every step, so copied once."""
        if self._rows is None or self._rows[0] is not rows:
            self._rows = (rows, to_torch_batch({"teacher_rows": rows}, self.device)["teacher_rows"])
        return self._rows[1]

    def sync(self) -> None:
        if self.twin is None:
            return
        weights = [(k, mx.array(v.detach().float().cpu().numpy())) for k, v in self.twin.state_dict().items()]
        self.head.load_weights(weights, strict=True)
        mx.eval(self.head.parameters())

    def save_optimizer(self, folder: Path) -> None:
        self._ready()
        torch.save({"optimizer": self.opt.state_dict(), "updates": self.updates}, folder / "optimizer.pt")

    def load_optimizer(self, folder: Path) -> None:
        self._ready()
        state = torch.load(folder / "optimizer.pt", map_location=self.device)
        self.opt.load_state_dict(state["optimizer"])
        self.updates = state["updates"]
