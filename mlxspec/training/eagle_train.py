"""Training an eagle head on cached target features, aligned with how it drafts.

At inference the head's first draft reads a real target feature, and draft j reads the feature
the head itself predicted at draft j-1. Training unrolls the same K steps over every slot of a
sequence at once: step 1 reads the real features, step j the step-(j-1) predictions shifted by
one slot. Attention at step j sees what the drafting head would have in its cache: real slots up
to t-j+1, then its own step-i slot t-j+i for i = 2..j (``unroll_mask``).

The loss per step is the token loss (``kl``, or ``eal``/``wtv`` blended with KL early, over the
chain of K drafts that starts at each slot) plus a smooth-L1 regression of the predicted feature
onto the target's real next feature.

An EAGLE-3 head (``core/drafters/eagle3.py``) trains the same way on the states of the blocks it
taps (``FeatureSet.aux``), with the token loss alone: its output is not in the target's feature
space, so there is nothing to regress it onto (the EAGLE-3 recipe drops that term too).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np
from mlx.utils import tree_flatten, tree_unflatten

from mlxspec.core.drafters.eagle import EagleHead
from mlxspec.core.drafters.eagle3 import Eagle3Head
from mlxspec.errors import MlxspecError
from mlxspec.targets import store
from mlxspec.targets.eagle3 import SAFETENSORS, save_eagle3
from mlxspec.targets.folders import CARD_LICENCE, save_head
from mlxspec.training import losses as L
from mlxspec.training.corpus import build_corpus
from mlxspec.training.distill import choose_vocab
from mlxspec.training.features import FeatureSet, build, build_shards, set_meta
from mlxspec.training.train import batch_order, warmup_cosine
from mlxspec.training.written import written_examples

LOSSES = ("kl", "eal", "wtv")
CHECKPOINT = "checkpoint"


@dataclass(frozen=True)
class EagleTrainConfig:
    loss: str = "eal"
    k: int = 4  # unrolled draft steps, and the chain whose acceptance eal/wtv optimise
    temp: float = 1.0
    min_p: float = 0.0  # wtv: the teacher filtered as the chat samples (core.sampling.probs)
    fit_top: int = 0  # > 0: acceptance trained only where the teacher's token is in the head's top (losses.fits)
    steps: int = 300
    batch: int = 8
    context: int = 192  # slots per training window
    lr: float = 3e-4
    warmup: int = 20
    clip: float = 1.0  # global gradient-norm cap
    kl_anneal: float = 0.5
    feature_weight: float = 0.5
    seed: int = 0
    checkpoint_every: int = 100

    def validate(self) -> None:
        if self.loss not in LOSSES:
            raise MlxspecError(f"unknown loss {self.loss!r}; choose from {', '.join(LOSSES)}")
        if not 1 <= self.k <= 8:
            raise MlxspecError(f"the unrolled window K must be in 1..8, got {self.k}")
        if self.temp <= 0 or self.steps < 1 or self.batch < 1 or self.context < 8:
            raise MlxspecError("--temp must be > 0, --steps and --batch >= 1, the context >= 8")
        if not 0.0 <= self.min_p < 1.0 or (self.min_p and self.loss != "wtv"):
            raise MlxspecError(f"--min-p filters wtv's teacher and must be in [0, 1), got {self.min_p:g} with --loss {self.loss}")
        if self.fit_top < 0 or (self.fit_top and self.loss == "kl"):
            raise MlxspecError(f"--fit-top masks eal's or wtv's acceptance and must be >= 0, got {self.fit_top} with --loss {self.loss}")


@dataclass
class EagleStepLog:
    step: int
    loss: float
    kl: float
    feature: float
    accept_1: float  # mean acceptance of the first draft (eal: q(argmax p); wtv/kl: 1 - TV)
    chain: float  # expected accepted drafts of the K-step chain
    kl_weight: float
    positions_per_s: float
    seconds: float = 0.0  # the step's wall time; summed, a resumed run's card counts every invocation


def unroll_mask(length: int, step: int) -> mx.array:
    """(L, step*L) visibility for step ``step`` (1-based): real keys s <= t-step+1, then the
    step-i key at slot t-(step-i) for i = 2..step."""
    t = mx.arange(length)[:, None]
    s = mx.arange(length)[None, :]
    blocks = [s <= t - (step - 1)] + [s == t - (step - i) for i in range(2, step + 1)]
    return mx.concatenate(blocks, axis=1)


class _StepKeys:
    """A stand-in cache for one unrolled step: the keys of earlier steps come first, this
    step's are appended and kept for the next step."""

    def __init__(self, keys: mx.array | None, values: mx.array | None):
        self.keys, self.values = keys, values

    def update_and_fetch(self, k: mx.array, v: mx.array) -> tuple[mx.array, mx.array]:
        if self.keys is not None:
            k, v = mx.concatenate([self.keys, k], axis=2), mx.concatenate([self.values, v], axis=2)
        self.keys, self.values = k, v
        return k, v


