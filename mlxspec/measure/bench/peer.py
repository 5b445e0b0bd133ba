"""mlx-lm's own speculative decoding as ``spec_bench``'s peer: the same pair (or the peer's own
draft) in mlx-lm's llama classes sharing our arrays, run through ``stream_generate`` and timed
from outside as our engine times itself. Its accepted tokens per step are rebuilt from the
``from_draft`` flags (``mlx_lm_steps``). At T > 0 mlx-lm accepts a draft token only if the
target's *sampled* token equals it (no rejection sampling), so its acceptance is lower than
ours there by construction."""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import mlx_lm
from mlx.utils import tree_flatten
from mlx_lm.sample_utils import make_sampler

from mlxspec.core.drafters import ModelDrafter
from mlxspec.core.drafters.draft_model import DraftModel
from mlxspec.core.drafters.eagle import EagleDrafter
from mlxspec.core.model import Llama
from mlxspec.core.sampling import SamplingParams
from mlxspec.core.runs import Run
from mlxspec.targets import export, loading, weights
from mlxspec.targets.drafts import make_drafter
from mlxspec.targets.folders import as_llama

NGRAM_NO_PEER = ("mlx-lm's speculative decoding needs a draft model; prompt lookup (ngram) "
                 "has no mlx-lm equivalent")
MLX_LM_NOTE = ("accepted tokens per step rebuilt from stream_generate's from_draft flags; at T > 0 "
               "mlx-lm accepts a draft only if the target's sampled token equals it")
EAGLE_PEER_LAYERS = 8  # mlx-lm's draft beside an eagle head: the target's first 8 layers
MLX_LM_K_WITH_AUTO = 4  # mlx-lm has no auto K: its peer drafts this many under --k auto


@dataclass(frozen=True)
class Peer:
    """mlx-lm's own speculative decoding with the same pair, or why there is none."""

    target: Any = None
    draft: Any = None
    description: str | None = None
    reason: str | None = None


def mlx_lm_steps(from_draft: list[bool], k: int, max_tokens: int) -> tuple[list[int], list[int]]:
    """Rebuild mlx-lm's speculative steps from the ``from_draft`` flags of its tokens.

    mlx-lm 0.2x/0.3x ``speculative_generate_step`` drafts ``min(max_tokens - emitted, k)`` tokens
    per step and yields the accepted ones (``from_draft=True``), then the target's own token
    (``False``) unless ``max_tokens`` was reached. So each step is a run of True flags closed
    by one False. Returns (accepted per step, drafted per step). A final step cut short by
    end-of-sequence is dropped: how many of its drafts the target would have kept is unknown.
    ``from_draft`` must include the end-of-sequence token when generation stopped on one.
    """
    accepted: list[int] = []
    drafted: list[int] = []
    i, emitted = 0, 0
    while i < len(from_draft) and emitted < max_tokens:
        num_draft = min(max_tokens - emitted, k)
        n = 0
        while n < num_draft and i + n < len(from_draft) and from_draft[i + n]:
            n += 1
        if i + n < len(from_draft) and not from_draft[i + n]:
            used = n + 1  # closed by the target's correction or bonus token
        elif n == num_draft and emitted + n == max_tokens:
            used = n  # everything accepted and the budget spent: no target token
        else:
            break  # cut short by end-of-sequence
        accepted.append(n)
        drafted.append(num_draft)
        i += used
        emitted += used
    return accepted, drafted


def mlx_lm_run(peer: Peer, tokenizer, ids: list[int], params: SamplingParams, max_tokens: int,
               k: int, seed: int) -> Run:
    """mlx-lm's speculative ``stream_generate``, timed from outside as our engine times itself,
    sampling as ``params`` asks (its temperature, top-p and min-p)."""
    # mlx-lm reads top_p 0 as "off"; it has no filter at 1 either
    sampler = make_sampler(temp=params.temperature, top_p=0.0 if params.top_p >= 1.0 else params.top_p,
                           min_p=params.min_p)
    mx.random.seed(seed)
    toks: list[int] = []
    flags: list[bool] = []
    stamps: list[float] = []
    finish = None
    t0 = time.perf_counter()
    for r in mlx_lm.stream_generate(peer.target, tokenizer, ids, max_tokens=max_tokens, draft_model=peer.draft,
                                    num_draft_tokens=k, sampler=sampler):
        stamps.append(time.perf_counter())
        toks.append(r.token)
        flags.append(bool(r.from_draft))
        finish = r.finish_reason
    if peer.draft is None:  # target-only: every step emits the target's one token
        accepted, drafted = [0] * len(flags), [0] * len(flags)
    else:
        accepted, drafted = mlx_lm_steps(flags, k, max_tokens)
    # stream_generate yields the end-of-sequence token last (finish_reason "stop"): not output.
    out = toks[:-1] if finish == "stop" else toks
    # The first step ends with the target's token, unless it used up max_tokens on drafts alone.
    first = accepted[0] + (accepted[0] < max_tokens) if accepted else len(stamps)
    first = max(1, min(first, len(stamps)))
    t_first = stamps[first - 1] if stamps else t0
    t_last = stamps[-1] if stamps else t0
    return Run(out, len(ids), t_first - t0, t_last - t_first, first, "eos" if finish == "stop" else "length",
               accepted, drafted, list(drafted))


