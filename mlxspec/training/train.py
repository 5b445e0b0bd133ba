"""Draft training: a ``DraftModel`` fitted to the target's cached distributions with one of the
acceptance-aware objectives of ``losses.py``, then optionally a GRPO stage that rewards the
accepted length of sampled drafts as the target actually scores them.

Deterministic under a seed (batch order, initialisation, GRPO sampling); checkpoints hold the
weights, the optimiser state and the step, so ``--resume`` continues the same run.
"""

from __future__ import annotations

import json
import math
import resource
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np
from mlx.utils import tree_flatten, tree_unflatten
from mlx_lm.models.cache import KVCache

from mlxspec.core.drafters.draft_model import DraftModel
from mlxspec.errors import MlxspecError
from mlxspec.runtime import backend_description
from mlxspec.targets.folders import CARD_LICENCE, read_draft_config, save_draft
from mlxspec.targets.store import data_dir, home
from mlxspec.training import losses as L
from mlxspec.training.distill import DistillSet, batch_arrays, build, training_prompts

LOSSES = ("kl", "eal", "wtv")
CHECKPOINT = "checkpoint"


@dataclass(frozen=True)
class TrainConfig:
    loss: str = "wtv"
    k: int = 5  # window: draft positions whose joint acceptance is optimised
    temp: float = 1.0  # temperature of p and q in kl and wtv
    steps: int = 400
    batch: int = 8
    lr: float = 3e-4
    warmup: int = 20
    kl_anneal: float = 0.5  # eal/wtv: share of training over which the KL weight falls 1 -> 0
    eal_sharpen: float = 1.0
    grpo_steps: int = 0
    grpo_group: int = 8  # G drafts per context
    grpo_contexts: int = 4
    grpo_clip: float = 0.2
    grpo_kl: float = 0.02
    grpo_lr: float = 5e-5
    grpo_reward: str = "auto"  # greedy | sampling | auto (eal -> greedy, otherwise sampling)
    grpo_context_tokens: int = 160
    seed: int = 0
    checkpoint_every: int = 100

    def validate(self) -> None:
        if self.loss not in LOSSES:
            raise MlxspecError(f"unknown loss {self.loss!r}; choose from {', '.join(LOSSES)}")
        if self.k < 1:
            raise MlxspecError(f"the window K must be >= 1, got {self.k}")
        if self.temp <= 0:
            raise MlxspecError(f"the training temperature must be > 0, got {self.temp}")
        if self.steps < 1 or self.batch < 1 or self.grpo_steps < 0:
            raise MlxspecError("--steps and --batch must be >= 1, --grpo-steps >= 0")
        if self.grpo_steps and self.grpo_group < 2:
            raise MlxspecError("GRPO needs a group of at least 2 drafts per context")
        if self.grpo_reward not in ("auto", "greedy", "sampling"):
            raise MlxspecError(f"--grpo-reward must be greedy, sampling or auto, got {self.grpo_reward!r}")

    @property
    def reward(self) -> str:
        if self.grpo_reward != "auto":
            return self.grpo_reward
        return "greedy" if self.loss == "eal" else "sampling"


@dataclass
class StepLog:
    step: int
    stage: str  # "distill" | "grpo"
    loss: float
    kl: float
    eal: float  # expected accepted length under greedy verification (smoothed), per window
    wtv: float  # expected accepted length under sampling at temp, per window
    kl_weight: float
    tokens_per_s: float
    reward: float | None = None


def warmup_cosine(lr: float, warmup: int, steps: int) -> Callable[[mx.array], mx.array]:
    """Linear warm-up from 1% of ``lr``, then cosine decay to 10% of it."""
    warm = optim.linear_schedule(lr * 0.01, lr, max(warmup, 1))
    decay = optim.cosine_decay(lr, max(steps - warmup, 1), lr * 0.1)
    return optim.join_schedules([warm, decay], [max(warmup, 1)])


def lr_schedule(cfg: TrainConfig) -> Callable[[mx.array], mx.array]:
    return warmup_cosine(cfg.lr, cfg.warmup, cfg.steps)


