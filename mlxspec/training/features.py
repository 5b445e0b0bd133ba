"""Training data for a feature-reading head: the target's own hidden states and distributions
along chat examples, computed once by teacher forcing and cached.

Teacher forcing is the cheap way to get many positions here: one batched target pass over a
whole example yields every position's final hidden state and logits, at prefill speed (a few
hundred tokens/s on this CPU) instead of generation speed (~40 tokens/s batched). Per position
we keep what training needs and nothing that can be recomputed: the hidden state (float16), the
log-normaliser of the full-vocabulary logits and the full argmax. The head's teacher over its
own columns is ``W[vocab_ids] @ f - lse``, recomputed in each batch from the stored feature.

Examples are processed in shards saved as they finish, so an interrupted build resumes and a
larger set reuses a smaller one's shards.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np

from mlxspec.core.ops import ops_for
from mlxspec.errors import MlxspecError
from mlxspec.targets.tokenizer import encode_prompt

MAX_TOKENS = 256  # per example: long enough for multi-sentence answers, short enough to batch
SHARD = 64  # examples per saved shard
PER_POSITION = ("tokens", "features", "lse", "argmax")  # FeatureSet's arrays, one row a position ...
PER_EXAMPLE = ("lengths", "response_start")  # ... and one an example


@dataclass
class FeatureSet:
    """Flat per-position arrays over all examples, with per-example offsets."""

    tokens: np.ndarray  # (N,) int32
    features: np.ndarray  # (N, D) float16: the target's final (normed) hidden state
    lse: np.ndarray  # (N,) float32: logsumexp of the target's full logits
    argmax: np.ndarray  # (N,) int32: the target's greedy next token
    lengths: np.ndarray  # (E,) tokens per example
    response_start: np.ndarray  # (E,) index of the first response token in each example
    categories: list[str]
    meta: dict[str, Any] = field(default_factory=dict)
    # (N, n*D) float16: the residual stream entering the tapped blocks (an EAGLE-3 head's input),
    # only in sets built with ``taps``
    aux: np.ndarray | None = None

    @property
    def offsets(self) -> np.ndarray:
        return np.concatenate([[0], np.cumsum(self.lengths)])

    def trained_positions(self) -> int:
        """Response positions, the ones a drafter is asked to predict."""
        return int((self.lengths - self.response_start).clip(min=0).sum())

    def tokens_per_category(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for c, n, s in zip(self.categories, self.lengths, self.response_start):
            out[c] = out.get(c, 0) + int(max(n - s, 0))
        return dict(sorted(out.items()))

    def save(self, path: Path) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".partial.npz")
        np.savez(tmp, tokens=self.tokens, features=self.features, lse=self.lse, argmax=self.argmax,
                 lengths=self.lengths, response_start=self.response_start,
                 categories=np.array(self.categories), meta=json.dumps(self.meta),
                 **({} if self.aux is None else {"aux": self.aux}))
        tmp.replace(path)
        return path

    @classmethod
    def load(cls, path: Path) -> FeatureSet:
        with _opened(path) as z:
            return cls(*(z[f] for f in (*PER_POSITION, *PER_EXAMPLE)), [str(c) for c in z["categories"]],
                       json.loads(str(z["meta"])), z["aux"] if "aux" in z.files else None)

    @classmethod
    def gather(cls, paths: Sequence[Path], meta: dict[str, Any]) -> FeatureSet:
        """The saved sets at ``paths`` as one, read one at a time into arrays allocated once:
        the peak is the whole set plus one shard, not twice the whole (as loading them all and
        concatenating would be; with the tapped states a full set is several GB)."""
        if not paths:
            raise MlxspecError("no examples: the feature set is empty")
        sizes = []  # (positions, examples, whether it has the tapped states) of each
        for path in paths:
            with _opened(path) as z:
                sizes.append((int(z["lengths"].sum()), len(z["lengths"]), "aux" in z.files))
        fields = [*PER_POSITION, *PER_EXAMPLE] + (["aux"] if all(aux for *_, aux in sizes) else [])
        rows = {f: sum(e if f in PER_EXAMPLE else n for n, e, _ in sizes) for f in fields}
        out: dict[str, np.ndarray] = {}  # allocated from the first shard's widths and dtypes
        categories: list[str] = []
        n = e = 0
        for path, (dn, de, _) in zip(paths, sizes):
            with _opened(path) as z:
                for f in fields:
                    part = z[f]
                    if f not in out:
                        out[f] = np.empty((rows[f], *part.shape[1:]), part.dtype)
                    out[f][slice(e, e + de) if f in PER_EXAMPLE else slice(n, n + dn)] = part
                categories += [str(c) for c in z["categories"]]
            n, e = n + dn, e + de
        return cls(*(out[f] for f in (*PER_POSITION, *PER_EXAMPLE)), categories, meta, out.get("aux"))

    @classmethod
    def concat(cls, parts: Sequence[FeatureSet], meta: dict[str, Any]) -> FeatureSet:
        if not parts:
            raise MlxspecError("no examples: the feature set is empty")
        aux = np.concatenate([p.aux for p in parts]) if all(p.aux is not None for p in parts) else None
        return cls(*(np.concatenate([getattr(p, f) for p in parts]) for f in
                     ("tokens", "features", "lse", "argmax", "lengths", "response_start")),
                   [c for p in parts for c in p.categories], meta, aux)


@contextmanager
def _opened(path: Path) -> Iterator[Any]:
    """The ``.npz`` at ``path``, open (its arrays are read as they are asked for); any fault
    reading it is a clear error naming the file."""
    try:
        with np.load(path) as z:
            yield z
    except (OSError, KeyError, ValueError) as e:
        raise MlxspecError(f"{path}: not a feature set ({e})") from None


def encode_example(tokenizer, prompt: str, response: str, max_tokens: int = MAX_TOKENS) -> tuple[list[int], int]:
    """Chat-templated ids of a user turn and the assistant's response, and where the response
    starts. The prompt is cut from the left when the example is too long."""
    head = encode_prompt(tokenizer, [{"role": "user", "content": prompt}])
    body = tokenizer.encode(response, add_special_tokens=False) + list(tokenizer.eos_token_ids)[:1]
    body = body[: max_tokens // 2] if len(head) > max_tokens // 2 else body[: max_tokens - len(head)]
    head = head[-(max_tokens - len(body)):]
    return head + body, len(head)


def teacher_pass(model, seqs: Sequence[list[int]], taps: tuple[int, ...] = ()) -> list[tuple[np.ndarray, ...]]:
    """One batched target pass over right-padded ``seqs``: per example its features (float16),
    logsumexp and argmax at every real position (padding sits after them, so causal attention
    keeps it out of every real row), and with ``taps`` the states entering those blocks
    (float16). ``model`` may be the torch twin of the target (the same weights: ~1.9x
    the positions per second of MLX's CPU backend here; BENCHMARKS.md, the eagle head)."""
    width = max(len(s) for s in seqs)
    batch = np.zeros((len(seqs), width), np.int32)
    for i, s in enumerate(seqs):
        batch[i, : len(s)] = s
    if taps:
        return _tapped_pass(model, batch, seqs, taps)
    if ops_for(model).name == "torch":
        from mlxspec.torchpath.model import teacher_outputs  # imports torch, an optional extra

        h, lse, am = teacher_outputs(model, batch)
    else:
        logits, hidden = model(mx.array(batch), None, return_hidden=True)
        lse = mx.logsumexp(logits, axis=-1)
        am = mx.argmax(logits, axis=-1)
        h16 = hidden.astype(mx.float16)
        mx.eval(lse, am, h16)
        h, lse, am = np.array(h16), np.array(lse), np.array(am).astype(np.int32)
    return [(h[i, : len(s)], lse[i, : len(s)], am[i, : len(s)]) for i, s in enumerate(seqs)]


def _tapped_pass(model, batch: np.ndarray, seqs: Sequence[list[int]], taps: tuple[int, ...]) -> list[tuple[np.ndarray, ...]]:
    """``teacher_pass`` with the tapped states: the same pass also taps the last block's output,
    whose final norm is the feature the teacher's rows score (no second pass)."""
    last = model.cfg.num_layers
    every = tuple(sorted(set(taps) | {last}))
    pick = tuple(every.index(t) for t in sorted(taps))  # where each tap sits among ``every``
    if ops_for(model).name == "torch":
        from mlxspec.torchpath.model import tapped_teacher_outputs  # imports torch, an optional extra

        h, aux, lse, am = tapped_teacher_outputs(model, batch, every, pick)
    else:
        logits, tapped = model(mx.array(batch), None, return_hidden=every)
        parts = mx.split(tapped, len(every), axis=-1)
        h16 = model.model.norm(parts[-1]).astype(mx.float16)
        aux16 = mx.concatenate([parts[i] for i in pick], axis=-1).astype(mx.float16)
        lse, am = mx.logsumexp(logits, axis=-1), mx.argmax(logits, axis=-1)
        mx.eval(lse, am, h16, aux16)
        h, aux, lse, am = np.array(h16), np.array(aux16), np.array(lse), np.array(am).astype(np.int32)
    return [(h[i, : len(s)], lse[i, : len(s)], am[i, : len(s)], aux[i, : len(s)]) for i, s in enumerate(seqs)]


def cache_key(target_name: str, examples: Sequence[Any], max_tokens: int, taps: tuple[int, ...] = ()) -> str:
    # Tapped sets get keys of their own; untapped ones keep the keys they always had.
    h = hashlib.sha256(f"{target_name}|{max_tokens}".encode() + (f"|taps={list(taps)}".encode() if taps else b""))
    for e in examples:
        h.update(f"{e.category}\x00{e.prompt}\x00{e.response}\x01".encode())
    return h.hexdigest()[:16]


def _build_shard(target, examples: Sequence[Any], max_tokens: int, batch: int, taps: tuple[int, ...] = ()) -> FeatureSet:
    encoded = [encode_example(target.tokenizer, e.prompt, e.response, max_tokens) for e in examples]
    order = np.argsort([len(s) for s, _ in encoded])  # similar lengths per batch: less padding
    rows: dict[int, tuple[np.ndarray, ...]] = {}
    for i in range(0, len(order), batch):
        idx = order[i : i + batch]
        for j, r in zip(idx, teacher_pass(target.model, [encoded[j][0] for j in idx], taps)):
            rows[int(j)] = r
    parts = [FeatureSet(np.array(encoded[j][0], np.int32), *rows[j][:3], np.array([len(encoded[j][0])]),
                        np.array([encoded[j][1]]), [examples[j].category], {}, rows[j][3] if taps else None)
             for j in range(len(examples))]
    return FeatureSet.concat(parts, {})


def build_shards(target, examples: Sequence[Any], cache_dir: Path, max_tokens: int = MAX_TOKENS, batch: int = 8,
                 progress: Callable[[int, int], None] | None = None, taps: tuple[int, ...] = ()) -> list[Path]:
    """The saved shards of features for ``examples`` (anything with ``category``, ``prompt``,
    ``response``), ``SHARD`` examples each; shards already in the cache are reused. ``taps``:
    also the states entering those blocks (``FeatureSet.aux``)."""
    if not examples:
        raise MlxspecError("no training examples")
    # Shards are keyed by their own examples, not the set's: sets that share a prefix of the
    # corpus (a larger --max-examples, an interrupted build) share their shards, and a set is
    # just its shards put together.
    shard_dir = cache_dir / "shards"
    paths = []
    for start in range(0, len(examples), SHARD):
        chunk = examples[start : start + SHARD]
        path = shard_dir / f"{cache_key(target.name, chunk, max_tokens, taps)}.npz"
        if not path.exists():
            _build_shard(target, chunk, max_tokens, batch, taps).save(path)
        paths.append(path)
        if progress:
            progress(min(start + SHARD, len(examples)), len(examples))
    return paths


def build(target, examples: Sequence[Any], cache_dir: Path, max_tokens: int = MAX_TOKENS, batch: int = 8,
          progress: Callable[[int, int], None] | None = None, taps: tuple[int, ...] = ()) -> FeatureSet:
    """``build_shards``' shards as one set."""
    t0 = time.perf_counter()
    paths = build_shards(target, examples, cache_dir, max_tokens, batch, progress, taps)
    data = FeatureSet.gather(paths, set_meta(target, examples, max_tokens, taps))
    data.meta["load_or_build_s"] = round(time.perf_counter() - t0, 1)
    data.meta["tokens_per_category"] = data.tokens_per_category()
    return data


def set_meta(target, examples: Sequence[Any], max_tokens: int, taps: tuple[int, ...] = ()) -> dict[str, Any]:
    return {"target": target.name, "examples": len(examples), "max_tokens": max_tokens,
            "key": cache_key(target.name, examples, max_tokens, taps)}