def _self_draft_llama(lm, num_layers: int):
    """The target's first ``num_layers`` layers + norm + head as a llama sharing its arrays."""
    small = Llama(dataclasses.replace(lm.config, num_layers=num_layers))
    params = [(name, v) for name, v in tree_flatten(lm.model.parameters())
              if not name.startswith("model.layers.") or int(name.split(".")[2]) < num_layers]
    if any(name.endswith(".scales") for name, _ in params):
        weights.quantize_to_match(small, dict(params))
    small.load_weights(params, strict=True)  # shares the arrays, copies nothing
    return small


def mlx_lm_peer(lm, draft: str, drafter) -> Peer:
    """mlx-lm's speculative decoding with the same pair, in mlx-lm's llama class sharing our arrays."""
    if isinstance(drafter, EagleDrafter):
        # mlx-lm cannot run a head that reads the target's features; its best draft here is a
        # plain model, so it gets the target's own first layers.
        drafter = ModelDrafter(lm.model, f"self:{EAGLE_PEER_LAYERS}", num_layers=EAGLE_PEER_LAYERS)
    elif not isinstance(drafter, ModelDrafter):
        return Peer(reason=NGRAM_NO_PEER if draft.startswith("ngram") else f"no mlx-lm peer for drafter {draft!r}")
    src = drafter.model
    if drafter.num_layers is not None:  # self:L -> a truncated copy: embed, layers[:L], norm, head
        src = _self_draft_llama(lm, drafter.num_layers)
        desc = f"mlx-lm stream_generate with draft_model = the target's first {drafter.num_layers} layers + norm + head"
    elif isinstance(src, DraftModel):
        src = as_llama(src, lm)
        desc = (f"mlx-lm stream_generate with draft_model = {draft} as a full-vocabulary llama "
                "(logit 0 instead of -inf outside its head)")
    else:
        desc = f"mlx-lm stream_generate with draft_model = {draft}"
    ref_target, ref_draft = export.as_mlx_lm(lm.model), export.as_mlx_lm(src)
    mx.eval(ref_target.parameters(), ref_draft.parameters())
    return Peer(ref_target, ref_draft, desc)


def mlx_lm_target_only(lm) -> Peer:
    """mlx-lm decoding the target alone: its fastest configuration where no draft pays."""
    ref = export.as_mlx_lm(lm.model)
    mx.eval(ref.parameters())
    return Peer(ref, None, "mlx-lm stream_generate, target-only (no draft model)")


def choose_peer(lm, draft: str, drafter, with_mlx_lm: bool, peer_draft: str | None) -> Peer:
    """The peer a benchmark of ``draft`` runs: none when not asked for; mlx-lm with
    ``peer_draft`` when given (its best draft for this target need not be ours; ``none``: mlx-lm
    target-only), else ``draft``. A target on another backend is compared with mlx-lm on the
    MLX weights it was copied from, only with ``peer_draft``."""
    if not with_mlx_lm:
        return Peer(reason="not requested (with_mlx_lm=False)")
    on_mlx = getattr(lm, "backend", "mlx") == "mlx"
    source = lm if on_mlx else getattr(lm, "source", None)
    if source is None or (not on_mlx and peer_draft is None):
        return Peer(reason=f"mlx-lm runs on MLX only; the target runs on {lm.backend} (--mlx-lm-draft none "
                           "or a draft compares it with mlx-lm on the same weights)")
    if not on_mlx and source.dtype == "quantized" and mx.default_device() == mx.cpu:
        # torch's int4 target was copied from the file's 4-bit weights; on MLX's CPU backend a
        # quantized product is slow (2.3 tok/s here), so mlx-lm's fastest form of them is float32
        peer = choose_peer(dataclasses.replace(lm, source=loading.load(str(source.path), "float32")), draft,
                           drafter, with_mlx_lm, peer_draft)
        if peer.description is None:
            return peer
        return dataclasses.replace(peer, description=f"{peer.description}, the weights in float32 "
                                                     "(mlx-lm's fastest on this CPU)")
    if peer_draft == "none":
        return mlx_lm_target_only(source)
    if peer_draft is not None:
        return mlx_lm_peer(source, peer_draft, make_drafter(peer_draft, source, source.dtype))
    return mlx_lm_peer(lm, draft, drafter)