def objectives(draft: DraftModel, batch: dict[str, mx.array], cfg: TrainConfig, lam: float):
    """The training loss for ``cfg.loss`` and the three objectives it is watched by."""
    z = draft.reduced_logits(batch["tokens"])
    mask = batch["mask"]
    kl = L.kl_loss(batch["teacher_logp"], z, cfg.temp, mask)
    eal = L.eal_loss(z, batch["target_cols"], cfg.k, mask, cfg.eal_sharpen)
    wtv = L.wtv_loss(batch["teacher_logp"], z, cfg.temp, cfg.k, mask)
    loss = {"kl": kl, "eal": L.blended_loss(kl, eal, lam), "wtv": L.blended_loss(kl, wtv, lam)}[cfg.loss]
    return loss, kl, eal, wtv


def _save_checkpoint(out: Path, draft: DraftModel, opt: optim.Optimizer, step: int, stage: str,
                     cfg: TrainConfig, history: list[StepLog], extra: dict[str, Any]) -> None:
    ck = out / CHECKPOINT
    save_draft(draft, ck, dtype="float32", extra=extra)
    state = dict(tree_flatten(opt.state))
    mx.save_safetensors(str(ck / "optimizer.safetensors"), {k: v for k, v in state.items() if isinstance(v, mx.array)})
    (ck / "state.json").write_text(json.dumps({"step": step, "stage": stage, "train": asdict(cfg),
                                               "history": [asdict(h) for h in history]}))


def _load_checkpoint(out: Path, draft: DraftModel, opt: optim.Optimizer, cfg: TrainConfig) -> tuple[int, str, list[StepLog]]:
    ck = out / CHECKPOINT
    if not (ck / "state.json").is_file():
        raise MlxspecError(f"--resume: no checkpoint in {out}")
    saved_cfg, _ = read_draft_config(ck)
    if saved_cfg != draft.cfg:
        diff = [f.name for f in fields(saved_cfg) if getattr(saved_cfg, f.name) != getattr(draft.cfg, f.name)]
        raise MlxspecError(f"--resume: the checkpoint in {out} is another architecture (differs in {', '.join(diff)})")
    state = json.loads((ck / "state.json").read_text())
    # Settings that have not acted yet may change: GRPO ones while still distilling (so a
    # finished distillation can be extended with a GRPO stage), and checkpoint spacing.
    free = {"checkpoint_every"} | ({f.name for f in fields(cfg) if f.name.startswith("grpo_")}
                                   if state["stage"] == "distill" else set())
    diff = [k for k, v in asdict(cfg).items() if k not in free and state["train"].get(k) != v]
    if diff:
        raise MlxspecError(f"--resume: the checkpoint was trained with other settings ({', '.join(diff)})")
    w = mx.load(str(ck / "draft.safetensors"))
    w.pop("vocab_ids")
    draft.load_weights(list(w.items()), strict=True)
    opt.state = tree_unflatten(list(mx.load(str(ck / "optimizer.safetensors")).items()))
    return state["step"], state["stage"], [StepLog(**h) for h in state["history"]]


def checkpoint_stage(out: Path) -> str:
    try:
        return json.loads((out / CHECKPOINT / "state.json").read_text())["stage"]
    except (OSError, ValueError, KeyError):
        raise MlxspecError(f"--resume: no readable checkpoint in {out}") from None


def _check_finite(value: float, step: int, stage: str) -> None:
    if not math.isfinite(value):
        raise MlxspecError(f"loss is {value} at {stage} step {step}: stopping (try a lower --lr)")


