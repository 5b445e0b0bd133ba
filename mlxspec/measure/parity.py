"""Cross-backend parity: ``mlxspec parity`` runs the MLX and the PyTorch backends on the same
held-out prompts (Spec-Bench, which draft training never sees) and says how far apart they are.

Both backends hold the same weights: the torch model is copied from the MLX model the loader
read in float32 (``LoadedModel.source``), which is the reference every difference is taken
against. Four steps, each a function returning records:

* ``layer_diffs``: one causal pass over each prompt, layer by layer, on both backends (the
  embedding, every block's output, the final norm, the head's logits), and the engine's own
  forward with a fresh KV cache ("logits (cached pass)"). The difference is **relative per
  row**: for an output a (MLX) and b (torch) of shape (positions, width),
  ``rel[r, j] = |a[r, j] - b[r, j]| / max_j' |a[r, j']|``: each position's error over the
  largest magnitude at that position (the largest logit, for the head). Reported: the max and
  the mean of rel over every element of every prompt, and the max absolute difference. Goal:
  max rel of the logits (head and cached pass) <= ``TOLERANCE[dtype]`` (1e-4 in float32).
* ``greedy_agreement``: greedy decoding, target-only and with each drafter at each K, on both
  backends; the token lists must be identical. At the first divergence both backends run the
  common prefix in one fresh pass; the two tokens' logits on each side are reported, and the
  divergence is a *near-tie* when the MLX logits of the two tokens are closer than the
  tolerance allows each to move (``2 * tolerance * max |logit|``), else a mismatch. Goal: no
  mismatch (near-ties are reported, not failed, as ``mlxspec verify`` does).
* ``decision_agreement``: the speculative-sampling decision given the same uniforms, for one
  verify step per prompt from the two backends' own logits of the same sequence: q is a
  stand-in drafter, the target's own distribution at T = ``DECISION_Q_TEMP`` (close to p but
  not equal, so the keep probabilities min(1, p/q) spread over (0, 1]; the self:L drafters'
  real q is rejected almost always on the default model); K drafts (K = the largest asked)
  are sampled from it one after another (MLX, seeded); p is the target at T=1 over the K+1
  verify rows, each backend from its own pass. ``DECISION_DRAWS`` uniform vectors (numpy,
  seeded) go through both backends' ``rejection_decide``: n_accepted must agree, except where
  a uniform falls between the two backends' keep probabilities min(1, p/q) (an *explained*
  disagreement, which the logit difference allows); for agreeing draws the residual rows' max
  absolute difference is reported. Goal: no unexplained disagreement.
* ``speed``: target-only greedy decoding of the first prompt on each backend, one warm-up run
  then the median decode tokens/s of ``SPEED_REPEATS`` runs (the order alternates), side by
  side with the ratio torch / MLX. Reported, not a goal.

``run_parity`` runs them all and returns a ``ParityResult``; ``to_json()`` is its JSON and
``print_parity`` renders it as tables.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Any

import mlx.core as mx
import numpy as np

from mlxspec.errors import MlxspecError
from mlxspec.measure.runs import (
    SCHEMA,
    WARMUP_TOKENS,
    RunHeader,
    encode_prompts,
    engine_run,
    first_mismatch,
    fmt,
    prepared_prompts,
    progress_ticker,
    run_header,
    spec_bench_prompts,
)
from mlxspec.measure.verdict import Kind, markup

# Max relative logit difference allowed, by the torch model's dtype (the MLX reference is
# float32). The issue's goal is float32's; half precision rounds every weight and activation
# to 3 (float16) or 2 (bfloat16) decimal digits, so its bound is that precision's, looser.
TOLERANCE = {"float32": 1e-4, "float16": 1e-2, "bfloat16": 5e-2}
RELATIVE = "|mlx - torch| / max |mlx| over the row (one position's outputs), MLX float32 the reference"
DEFAULT_KS = tuple(range(1, 9))
DEFAULT_PROMPTS = 6  # one per Spec-Bench category
DEFAULT_MAX_TOKENS = 32
DECISION_Q_TEMP = 1.25  # q of the decision check: the target's own distribution at this temperature
DECISION_DRAWS = 200
SPEED_REPEATS = 3
SELF_LAYERS = 8
# --quick: CI-sized (two prompts, fewer Ks and draws).
QUICK = {"prompts": 2, "ks": (1, 4, 8), "max_tokens": 16, "draws": 50, "repeats": 2}

Progress = Callable[[int, int, str], Any] | None


# ----------------------------------------------------------------------------- records


@dataclass(frozen=True)
class Diff:
    """One output compared over all prompts (``RELATIVE``)."""

    name: str
    max_rel: float
    mean_rel: float
    max_abs: float
    elements: int


@dataclass(frozen=True)
class Divergence:
    """Where one prompt's two greedy outputs first differ, and the two tokens' logits there
    (each backend's one fresh pass over the common prefix)."""

    prompt: Any
    at: int
    mlx_token: int | None
    torch_token: int | None
    mlx_text: str
    torch_text: str
    mlx_logits: tuple[float, float] | None  # MLX's logits of (mlx_token, torch_token)
    torch_logits: tuple[float, float] | None  # torch's logits of the same two tokens
    allowed_gap: float | None  # 2 * tolerance * max |MLX logit|
    near_tie: bool
    reason: str = ""


@dataclass(frozen=True)
class GreedyRow:
    """One method (target-only, or a drafter at one K) over every prompt."""

    draft: str
    k: int | None  # None: target-only
    prompts: int
    identical: int
    near_ties: int
    mismatches: int
    tokens_compared: int
    tokens_agreeing: int
    same_steps: int  # prompts whose per-step accepted counts agree too
    tau_mlx: float | None  # mean accepted drafts per step
    tau_torch: float | None
    divergences: list[Divergence]

    @property
    def label(self) -> str:
        return "target-only" if self.k is None else f"{self.draft} K={self.k}"


@dataclass(frozen=True)
class DecisionRow:
    """One prompt's decisions under ``draws`` shared uniform vectors."""

    prompt: Any
    k: int
    draws: int
    agree: int
    explained: int  # disagreements where a uniform lies between the two acceptance ratios
    unexplained: int
    mean_accepted: float  # MLX's n_accepted, averaged over the draws
    residual_max_abs: float  # over draws that agree
    keep_max_abs: float  # |min(1, p/q) MLX - torch| at the draft tokens, max over positions


@dataclass(frozen=True)
class BackendSpeed:
    backend: str
    decode_tps_median: float
    decode_tps_min: float
    decode_tps_max: float
    tps_median: float  # end to end, prefill included
    tokens_per_run: int
    runs: int


@dataclass(frozen=True)
class Speed:
    prompt: Any
    prompt_tokens: int
    max_tokens: int
    warmup: int
    mlx: BackendSpeed
    torch: BackendSpeed

    @property
    def ratio(self) -> float | None:
        """torch / MLX median decode tokens/s."""
        return self.torch.decode_tps_median / self.mlx.decode_tps_median if self.mlx.decode_tps_median else None


@dataclass(frozen=True)
class TorchInfo:
    version: str
    device: str
    dtype: str
    threads: int


@dataclass(frozen=True)
class Settings:
    prompts: list[dict[str, Any]]
    drafters: list[str]
    ks: list[int]
    max_tokens: int
    decision_draws: int
    decision_q_temp: float
    speed_repeats: int
    seed: int
    note: str | None


@dataclass(frozen=True)
class Goals:
    """The issue's goals: logits within ``tolerance``, no greedy mismatch, no unexplained
    decision disagreement."""

    tolerance: float
    logits_max_rel: float
    logits: bool
    greedy: bool
    decisions: bool

    def missed(self) -> list[str]:
        out = []
        if not self.logits:
            out.append(f"logits: max relative difference {self.logits_max_rel:.2e} > {self.tolerance:g}")
        if not self.greedy:
            out.append("greedy: outputs differ beyond a near-tie")
        if not self.decisions:
            out.append("decisions: n_accepted differs for the same uniforms beyond the logits' difference")
        return out

    @property
    def passed(self) -> bool:
        return self.logits and self.greedy and self.decisions


@dataclass(frozen=True)
class ParityResult:
    header: RunHeader  # of the MLX reference
    torch: TorchInfo
    settings: Settings
    layers: list[Diff]  # embed, layer 0..N-1, norm, head, logits (cached pass)
    greedy: list[GreedyRow]
    decisions: list[DecisionRow]
    speed: Speed | None
    goals: Goals

    @property
    def passed(self) -> bool:
        return self.goals.passed

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA, "check": "parity", "header": self.header.to_json(), "torch": asdict(self.torch),
            "settings": asdict(self.settings), "relative": RELATIVE, "tolerance": self.goals.tolerance,
            "layers": [asdict(d) for d in self.layers],
            "greedy": [{**asdict(g), "label": g.label} for g in self.greedy],
            "decisions": [asdict(d) for d in self.decisions],
            "speed": None if self.speed is None else {**asdict(self.speed), "ratio": self.speed.ratio},
            "goals": asdict(self.goals), "missed": self.goals.missed(), "passed": self.passed,
        }