def unroll(head: EagleHead, features: mx.array, tokens: mx.array, k: int) -> list[mx.array]:
    """The predicted features of each of ``k`` steps over all slots."""
    _, length, _ = features.shape
    positions = mx.arange(length)
    keys = _StepKeys(None, None)
    outs, inp = [], features
    for step in range(1, k + 1):
        pred = head.predict(inp, tokens, [keys], mask=unroll_mask(length, step), positions=positions)
        outs.append(pred)
        inp = mx.concatenate([mx.zeros_like(pred[:, :1]), pred[:, :-1]], axis=1)
    return outs


def chain_expected_length(accepts: list[mx.array]) -> mx.array:
    """E[u] = sum_k prod_{j<=k} A_j[u + j - 1]: the expected accepted drafts of the chain that
    starts at slot u, where A_j (B, L) is the acceptance of step j at each slot."""
    run = mx.ones_like(accepts[0])
    total = mx.zeros_like(run)
    for j, a in enumerate(accepts):
        shifted = a if j == 0 else mx.concatenate([a[:, j:], mx.zeros((a.shape[0], j), a.dtype)], axis=1)
        run = run * shifted
        total = total + run
    return total


def make_batch(data: FeatureSet, rows: np.ndarray, context: int, rng: np.random.Generator,
               col_of: np.ndarray) -> dict[str, mx.array]:
    """Windows of ``context`` slots from examples ``rows``: slot t pairs feature f_t with token
    x_{t+1}, and is trained on position t+1 (the target's next feature, its argmax as a head
    column, -1 outside the head) when the token it predicts, x_{t+2}, is a response token."""
    off = data.offsets
    inputs = data.features if data.aux is None else data.aux  # what the head reads: an EAGLE-3 head its taps
    B, D = len(rows), data.features.shape[1]
    feats = np.zeros((B, context, inputs.shape[1]), np.float16)
    nxt_feats = np.zeros((B, context, D), np.float16)
    tokens = np.zeros((B, context), np.int32)
    lse = np.zeros((B, context), np.float32)
    cols = np.full((B, context), -1, np.int32)
    mask = np.zeros((B, context), np.float32)
    for b, r in enumerate(rows):
        lo, n, rs = int(off[r]), int(data.lengths[r]), int(data.response_start[r])
        first = max(0, rs - 2)  # the first slot that predicts a response token
        start = int(rng.integers(max(0, first - context // 4), max(first, n - 1 - context) + 1))
        m = max(0, min(context, n - 1 - start))
        sl = slice(lo + start, lo + start + m)
        nx = slice(lo + start + 1, lo + start + 1 + m)
        feats[b, :m], tokens[b, :m] = inputs[sl], data.tokens[nx]
        nxt_feats[b, :m], lse[b, :m], cols[b, :m] = data.features[nx], data.lse[nx], col_of[data.argmax[nx]]
        slots = np.arange(start, start + m)
        mask[b, :m] = (slots + 2 >= rs) & (slots + 2 < n)
    return {"features": mx.array(feats), "tokens": mx.array(tokens), "next_features": mx.array(nxt_feats),
            "lse": mx.array(lse), "cols": mx.array(cols), "mask": mx.array(mask),
            "rows": mx.array(np.flatnonzero(mask.reshape(-1)).astype(np.int32))}


def objectives(head: EagleHead, batch: dict[str, mx.array], cfg: EagleTrainConfig, lam: float):
    """(loss, kl, feature loss, first-draft acceptance, chain length) for one batch.

    Only the trained slots (``batch["rows"]``, flat indices) are scored: the head and the
    losses over its vocabulary are most of a step's cost, and about half the slots of a window
    are prompt. KL is computed for every step only while it is part of the loss; after the
    anneal, just the first step's, for the log."""
    B, length = batch["mask"].shape
    rows = batch["rows"]
    flat = lambda x: x.reshape(B * length, *x.shape[2:])[rows][None]  # noqa: E731  (1, M, ...)
    target = flat(batch["next_features"].astype(mx.float32))
    # The teacher over the head's columns, from the stored feature and the target's own rows.
    teacher = mx.stop_gradient(target @ batch["teacher_rows"].T - flat(batch["lse"])[..., None])
    cols = flat(batch["cols"])
    kls, feat_losses, accepts = [], [], []
    regress = not isinstance(head, Eagle3Head)  # an EAGLE-3 head's output is in its own space
    for j, pred in enumerate(unroll(head, batch["features"].astype(mx.float32), batch["tokens"], cfg.k)):
        mask = flat(batch["mask"] * (mx.arange(length) >= j)[None, :])
        p, z = flat(pred), head.logits(flat(pred))
        if cfg.loss == "kl" or lam > 0:
            kls.append(L.kl_loss(teacher, z, cfg.temp, mask))
        elif j == 0:
            kls.append(mx.stop_gradient(L.kl_loss(teacher, z, cfg.temp, mask)))
        if regress:
            huber = nn.losses.smooth_l1_loss(p, target, reduction="none").mean(axis=-1)
            feat_losses.append((huber * mask).sum() / mx.maximum(mask.sum(), 1.0))
        else:
            feat_losses.append(mx.zeros(()))
        a = L.eal_acceptance(z, cols, mask) if cfg.loss == "eal" else L.wtv_acceptance(teacher, z, cfg.temp, mask, cfg.min_p)
        if cfg.fit_top:
            a = L.where_fit(a, L.fits(z, cols, cfg.fit_top))
        accepts.append(mx.zeros((B * length,), a.dtype).at[rows].add(a[0]).reshape(B, length))
    kl, feat = sum(kls) / len(kls), sum(feat_losses) / cfg.k
    count = mx.maximum(batch["mask"].sum(), 1.0)
    chain = (chain_expected_length(accepts) * batch["mask"]).sum() / count
    first = (accepts[0] * batch["mask"]).sum() / count
    token = kl if cfg.loss == "kl" else L.blended_loss(kl, -chain / cfg.k, lam)
    return token + cfg.feature_weight * feat, kl, feat, first, chain


class MlxStepper:
    """Optimiser steps of the head on MLX. A stepper owns the optimiser; ``train_head`` owns the
    loop, the batches, the log and the checkpoints (``torch_train.py`` has the torch
    twin: the same objectives, ~2.5x the positions per second on this CPU)."""

    name = "mlx"

    def __init__(self, head: EagleHead, cfg: EagleTrainConfig):
        self.head, self.cfg = head, cfg
        self.opt = optim.AdamW(learning_rate=warmup_cosine(cfg.lr, cfg.warmup, cfg.steps), weight_decay=0.0)
        self._loss_and_grad = nn.value_and_grad(head, lambda b, lam: objectives(head, b, cfg, lam))

    def step(self, batch: dict[str, mx.array], lam: float) -> tuple[float, float, float, float, float]:
        """One update; (loss, kl, feature loss, first-draft acceptance, chain length)."""
        (loss, kl, feat, first, chain), grads = self._loss_and_grad(batch, lam)
        # The residual branches start at zero and the feature targets are large: without a cap
        # one early step can throw the block far off (seen at lr 1e-3: loss 11 -> 465).
        grads, _ = optim.clip_grad_norm(grads, self.cfg.clip)
        self.opt.update(self.head, grads)
        mx.eval(self.head.parameters(), self.opt.state, loss, kl, feat, first, chain)
        return loss.item(), kl.item(), feat.item(), first.item(), chain.item()

    def sync(self) -> None:
        """Bring the head's MLX weights up to date (here they are the trained ones)."""

    def save_optimizer(self, folder: Path) -> None:
        state = {k: v for k, v in tree_flatten(self.opt.state) if isinstance(v, mx.array)}
        mx.save_safetensors(str(folder / "optimizer.safetensors"), state)

    def load_optimizer(self, folder: Path) -> None:
        self.opt.state = tree_unflatten(list(mx.load(str(folder / "optimizer.safetensors")).items()))


def _save_checkpoint(out: Path, head: EagleHead, stepper, step: int, cfg: EagleTrainConfig,
                     history: list[EagleStepLog]) -> None:
    ck = out / CHECKPOINT
    stepper.sync()
    if isinstance(head, Eagle3Head):
        save_eagle3(head, ck, dtype="float32")
    else:
        save_head(head, ck, dtype="float32")
    stepper.save_optimizer(ck)
    (ck / "state.json").write_text(json.dumps({"step": step, "train": asdict(cfg), "backend": stepper.name,
                                               "history": [asdict(h) for h in history]}))


def _resume(out: Path, head: EagleHead, cfg: EagleTrainConfig, backend: str) -> tuple[int, list[EagleStepLog]]:
    ck = out / CHECKPOINT
    try:
        state = json.loads((ck / "state.json").read_text())
    except (OSError, ValueError):
        raise MlxspecError(f"--resume: no readable checkpoint in {out}") from None
    diff = [k for k, v in asdict(cfg).items() if k != "checkpoint_every" and state["train"].get(k) != v]
    if diff:
        raise MlxspecError(f"--resume: the checkpoint was trained with other settings ({', '.join(diff)})")
    if state.get("backend", "mlx") != backend:
        raise MlxspecError(f"--resume: the checkpoint was trained on {state.get('backend', 'mlx')}, "
                           f"not {backend} (its optimiser state is that backend's)")
    w = mx.load(str(ck / (SAFETENSORS if isinstance(head, Eagle3Head) else "head.safetensors")))
    for derived in ("vocab_ids", "d2t", "t2d"):  # the vocabulary, which the fresh head already has
        w.pop(derived, None)
    head.load_weights(list(w.items()), strict=True)
    return state["step"], [EagleStepLog(**h) for h in state["history"]]


def step_batches(data: FeatureSet, head: EagleHead, teacher_rows: mx.array,
                 cfg: EagleTrainConfig) -> Callable[[int], dict[str, mx.array]]:
    """The training batch of each step, a function of the step alone (so a resumed run sees
    the batches the whole run would have)."""
    order = batch_order(len(data.lengths), cfg.steps, cfg.batch, cfg.seed)
    col_of = np.full(int(max(data.argmax.max(), int(head.vocab_ids.max()))) + 1, -1, np.int32)
    col_of[np.array(head.vocab_ids)] = np.arange(head.vocab_ids.shape[0], dtype=np.int32)

    def batch(step: int) -> dict[str, mx.array]:
        b = make_batch(data, order[step], cfg.context, np.random.default_rng([cfg.seed, step]), col_of)
        b["teacher_rows"] = teacher_rows
        return b

    return batch


def train_head(head: EagleHead, data: FeatureSet, teacher_rows: mx.array, cfg: EagleTrainConfig, out: Path,
               resume: bool = False, on_step: Callable[[EagleStepLog], None] | None = None,
               stepper: Any = None) -> list[EagleStepLog]:
    """Train ``head`` in place on ``data``; ``teacher_rows`` are the target's head rows for the
    head's vocabulary (frozen). Checkpoints to ``out``; ``resume`` continues exactly. The steps
    run on ``stepper`` (default ``MlxStepper(head, cfg)``; ``torch_train.TorchStepper``
    runs them on torch)."""
    cfg.validate()
    mx.random.seed(cfg.seed)
    stepper = stepper or MlxStepper(head, cfg)
    start, history = _resume(out, head, cfg, stepper.name) if resume else (0, [])
    if resume:
        stepper.load_optimizer(out / CHECKPOINT)
    batch_of = step_batches(data, head, teacher_rows, cfg)
    for step in range(start, cfg.steps):
        t0 = time.perf_counter()
        batch = batch_of(step)
        lam = L.kl_weight(step, cfg.steps, anneal_frac=cfg.kl_anneal) if cfg.loss != "kl" else 1.0
        loss, kl, feat, first, chain = stepper.step(batch, lam)
        if not math.isfinite(loss):
            raise MlxspecError(f"loss is {loss} at step {step}: stopping (try a lower --lr)")
        took = time.perf_counter() - t0
        log = EagleStepLog(step + 1, loss, kl, feat, first, chain, lam, float(batch["mask"].sum().item()) / took, took)
        history.append(log)
        if (step + 1) % cfg.checkpoint_every == 0 or step + 1 == cfg.steps:
            _save_checkpoint(out, head, stepper, step + 1, cfg, history)
        if on_step:
            on_step(log)
    stepper.sync()
    return history


def corpus_examples(per_category: int, seed: int) -> tuple[list, dict[str, int]]:
    """The broad corpus (``corpus.py``), categories interleaved so any prefix is balanced."""
    examples, stats = build_corpus(store.data_dir(), per_category, seed=seed)
    pools: dict[str, list] = {}
    for e in examples:
        pools.setdefault(e.category, []).append(e)
    longest = max((len(p) for p in pools.values()), default=0)
    order = [pools[c][i] for i in range(longest) for c in sorted(pools) if i < len(pools[c])]
    return order, stats


def prepare_features(target, per_category: int, max_examples: int | None, seed: int, max_tokens: int,
                     target_written: int = 0, progress: Callable[[str, int, int], None] | None = None,
                     taps: tuple[int, ...] = ()) -> FeatureSet:
    """Teacher-forced target features over the corpus (the first ``max_examples`` of it, when
    given, categories still balanced) and over the target's own answers to the first
    ``target_written`` of its prompts (``written.py``; past the corpus's size, second answers to
    its first prompts, in the other regime), cached in ``$MLXSPEC_HOME/eagle-data``;
    with ``taps``, also the states entering those blocks (an EAGLE-3 head's input)."""
    if per_category < 1 or (max_examples is not None and max_examples < 1) or target_written < 0:
        raise MlxspecError("--examples-per-category and --max-examples must be >= 1, --target-written >= 0")
    examples, _ = corpus_examples(per_category, seed)
    if target_written > 2 * len(examples):
        raise MlxspecError(f"--target-written {target_written}: the corpus has {len(examples)} prompts "
                           f"at --examples-per-category {per_category}, each answered at most twice")
    cache = store.home() / "eagle-data"
    report = (lambda i, n: progress("features", i, n)) if progress else None
    if not target_written:
        return build(target, examples[:max_examples], cache, max_tokens=max_tokens, progress=report, taps=taps)
    t0 = time.perf_counter()
    corpus = examples[:max_examples]
    paths = build_shards(target, corpus, cache, max_tokens=max_tokens, progress=report, taps=taps)
    answers, done = [], 0
    second = examples[: max(0, target_written - len(examples))]  # answered again, in the other regime
    for flipped, part in ((False, examples[:target_written]), (True, second)):
        report = (lambda i, n, base=done: progress("target answers", base + i, target_written)) if progress else None
        answers += written_examples(target, part, cache / "written", max_new=max_tokens // 2, seed=seed,
                                    max_prompt=max_tokens // 2, progress=report, flipped=flipped) if part else []
        done += len(part)
    # Built as a set of its own, so its shards do not depend on how many corpus examples precede it;
    # the two are read into one set at once (``FeatureSet.gather``: no second copy of either).
    report = (lambda i, n: progress("features of the target's answers", i, n)) if progress else None
    paths += build_shards(target, answers, cache, max_tokens=max_tokens, progress=report, taps=taps)
    meta = {**set_meta(target, corpus, max_tokens, taps), "target_written": target_written,
            "written_key": set_meta(target, answers, max_tokens, taps)["key"]}
    both = FeatureSet.gather(paths, meta)
    both.meta["load_or_build_s"] = round(time.perf_counter() - t0, 1)
    both.meta["tokens_per_category"] = both.tokens_per_category()
    return both


def head_vocabulary(data: FeatureSet, size: int, target) -> mx.array:
    """The ``size`` tokens the target most often emits in the data (its argmax at response
    positions, plus the response tokens themselves); end-of-turn tokens always included."""
    resp = np.concatenate([np.arange(o + s, o + n) for o, s, n in
                           zip(data.offsets[:-1], data.response_start, data.lengths)])
    seqs = [data.argmax[resp], data.tokens[resp]]
    return mx.array(choose_vocab(seqs, size, target.config.vocab_size, list(target.tokenizer.eos_token_ids)))


def time_spent(history: list[EagleStepLog], seconds: float) -> str:
    """A card's time line: the steps' time over every resumed invocation, and the last
    invocation's whole time (its data stages too)."""
    return (f"{sum(h.seconds for h in history) / 60:.1f} min of training steps in all, "
            f"{seconds / 60:.1f} min for the last run with its data")


def model_card(name: str, recipe: str, data: FeatureSet, cfg: EagleTrainConfig, head: EagleHead,
               history: list[EagleStepLog], seconds: float) -> str:
    params = sum(v.size for _, v in tree_flatten(head.parameters()))
    last = history[-min(len(history), 20):]
    mean = lambda a: sum(getattr(h, a) for h in last) / max(len(last), 1)  # noqa: E731
    cats = "\n".join(f"| {c} | {n:,} |" for c, n in data.tokens_per_category().items())
    return f"""# {name}

An eagle-style draft head for `{data.meta.get('target', '?')}`: an input projection of [target
feature; next-token embedding], one llama block, and a head over the {head.cfg.head_vocab} tokens the
target emits most in the training data (q = 0 elsewhere, so verification stays exact).
{params / 1e6:.1f}M parameters of its own; the target's embedding table is shared at load time.

Reproduce: `{recipe}`

Training: loss `{cfg.loss}` over {cfg.k} unrolled draft steps (the head reads its own predicted
features from step 2 on, as when drafting), feature regression weight {cfg.feature_weight},
{cfg.steps} steps of {cfg.batch} x {cfg.context} slots, {time_spent(history, seconds)}.
Last {len(last)} steps: first-draft acceptance {mean('accept_1'):.2f}, expected accepted drafts
of the {cfg.k}-chain {mean('chain'):.2f} (teacher-forced, training batches).

Data: {len(data.lengths):,} examples, {data.trained_positions():,} response positions, teacher-forced
through the target (features, log-normaliser and argmax cached). Response tokens per category:

| category | tokens |
|---|---|
{cats}

Speed and acceptance measured with the real engine: `BENCHMARKS.md`.

{CARD_LICENCE}
"""