def batch_order(n: int, steps: int, batch: int, seed: int) -> np.ndarray:
    """Sequence indices for every step: epochs of a seeded permutation, so a resumed run
    draws exactly the batches the uninterrupted run would have."""
    rng = np.random.default_rng(seed)
    need = steps * batch
    order = np.concatenate([rng.permutation(n) for _ in range(need // n + 1)])
    return order[:need].reshape(steps, batch)


class _Prefix:
    """A frozen KV prefix that drafted tokens attend to: ``update_and_fetch`` concatenates
    without writing, so gradients flow through the new tokens only."""

    def __init__(self, keys: mx.array, values: mx.array):
        self.keys, self.values, self.offset = keys, values, keys.shape[2]

    def update_and_fetch(self, k: mx.array, v: mx.array) -> tuple[mx.array, mx.array]:
        return mx.concatenate([self.keys, k], axis=2), mx.concatenate([self.values, v], axis=2)


def _prefix_cache(model, context: list[int], group: int, forward) -> list[_Prefix]:
    cache = model.make_cache()
    forward(mx.array([context]), cache)
    out = []
    for c in cache:
        k, v = c.keys[..., : c.offset, :], c.values[..., : c.offset, :]
        out.append(_Prefix(mx.repeat(k, group, axis=0), mx.repeat(v, group, axis=0)))
    mx.eval([(p.keys, p.values) for p in out])
    return out


def grpo_samples(draft: DraftModel, target, data: DistillSet, cfg: TrainConfig, rng: np.random.Generator,
                 key: mx.array) -> list[dict[str, Any]]:
    """For a few random contexts: G drafts of K tokens sampled from the draft at T=1, scored by
    one batched target pass; rewards are the accepted lengths verification would give."""
    G, K = cfg.grpo_group, cfg.k
    out = []
    for _ in range(cfg.grpo_contexts):
        s = int(rng.integers(len(data.tokens)))
        seq, p = data.tokens[s], int(data.prompt_lens[s])
        t = int(rng.integers(p, len(seq) + 1))
        context = seq[max(0, t - cfg.grpo_context_tokens) : t].tolist()
        d_prefix = _prefix_cache(draft, context[:-1], G, lambda x, c: draft.reduced_logits(x, c))
        t_prefix = _prefix_cache(target.model, context[:-1], G, lambda x, c: target.model(x, c))
        # Draft K tokens autoregressively for all G rows; the prefix stays frozen.
        tokens = mx.full((G, 1), context[-1], dtype=mx.int32)
        cache = [KVCache() for _ in draft.layers]
        for c, pre in zip(cache, d_prefix):
            c.update_and_fetch(pre.keys, pre.values)
        drafted, logq = [], []
        x = tokens
        for key_i in mx.random.split(key, K + 1)[1:]:
            z = draft.reduced_logits(x, cache)[:, -1]
            lq = z - mx.logsumexp(z, axis=-1, keepdims=True)
            col = mx.random.categorical(lq, key=key_i)
            drafted.append(col)
            logq.append(mx.take_along_axis(lq, col[:, None], axis=-1)[:, 0])
            x = draft.vocab_ids[col][:, None]
        cols = mx.stack(drafted, axis=1)  # (G, K) head columns
        ids = draft.vocab_ids[cols]  # (G, K) token ids
        inputs = mx.concatenate([tokens, ids[:, :-1]], axis=1)
        zt = target.model(inputs, t_prefix)
        logp_all = zt - mx.logsumexp(zt, axis=-1, keepdims=True)
        logp_tok = mx.take_along_axis(logp_all, ids[..., None], axis=-1)[..., 0]
        argmax = mx.argmax(zt, axis=-1)
        logq_tok = mx.stack(logq, axis=1)
        if cfg.reward == "greedy":
            reward = L.simulated_accept_length_greedy(ids, argmax)
            matches = (ids == argmax).astype(mx.float32)
            alive = mx.cumprod(matches, axis=1)
        else:
            reward = L.simulated_accept_length_sampling(mx.exp(logp_tok), mx.exp(logq_tok))
            ratio = mx.minimum(mx.exp(logp_tok - logq_tok), 1.0)
            alive = mx.cumprod(ratio, axis=1) > 0.5  # positions a typical verification reaches
            alive = alive.astype(mx.float32)
        # Positions up to and including the first rejection carry the credit.
        valid = mx.concatenate([mx.ones((G, 1)), alive[:, :-1]], axis=1)
        mx.eval(cols, logq_tok, reward, valid)
        out.append({"inputs": inputs, "cols": cols, "old_logq": logq_tok,
                    "advantages": L.group_advantages(reward), "valid": valid, "reward": reward,
                    "prefix": d_prefix})
    return out


def train(draft: DraftModel, data: DistillSet, cfg: TrainConfig, out: Path, target=None, resume: bool = False,
          progress: Callable[[StepLog, int], None] | None = None, extra: dict[str, Any] | None = None) -> list[StepLog]:
    """Distillation for ``cfg.steps`` steps, then ``cfg.grpo_steps`` GRPO steps (needs the
    target). Returns the per-step log; the final draft is in ``out``."""
    cfg.validate()
    data.check()
    if cfg.grpo_steps and target is None:
        raise MlxspecError("the GRPO stage needs the target model")
    mx.random.seed(cfg.seed)
    order = batch_order(len(data.tokens), cfg.steps, min(cfg.batch, len(data.tokens)), cfg.seed)
    history: list[StepLog] = []
    start, stage = 0, "distill"
    if resume:
        stage = checkpoint_stage(out)
    opt = optim.AdamW(learning_rate=lr_schedule(cfg) if stage == "distill" else cfg.grpo_lr, weight_decay=0.0)
    if resume:
        start, stage, history = _load_checkpoint(out, draft, opt, cfg)
    total = cfg.steps + cfg.grpo_steps

    def distill_step(batch, lam):
        return objectives(draft, batch, cfg, lam)

    loss_and_grad = nn.value_and_grad(draft, lambda b, lam: distill_step(b, lam))
    step = start
    while step < cfg.steps:
        t0 = time.perf_counter()
        batch = batch_arrays(data, order[step])
        lam = L.kl_weight(step, cfg.steps, anneal_frac=cfg.kl_anneal) if cfg.loss != "kl" else 1.0
        (loss, kl, eal, wtv), grads = loss_and_grad(batch, lam)
        opt.update(draft, grads)
        mx.eval(draft.parameters(), opt.state, loss, kl, eal, wtv)
        _check_finite(loss.item(), step + 1, "distill")
        n_tok = batch["tokens"].size
        history.append(StepLog(step + 1, "distill", loss.item(), kl.item(), -eal.item() * cfg.k,
                               -wtv.item() * cfg.k, lam, n_tok / (time.perf_counter() - t0)))
        step += 1
        if progress:
            progress(history[-1], total)
        if step % cfg.checkpoint_every == 0 or step == cfg.steps:
            _save_checkpoint(out, draft, opt, step, "distill", cfg, history, extra or {})

    if cfg.grpo_steps:
        history += _grpo(draft, data, cfg, out, target, opt if stage == "grpo" else None, step, history,
                         progress, total, extra or {})
    save_draft(draft, out, dtype="float16", extra=extra)
    return history


def _grpo(draft, data, cfg, out, target, opt, step, history, progress, total, extra) -> list[StepLog]:
    ref = DraftModel(draft.cfg, draft.vocab_ids, draft.embed)
    ref.load_weights(list(tree_flatten(draft.parameters())))
    ref.freeze()
    mx.eval(ref.parameters())
    if opt is None:
        opt = optim.AdamW(learning_rate=cfg.grpo_lr, weight_decay=0.0)
    order = batch_order(len(data.tokens), cfg.grpo_steps, min(cfg.batch, len(data.tokens)), cfg.seed + 1)
    done_grpo = step - cfg.steps

    def policy_loss(samples, batch):
        terms = []
        for smp in samples:
            z = draft.reduced_logits(smp["inputs"], smp["prefix"])
            lq = z - mx.logsumexp(z, axis=-1, keepdims=True)
            new = mx.take_along_axis(lq, smp["cols"][..., None], axis=-1)[..., 0]
            zr = ref.reduced_logits(smp["inputs"], smp["prefix"])
            lr = zr - mx.logsumexp(zr, axis=-1, keepdims=True)
            ref_kl = (mx.exp(lq) * (lq - mx.stop_gradient(lr))).sum(-1).mean()
            terms.append(L.grpo_loss(new, smp["old_logq"], smp["advantages"], smp["valid"], ref_kl,
                                     cfg.grpo_clip, cfg.grpo_kl))
        pg = mx.mean(mx.stack(terms))
        base, kl, eal, wtv = objectives(draft, batch, cfg, 0.0)
        return pg + base, kl, eal, wtv

    loss_and_grad = nn.value_and_grad(draft, policy_loss)
    logs = []
    for i in range(done_grpo, cfg.grpo_steps):
        t0 = time.perf_counter()
        # Randomness per step from (seed, step): a resumed run draws the same contexts and drafts.
        rng = np.random.default_rng([cfg.seed, i])
        samples = grpo_samples(draft, target, data, cfg, rng, mx.random.key(cfg.seed * 1_000_003 + i))
        batch = batch_arrays(data, order[i])
        (loss, kl, eal, wtv), grads = loss_and_grad(samples, batch)
        opt.update(draft, grads)
        mx.eval(draft.parameters(), opt.state, loss, kl, eal, wtv)
        _check_finite(loss.item(), i + 1, "grpo")
        reward = float(np.mean([np.array(s["reward"]).mean() for s in samples]))
        n_tok = batch["tokens"].size + sum(s["inputs"].size for s in samples)
        logs.append(StepLog(cfg.steps + i + 1, "grpo", loss.item(), kl.item(), -eal.item() * cfg.k,
                            -wtv.item() * cfg.k, 0.0, n_tok / (time.perf_counter() - t0), reward))
        if progress:
            progress(logs[-1], total)
        if (i + 1) % cfg.checkpoint_every == 0:
            _save_checkpoint(out, draft, opt, cfg.steps + i + 1, "grpo", cfg, history + logs, extra)
    return logs


def trend(history: list[StepLog], attr: str, stage: str = "distill", frac: float = 0.2) -> tuple[float, float]:
    """Mean of ``attr`` over the first and the last ``frac`` of a stage's steps."""
    xs = [getattr(h, attr) for h in history if h.stage == stage]
    n = max(1, int(len(xs) * frac))
    return float(np.mean(xs[:n])), float(np.mean(xs[-n:]))


def default_data_path(target_name: str, prompts: int, max_new: int, head_vocab: int, seed: int) -> Path:
    return home() / "distill" / f"{target_name}-p{prompts}-n{max_new}-v{head_vocab}-s{seed}.npz"


def prepare_data(target, path: Path | None, prompts: int, max_new: int, head_vocab: int, seed: int,
                 progress: Callable[[str, int, int], None] | None = None) -> tuple[DistillSet, Path]:
    """Load the distillation set at ``path``, or build it there (generation + teacher pass)."""
    if prompts < 1 or max_new < 1:
        raise MlxspecError("--prompts and --max-new-tokens must be >= 1")
    path = path or default_data_path(target.name, prompts, max_new, head_vocab, seed)
    if path.is_file():
        data = DistillSet.load(path)
    else:
        items, dropped = training_prompts(data_dir(), prompts, seed)
        data = build(target, items, max_new, head_vocab, seed, progress=progress)
        data.meta["benchmark_prompts_removed"] = dropped
        data.save(path)
    data.check()
    if data.meta.get("target") != target.name:
        raise MlxspecError(f"{path} was distilled from {data.meta.get('target')!r}, not {target.name!r}")
    return data, path


def peak_memory_gb() -> float:
    """Peak resident memory of this process (what the 8 GB budget is about)."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / (1 << 30) if sys.platform == "darwin" else rss / (1 << 20)


def model_card(name: str, command: str, data: DistillSet, cfg: TrainConfig, draft: DraftModel,
               history: list[StepLog], seconds: float, peak_gb: float) -> str:
    k0, k1 = trend(history, "kl")
    e0, e1 = trend(history, "eal")
    w0, w1 = trend(history, "wtv")
    m = data.meta
    loss = cfg.loss + ("+grpo" if cfg.grpo_steps else "")
    grpo = f", then {cfg.grpo_steps} GRPO steps (G={cfg.grpo_group}, reward {cfg.reward})" if cfg.grpo_steps else ""
    return f"""# {name}

A draft model for `{m.get('target')}` trained by mlxspec with the `{loss}` objective.

- Architecture: {draft.cfg.num_layers} llama block(s), hidden {draft.cfg.hidden_size}, head over the
  {draft.cfg.head_vocab} most frequent tokens of the training data (q = 0 elsewhere), embeddings
  shared with the target at load time; {draft.num_params() / 1e6:.1f}M parameters of its own.
- Recipe: `{command}`
- Data: {m.get('prompts')} prompts ({', '.join(f'{k} {v}' for k, v in m.get('sources', {}).items())}), Spec-Bench
  questions removed by text match; {m.get('generated_tokens')} target-generated tokens
  ({m.get('max_new_tokens')} per prompt, {m.get('greedy_share', 0.5):.0%} greedy, the rest sampled at T=1);
  the head vocabulary holds {m.get('head_mass', float('nan')):.1%} of the target's probability mass there.
- Training: {cfg.steps} steps of {cfg.batch} sequences, lr {cfg.lr}, window K={cfg.k}, T={cfg.temp}{grpo};
  {seconds / 60:.1f} min on {_machine()}, peak memory {peak_gb:.1f} GB. Building the data set took
  {(m.get('generate_s', 0) + m.get('teacher_s', 0)) / 60:.1f} min more (once; cached and shared by every run).
- Objectives (first -> last 20% of distillation steps): KL {k0:.3f} -> {k1:.3f}; expected accepted
  length per {cfg.k}-window, greedy {e0:.3f} -> {e1:.3f}, sampling {w0:.3f} -> {w1:.3f}.

{CARD_LICENCE}
"""


def _machine() -> str:
    return backend_description()