# ----------------------------------------------------------------------------- inputs


def parity_prompts(n: int) -> tuple[list[dict[str, Any]], str | None]:
    """The first ``n`` held-out prompts, one per Spec-Bench category in turn (the first of each
    category, then the second, ...), so any prefix is varied; and a note when the built-in
    fallback prompts stand in for Spec-Bench."""
    if n < 1:
        raise MlxspecError(f"--prompts must be >= 1, got {n}")
    items, note = spec_bench_prompts(None, per_category=-(-n // 6))
    by_cat: dict[str, list[dict[str, Any]]] = {}
    for it in items:
        by_cat.setdefault(it["category"], []).append(it)
    lists = list(by_cat.values())
    out = [v[i] for i in range(max(map(len, lists))) for v in lists if i < len(v)]
    return out[:n], note


def default_drafters(lm) -> list[str]:
    """none, ngram:3, self:8 (when the target has more layers) and every draft the registry
    ships for the target (for the default model: its trained draft and its eagle head), else
    its registry default draft."""
    from mlxspec.targets import store

    out = ["none", "ngram:3"]
    if lm.config.num_layers > SELF_LAYERS:
        out.append(f"self:{SELF_LAYERS}")
    shipped = [d["name"] for d in store.drafts() if d["target"] == lm.name and d["present"]]
    default = store.default_draft(lm.name)
    for d in shipped or ([default] if default else []):
        if d not in out:
            out.append(d)
    return out


def load_pair(model_spec: Any, device: str | None, dtype: str):
    """(MLX reference, torch model): the torch LoadedModel and the float32 MLX model its weights
    were copied from. ``model_spec``: a spec, or a torch ``LoadedModel`` already loaded."""
    from mlxspec.torchpath import pick_device, require_torch

    require_torch()
    if getattr(model_spec, "backend", "mlx") != "mlx" and getattr(model_spec, "source", None) is not None:
        return model_spec.source, model_spec
    if hasattr(model_spec, "model"):
        raise MlxspecError("parity needs the torch model (load with backend='torch:DEVICE') or a model spec")
    from mlxspec.targets.loading import load

    tl = load(model_spec, dtype, backend=f"torch:{pick_device(device)}")
    return tl.source, tl


# ----------------------------------------------------------------------------- comparison


class _DiffSum:
    """Running max / sum of ``RELATIVE`` over arrays compared one by one."""

    def __init__(self, name: str):
        self.name, self.max_rel, self.sum_rel, self.max_abs, self.n = name, 0.0, 0.0, 0.0, 0

    def add(self, a: np.ndarray, b: np.ndarray) -> None:
        """Float32 arithmetic (a prompt's logits are hundreds of MB; the difference of two close
        float32 values is exact), sums in float64."""
        a = a.reshape(-1, a.shape[-1]).astype(np.float32, copy=False)
        b = b.reshape(-1, b.shape[-1]).astype(np.float32, copy=False)
        d = np.abs(a - b)
        self.max_abs = max(self.max_abs, float(d.max()))
        d /= np.maximum(np.abs(a).max(axis=-1, keepdims=True), np.finfo(np.float32).tiny)
        self.max_rel = max(self.max_rel, float(d.max()))
        self.sum_rel += float(d.sum(dtype=np.float64))
        self.n += d.size

    def diff(self) -> Diff:
        return Diff(self.name, self.max_rel, self.sum_rel / self.n if self.n else 0.0, self.max_abs, self.n)


def _np_mlx(x: mx.array) -> np.ndarray:
    return np.array(x.astype(mx.float32))


def _np_torch(x) -> np.ndarray:
    import torch

    return x.detach().to(torch.float32).cpu().numpy()


def _torch_tokens(ids: Sequence[int], device):
    import torch

    return torch.tensor([list(ids)], dtype=torch.int64, device=device)


def _mlx_logits(model, ids: Sequence[int]) -> np.ndarray:
    """The last row's logits of one fresh pass with a KV cache (the engine's forward)."""
    return _np_mlx(model(mx.array([list(ids)], mx.int32), model.make_cache())[0, -1])


def _torch_logits(model, ids: Sequence[int]) -> np.ndarray:
    import torch

    with torch.inference_mode():
        return _np_torch(model(_torch_tokens(ids, model.device), model.make_cache())[0, -1])


def _mlx_walk(model, ids: Sequence[int]) -> list[np.ndarray]:
    """The outputs of the embedding, every block, the final norm and the head, one causal pass."""
    m = model
    h = m.model.embed_tokens(mx.array([list(ids)], mx.int32))
    if m.cfg.embed_scale is not None:
        h = h * m.cfg.embed_scale
    outs = [_np_mlx(h)]
    for layer in m.layers:
        h = layer(h, "causal", None, None)
        mx.eval(h)
        outs.append(_np_mlx(h))
    h = m.model.norm(h)
    outs.append(_np_mlx(h))
    logits = m.model.embed_tokens.as_linear(h) if m.cfg.tie_embeddings else m.lm_head(h)
    outs.append(_np_mlx(logits))
    return outs


def _torch_walk(model, ids: Sequence[int]) -> list[np.ndarray]:
    import torch

    from mlxspec.torchpath.model import pass_inputs

    with torch.inference_mode():
        h = model.model.embed_tokens(_torch_tokens(ids, model.device))
        mask, positions = pass_inputs(len(ids), 0, "causal", None, model.device)
        cos, sin = model.rope.tables(positions, h.dtype)
        outs = [_np_torch(h)]
        for layer in model.layers:
            h = layer(h, mask, None, model.rope, cos, sin)
            outs.append(_np_torch(h))
        h = model.model.norm(h)
        outs.append(_np_torch(h))
        outs.append(_np_torch(model.head(h)))
    return outs


def layer_diffs(lm, tl, prompt_ids: Sequence[Sequence[int]], tick: Callable[[str], None] = lambda _: None,
                labels: Sequence[str] | None = None) -> list[Diff]:
    """Every layer's output and the logits on both backends, over every prompt (``RELATIVE``):
    rows embed, layer 0..N-1, norm, head (layer by layer, no cache), then the engine's own
    forward with a fresh cache, "logits (cached pass)"."""
    import torch

    names = ["embed", *(f"layer {i}" for i in range(lm.config.num_layers)), "norm", "head"]
    sums = [_DiffSum(n) for n in names]
    cached = _DiffSum("logits (cached pass)")
    for i, ids in enumerate(prompt_ids):
        for s, a, b in zip(sums, _mlx_walk(lm.model, ids), _torch_walk(tl.model, ids)):
            s.add(a, b)
        a = _np_mlx(lm.model(mx.array([list(ids)], mx.int32), lm.model.make_cache())[0])
        with torch.inference_mode():
            b = _np_torch(tl.model(_torch_tokens(ids, tl.model.device), tl.model.make_cache())[0])
        cached.add(a, b)
        tick(f"layers · {labels[i] if labels else i}")
    return [s.diff() for s in sums] + [cached.diff()]


def _divergence(lm, tl, prompt: Any, ids: list[int], a: list[int], b: list[int], tol: float) -> Divergence | None:
    """None when ``a`` (MLX) == ``b`` (torch), else the first divergence, classified."""
    at = first_mismatch(a, b)
    if at is None:
        return None
    if at == min(len(a), len(b)):
        return Divergence(prompt, at, None, None, "", "", None, None, None, False,
                          reason=f"lengths differ: MLX {len(a)}, torch {len(b)}")
    prefix, ta, tb = ids + a[:at], a[at], b[at]
    la, lb = _mlx_logits(lm.model, prefix), _torch_logits(tl.model, prefix)
    allowed = 2 * tol * float(np.abs(la).max())
    dec = lm.tokenizer.decode
    return Divergence(prompt, at, ta, tb, dec([ta]), dec([tb]), (float(la[ta]), float(la[tb])),
                      (float(lb[ta]), float(lb[tb])), allowed, bool(abs(float(la[ta] - la[tb])) <= allowed))


def _ks_of(draft: str, ks: Sequence[int]) -> list[int | None]:
    """The Ks a drafter runs at: None alone for target-only ("none")."""
    return [None] if draft in ("none", "") else list(ks)


def drafter_pairs(lm, tl, drafters: Sequence[str]) -> dict[str, tuple[Any, Any]]:
    """Each drafter spec made for both backends, (MLX, torch); None for "none". Made before any
    work, so a bad spec is refused at once."""
    from mlxspec.targets.drafts import make_drafter

    return {d: (make_drafter(d, lm, lm.dtype), make_drafter(d, tl, tl.dtype)) for d in dict.fromkeys(drafters)}


def greedy_agreement(lm, tl, prompt_ids: Sequence[list[int]], prompt_keys: Sequence[Any],
                     pairs: dict[str, tuple[Any, Any]], ks: Sequence[int], max_tokens: int, tol: float,
                     tick: Callable[[str], None] = lambda _: None) -> list[GreedyRow]:
    """Greedy outputs of both backends for target-only (draft "none") and each drafter of
    ``pairs`` (``drafter_pairs``) at each K, prompt by prompt, compared token for token."""
    from mlxspec.core.sampling import SamplingParams

    params = SamplingParams()
    rows = []
    for draft, pair in pairs.items():
        for k in _ks_of(draft, ks):
            divs, same_steps, compared, agreeing = [], 0, 0, 0
            acc = {"mlx": [], "torch": []}
            for key, ids in zip(prompt_keys, prompt_ids):
                n = min(max_tokens, lm.context_length - len(ids) - 1)
                runs = {}
                for name, model, d in (("mlx", lm, pair[0]), ("torch", tl, pair[1])):
                    runs[name] = engine_run(model, ids, params, n, set(), 0, d, k or 1)
                    acc[name] += runs[name].accepted
                    tick(f"greedy {name} {'target-only' if k is None else f'{draft} K={k}'} · {key}")
                a, b = runs["mlx"].tokens, runs["torch"].tokens
                compared += len(a)
                at = first_mismatch(a, b)
                agreeing += len(a) if at is None else at
                same_steps += runs["mlx"].accepted == runs["torch"].accepted
                div = _divergence(lm, tl, key, ids, a, b, tol)
                if div is not None:
                    divs.append(div)
            tau = {name: (sum(v) / len(v) if v and k is not None else None) for name, v in acc.items()}
            near = sum(d.near_tie for d in divs)
            rows.append(GreedyRow(draft, k, len(prompt_ids), len(prompt_ids) - len(divs), near, len(divs) - near,
                                  compared, agreeing, same_steps, tau["mlx"], tau["torch"], divs))
    return rows


def _draft_chain(lm, ids: list[int], k: int, q_params, rng: np.random.Generator) -> list[int]:
    """K draft tokens sampled one after another from the stand-in drafter's q (the MLX
    target's distribution under ``q_params``), each after the prompt and the drafts before it."""
    from mlxspec.core import sampling as mlx_sampling

    model, cache, draft = lm.model, lm.model.make_cache(), []
    x = mx.array([ids], mx.int32)
    for _ in range(k):
        q = _np_mlx(mlx_sampling.probs(model(x, cache)[0, -1], q_params)).astype(np.float64)
        draft.append(int(rng.choice(q.size, p=q / q.sum())))
        x = mx.array([draft[-1:]], mx.int32)
    return draft


def decision_agreement(lm, tl, prompt_ids: Sequence[list[int]], prompt_keys: Sequence[Any], k: int, draws: int,
                       seed: int = 0, tick: Callable[[str], None] = lambda _: None) -> list[DecisionRow]:
    """Both backends' ``rejection_decide`` on the same uniforms, for one verify step per prompt:
    K drafts sampled from q (``_draft_chain``), then p (the target at T=1, K+1 rows) and q (the
    target at ``DECISION_Q_TEMP``, K rows), each backend from its own pass over the prompt and
    the drafts."""
    import torch

    from mlxspec.core import sampling as mlx_sampling
    from mlxspec.core import verify as mlx_verify
    from mlxspec.core.sampling import SamplingParams
    from mlxspec.torchpath import sampling as torch_sampling
    from mlxspec.torchpath import verify as torch_verify

    p_params, q_params = SamplingParams(1.0), SamplingParams(DECISION_Q_TEMP)
    rng = np.random.default_rng(seed)
    dev = tl.model.device
    rows = []
    for key, ids in zip(prompt_keys, prompt_ids):
        draft = _draft_chain(lm, ids, k, q_params, rng)
        seq, n0 = ids + draft, len(ids)
        logits = lm.model(mx.array([seq], mx.int32), lm.model.make_cache())[0, n0 - 1:]
        pm, qm = mlx_sampling.probs(logits, p_params), mlx_sampling.probs(logits[:k], q_params)
        mx.eval(pm, qm)
        with torch.inference_mode():
            logits = tl.model(_torch_tokens(seq, dev), tl.model.make_cache())[0, n0 - 1:]
            pt, qt = torch_sampling.probs(logits, p_params), torch_sampling.probs(logits[:k], q_params)
        idx, d_np = np.arange(k), np.asarray(draft, np.int64)
        # the probability of keeping each draft, min(1, p/q), on each backend (float64)
        keep = {}
        for name, p, q in (("mlx", _np_mlx(pm), _np_mlx(qm)), ("torch", _np_torch(pt), _np_torch(qt))):
            pd, qd = p[idx, d_np].astype(np.float64), q[idx, d_np].astype(np.float64)
            keep[name] = np.minimum(1.0, pd / np.maximum(qd, np.finfo(np.float64).tiny))
        dm, dt = mx.array(draft, mx.int32), torch.tensor(draft, dtype=torch.int32, device=dev)
        agree = explained = accepted = 0
        res_max, residual_seen = 0.0, set()
        for u in rng.random((draws, k), dtype=np.float32):
            nm, rm = mlx_verify.rejection_decide(dm, qm, pm, mx.array(u))
            with torch.inference_mode():
                nt, rt = torch_verify.rejection_decide(dt, qt, pt, torch.from_numpy(u).to(dev))
            nm, nt = int(nm.item()), int(nt.item())
            accepted += nm
            if nm == nt:
                agree += 1
                if nm not in residual_seen:  # the residual row depends on n_accepted only
                    residual_seen.add(nm)
                    res_max = max(res_max, float(np.abs(_np_mlx(rm) - _np_torch(rt)).max()))
                continue
            j = min(nm, nt)  # the first position the two decided differently
            lo, hi = sorted((keep["mlx"][j], keep["torch"][j]))
            explained += bool(lo <= float(u[j]) <= hi)
        rows.append(DecisionRow(key, k, draws, agree, explained, draws - agree - explained, accepted / draws,
                                res_max, float(np.abs(keep["mlx"] - keep["torch"]).max())))
        tick(f"decisions · {key}")
    return rows


def _backend_speed(name: str, runs: list) -> BackendSpeed:
    dec = [r.decode_tps or 0.0 for r in runs]
    return BackendSpeed(name, statistics.median(dec), min(dec), max(dec), statistics.median([r.tps for r in runs]),
                        runs[0].generated_tokens, len(runs))


def speed(lm, tl, ids: list[int], key: Any, max_tokens: int, repeats: int = SPEED_REPEATS,
          tick: Callable[[str], None] = lambda _: None) -> Speed:
    """Target-only greedy decoding of one prompt on each backend: a warm-up run each, then
    ``repeats`` timed runs each, alternating which backend goes first."""
    from mlxspec.core.sampling import SamplingParams

    params = SamplingParams()
    n = min(max_tokens, lm.context_length - len(ids) - 1)
    models = {"mlx": lm, "torch": tl}
    for name, model in models.items():
        engine_run(model, ids, params, min(n, WARMUP_TOKENS), set())
        tick(f"speed warm-up {name}")
    runs: dict[str, list] = {"mlx": [], "torch": []}
    for r in range(repeats):
        for name in (("mlx", "torch") if r % 2 == 0 else ("torch", "mlx")):
            runs[name].append(engine_run(models[name], ids, params, n, set()))
            tick(f"speed {name} {r + 1}/{repeats}")
    return Speed(key, len(ids), n, 1, _backend_speed("mlx", runs["mlx"]), _backend_speed("torch", runs["torch"]))


# ----------------------------------------------------------------------------- the whole check


def run_parity(
    model_spec: Any = "default",
    device: str | None = None,
    dtype: str = "auto",
    prompts: int | Sequence[dict[str, Any]] = DEFAULT_PROMPTS,
    drafters: Sequence[str] | None = None,
    ks: Sequence[int] = DEFAULT_KS,
    max_tokens: int = DEFAULT_MAX_TOKENS,
    progress: Progress = None,
    draws: int = DECISION_DRAWS,
    repeats: int = SPEED_REPEATS,
    seed: int = 0,
    with_speed: bool = True,
    threads: int | None = None,
) -> ParityResult:
    """MLX vs torch on ``prompts`` (a count of held-out prompts, or items {id, category, text}):
    layer diffs, greedy agreement for target-only and every drafter at every K, decision
    agreement under shared uniforms (K = the largest of ``ks``), and tokens/s of each backend.

    ``model_spec``: a spec, loaded on torch ``device`` (None: the best here) in ``dtype``
    ("auto": float32 on CPU, half on accelerators), or a torch ``LoadedModel``. ``drafters``:
    None for ``default_drafters``. ``threads``: ``torch.set_num_threads`` for the run (None:
    torch's own; MLX's CPU matmuls take OpenBLAS's, OPENBLAS_NUM_THREADS)."""
    from mlxspec.core.drafters import parse_k

    ks = sorted({parse_k(int(k)) for k in ks})
    if not ks:
        raise MlxspecError("parity needs at least one K")
    if max_tokens < 1 or draws < 1 or repeats < 1:
        raise MlxspecError("--max-tokens, draws and repeats must be >= 1")
    items, note = parity_prompts(prompts) if isinstance(prompts, int) else (list(prompts), None)
    if threads is not None and threads < 1:
        raise MlxspecError(f"torch threads must be >= 1, got {threads}")
    lm, tl = load_pair(model_spec, device, dtype)
    with _torch_threads(threads):
        return _check(lm, tl, items, note, drafters, ks, max_tokens, progress, draws, repeats, seed, with_speed)


@contextmanager
def _torch_threads(n: int | None) -> Iterator[None]:
    """``torch.set_num_threads(n)`` for the block (nothing for None)."""
    import torch

    before = torch.get_num_threads()
    if n is not None:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _check(lm, tl, items, note, drafters, ks, max_tokens, progress, draws, repeats, seed, with_speed) -> ParityResult:
    import torch

    tol = TOLERANCE[tl.dtype]
    drafters = list(dict.fromkeys(default_drafters(lm) if drafters is None else drafters))
    pairs = drafter_pairs(lm, tl, drafters)
    ids = encode_prompts(lm, items, max_tokens)
    keys = [f"{it['category']} #{it['id']}" for it in items]
    methods = sum(len(_ks_of(d, ks)) for d in drafters)
    total = len(ids) * (2 + 2 * methods) + (2 + 2 * repeats) * with_speed
    tick = progress_ticker(progress, total)

    layers = layer_diffs(lm, tl, ids, tick, keys)
    greedy = greedy_agreement(lm, tl, ids, keys, pairs, ks, max_tokens, tol, tick)
    decisions = decision_agreement(lm, tl, ids, keys, max(ks), draws, seed, tick=tick)
    timing = speed(lm, tl, ids[0], keys[0], max_tokens, repeats, tick) if with_speed else None

    logits_max = max(d.max_rel for d in layers[-2:])
    goals = Goals(tol, logits_max, logits_max <= tol, all(r.mismatches == 0 for r in greedy),
                  all(d.unexplained == 0 for d in decisions))
    device_name = tl.backend.partition(":")[2]
    return ParityResult(
        header=run_header(lm),
        torch=TorchInfo(torch.__version__, device_name, tl.dtype, torch.get_num_threads()),
        settings=Settings(prepared_prompts(items, ids), drafters, ks, max_tokens, draws, DECISION_Q_TEMP,
                          repeats, seed, note),
        layers=layers, greedy=greedy, decisions=decisions, speed=timing, goals=goals,
    )


# ----------------------------------------------------------------------------- output


def _ok(ok: bool) -> str:
    return markup(Kind.PASS, "PASS") if ok else markup(Kind.FAIL, "FAIL")


def _e(x: float | None) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.2e}"


def _layer_table(result: ParityResult):
    from rich.table import Table

    tol = result.goals.tolerance
    table = Table(title="Outputs, MLX vs torch: relative difference per row",
                  caption=f"relative = {RELATIVE}; goal for the logits: max <= {tol:g}")
    for col in ("output", "max rel", "mean rel", "max abs"):
        table.add_column(col, justify="left" if col == "output" else "right")
    for d in result.layers:
        logits = d.name in ("head", "logits (cached pass)")
        mark = ("" if d.max_rel <= tol else " ✗") if logits else ""
        table.add_row(d.name, _e(d.max_rel) + mark, _e(d.mean_rel), _e(d.max_abs), style="bold" if logits else None)
    return table


def _greedy_table(result: ParityResult):
    from rich.table import Table

    n = len(result.settings.prompts)
    table = Table(title=f"Greedy agreement, {n} prompt{'s' * (n != 1)} x {result.settings.max_tokens} tokens",
                  caption="identical: the same tokens on both backends; steps: the same drafts accepted at every "
                          "step; tau: mean accepted drafts per step, MLX / torch")
    for col in ("draft", "K", "identical", "tokens", "steps", "tau", "diverged"):
        table.add_column(col, justify="left" if col == "draft" else "right", no_wrap=col == "draft")
    for g in result.greedy:
        tau = "-" if g.k is None else f"{fmt(g.tau_mlx, '{:.2f}')} / {fmt(g.tau_torch, '{:.2f}')}"
        diverged = ", ".join(x for x in (f"{g.near_ties} near-tie" if g.near_ties else "",
                                         markup(Kind.FAIL, f"{g.mismatches} mismatch") if g.mismatches else "") if x)
        table.add_row("target-only" if g.k is None else g.draft, "-" if g.k is None else str(g.k),
                      f"{g.identical}/{g.prompts}", f"{g.tokens_agreeing}/{g.tokens_compared}",
                      f"{g.same_steps}/{g.prompts}", tau, diverged or "-")
    return table


def _divergence_lines(result: ParityResult) -> list[str]:
    """The first divergence of every method that diverged, with the two tokens' logits."""
    return [f"  {g.label}: {_divergence_text(d)}" for g in result.greedy for d in g.divergences[:1]]


def _divergence_text(d: Divergence | None) -> str:
    if d is None:
        return "-"
    if d.mlx_logits is None:
        return f"{d.prompt} @{d.at}: {d.reason}"
    from rich.markup import escape

    kind = "near-tie" if d.near_tie else markup(Kind.FAIL, "mismatch")
    return (f"{d.prompt} @{d.at}: {escape(repr(d.mlx_text))} vs {escape(repr(d.torch_text))}, logits MLX {d.mlx_logits[0]:.4f}/"
            f"{d.mlx_logits[1]:.4f}, torch {d.torch_logits[0]:.4f}/{d.torch_logits[1]:.4f} ({kind})")


def _decision_table(result: ParityResult):
    from rich.table import Table

    s = result.settings
    table = Table(title=f"Acceptance decisions given the same uniforms ({s.decision_draws} draws per prompt)",
                  caption=f"p: the target at T=1; q: the target at T={s.decision_q_temp:g} (drafts sampled from it); "
                          "keep: min(1, p/q) at a draft; explained: the uniform lies between the two backends' keep")
    for col in ("prompt", "K", "agree", "explained", "unexplained", "mean accepted", "keep max |Δ|",
                "residual max |Δ|"):
        table.add_column(col, justify="left" if col == "prompt" else "right")
    for d in result.decisions:
        table.add_row(str(d.prompt), str(d.k), f"{d.agree}/{d.draws}", str(d.explained),
                      markup(Kind.FAIL, str(d.unexplained)) if d.unexplained else "0", f"{d.mean_accepted:.2f}",
                      _e(d.keep_max_abs), _e(d.residual_max_abs))
    return table


def _speed_table(sp: Speed):
    from rich.table import Table

    table = Table(title=f"Target-only greedy decoding, {sp.prompt} ({sp.prompt_tokens}-token prompt, "
                        f"{sp.max_tokens} tokens)",
                  caption=f"{sp.warmup} warm-up, then the median of {sp.mlx.runs} runs per backend")
    for col in ("backend", "decode tok/s (median)", "min - max", "end-to-end tok/s"):
        table.add_column(col, justify="left" if col == "backend" else "right")
    for b in (sp.mlx, sp.torch):
        table.add_row(b.backend, f"{b.decode_tps_median:.1f}", f"{b.decode_tps_min:.1f} - {b.decode_tps_max:.1f}",
                      f"{b.tps_median:.1f}")
    table.add_row("torch / mlx", f"{sp.ratio:.2f}x" if sp.ratio is not None else "-", "", "", style="bold")
    return table


def print_parity(result: ParityResult, console) -> None:
    """Render a ``run_parity`` result: header, the four tables, the goals."""
    h, t, s, g = result.header, result.torch, result.settings, result.goals
    console.print(f"[bold]Parity[/] · {h.model}: MLX {h.dtype} ({h.backend}) vs torch {t.version} {t.device} "
                  f"{t.dtype} · {len(s.prompts)} held-out prompts, drafters {', '.join(s.drafters)}, "
                  f"K {', '.join(map(str, s.ks))}")
    if s.note:
        console.print(f"[yellow]{s.note}[/]")
    console.print(_layer_table(result))
    console.print(_greedy_table(result))
    lines = _divergence_lines(result)
    if lines:
        console.print("first divergences (the two tokens' logits at the common prefix, each backend's own pass):")
        for line in lines:
            console.print(line)
    console.print(_decision_table(result))
    if result.speed is not None:
        console.print(_speed_table(result.speed))
    console.print(f"  logits: max relative difference {g.logits_max_rel:.2e} (goal <= {g.tolerance:g}): {_ok(g.logits)}")
    console.print(f"  greedy: identical or near-tie for target-only and every drafter and K: {_ok(g.greedy)}")
    console.print(f"  decisions: no unexplained disagreement: {_ok(g.decisions)}")
    console.print(f"parity: {_ok(g.passed)}" + ("" if g.passed else " (missed: " + "; ".join(g.missed()) + ")"))
