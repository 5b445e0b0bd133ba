"""A draft head that reads the target's features (EAGLE-style).

The head sees, at slot s, the target's final hidden state f_s together with the embedding of
the next token x_{s+1}; one llama block turns that into a prediction of f_{s+1}, and a head over
a frequency-ranked subset of the vocabulary scores x_{s+2}. Drafting feeds its own predicted
feature forward; once the target has verified, the accepted slots are re-run with the target's
real features. Tokens outside the head's subset get q = 0, so verification stays exact.

Slots, for committed tokens x_0..x_c of which the target has run x_0..x_{c-1} (the engine keeps
x_c for the next verify pass): the head's cache holds slots 0..m-1 computed from real features,
and ``pending`` holds the (feature, token) pairs of slots m..c-1, not yet run. Running them
yields the head's guess for x_{c+1}: the first draft.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Callable

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import KVCache

from mlxspec.core.cache import check_trimmable, rewind
from mlxspec.core.drafters.base import (Commit, Proposal, auto_proposal, child_picks, grow_tree, no_draft,
                                         processed_row)
from mlxspec.core.model import Block, LlamaConfig, Unowned
from mlxspec.core.ops import ops_for
from mlxspec.core.sampling import CoupledKey, SamplingParams
from mlxspec.core.tree import GrowingTree, TreeShape, levels, node_mask


@dataclass(frozen=True)
class EagleConfig:
    hidden_size: int = 576  # the target's: features are read and predicted in its space
    intermediate_size: int = 1536
    num_heads: int = 9
    num_kv_heads: int = 3
    head_vocab: int = 8192
    target_vocab: int = 49152
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_traditional: bool = False
    max_position: int = 8192
    tokenizer_sha256: str = ""

    def block_config(self) -> LlamaConfig:
        return LlamaConfig(
            vocab_size=self.head_vocab, hidden_size=self.hidden_size, num_layers=1,
            num_heads=self.num_heads, num_kv_heads=self.num_kv_heads,
            intermediate_size=self.intermediate_size, rms_norm_eps=self.rms_norm_eps,
            rope_theta=self.rope_theta, rope_traditional=self.rope_traditional,
            max_position=self.max_position, tie_embeddings=False,
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class DraftVocabHead(nn.Module):
    """What the eagle heads share: a call is (prediction, logits over the draft vocabulary), from
    the head's own ``predict`` and ``logits``; ``full_logits`` lifts those to the target's."""

    def __call__(self, features: mx.array, tokens: mx.array, cache: list | None = None, mask: Any = None,
                 positions: mx.array | None = None) -> tuple[mx.array, mx.array]:
        pred = self.predict(features, tokens, cache, mask, positions)
        return pred, self.logits(pred)

    def full_logits(self, reduced: mx.array) -> mx.array:
        """Draft-vocabulary logits (..., draft_vocab) -> the target's vocabulary, -inf outside
        the draft's ids (``vocab_ids``), so verification gives them q = 0."""
        return self._full(reduced, -mx.inf)

    def full_probs(self, reduced: mx.array) -> mx.array:
        """Probabilities over the draft vocabulary -> the target's, 0 outside it."""
        return self._full(reduced, 0.0)

    def _full(self, reduced: mx.array, fill: float) -> mx.array:
        full = mx.full((*reduced.shape[:-1], self.cfg.target_vocab), fill, dtype=reduced.dtype)
        full[..., self.vocab_ids] = reduced
        return full


class EagleHead(DraftVocabHead):
    """``head(features, tokens, cache)`` -> (predicted next features, logits over ``vocab_ids``).

    features (B, L, D) are target features (or the head's own predictions) at slots s, tokens
    (B, L) the tokens x_{s+1}. ``mask``/``positions`` as in our llama module."""

    wants_hidden = True  # the target's final normed hidden state

    def __init__(self, cfg: EagleConfig, vocab_ids: mx.array, embed: Callable[[mx.array], mx.array]):
        super().__init__()
        self.cfg = cfg
        d = cfg.hidden_size
        self.fc = nn.Linear(2 * d, d, bias=False)
        self.block = Block(cfg.block_config())
        self.lm_head = nn.Linear(d, cfg.head_vocab, bias=False)
        self._ids = Unowned(vocab_ids.astype(mx.int32))
        self._embed = Unowned(embed)

    @property
    def vocab_ids(self) -> mx.array:
        return self._ids.value

    def make_cache(self) -> list[KVCache]:
        return [KVCache()]

    def predict(self, features: mx.array, tokens: mx.array, cache: list | None = None, mask: Any = None,
                positions: mx.array | None = None) -> mx.array:
        """The predicted next features only (training scores just the rows it trains on)."""
        if mask is None and tokens.shape[1] > 1:
            mask = "causal"
        e = mx.stop_gradient(self._embed.value(tokens)).astype(features.dtype)
        h = self.fc(mx.concatenate([features, e], axis=-1))
        # The block's output is the predicted feature, in the space of the target's normed
        # final hidden state, so the target's own head rows score it.
        return self.block(h, mask, None if cache is None else cache[0], positions)

    def logits(self, pred: mx.array) -> mx.array:
        return self.lm_head(pred)



class EagleDrafter:
    """Drafts with an ``EagleHead`` or an ``eagle3.Eagle3Head`` (MLX's, or torch's twins) from
    the target's features; see the module docstring. The head says which features it reads
    (``wants_hidden``: the final state, or the blocks an EAGLE-3 head taps)."""

    samples_children = True  # --tree DxB:sample
    commits_any = True  # accepted slots are re-run on real features, whoever proposed them

    def __init__(self, head: Any, name: str):
        self.head, self.name = head, name
        self.wants_hidden = head.wants_hidden
        self.ops = ops_for(head)
        self.cache: list = []
        self.pending_features: list[Any] = []  # (n, D) blocks, real target features
        self.pending_tokens: list[int] = []
        self.fed = 0  # slots the last proposal ran on predicted features

    def reset(self, prompt: list[int], hidden: Any = None) -> None:
        self.cache = check_trimmable(self.head.make_cache(), f"draft {self.name!r}")
        # Slot s pairs f_s with x_{s+1}: the prompt's features f_0..f_{c-1} meet x_1..x_c.
        self.pending_features = [] if hidden is None else [self.ops.astype(hidden, self.head.fc.weight)]
        self.pending_tokens = list(prompt[1:]) if hidden is not None else []

    def _run(self, features: Any, tokens: Any) -> tuple[Any, Any]:
        pred, z = self.head(features[None], tokens.reshape(1, -1), self.cache)
        return pred[0, -1:], z[0, -1]

    def _pick(self, z: Any, params: SamplingParams, key: Any, history: list[int], drafted: list[Any]) -> tuple[Any, Any]:
        """The next draft and the q it was drawn from (None when greedy), through the target's
        penalties and bias when those are on (``processed_row``)."""
        if params.greedy and not params.processes:  # argmax over the head's own columns: no full row needed
            return self.head.vocab_ids[z.argmax()], None
        if not params.processes and not isinstance(key, CoupledKey):
            # Outside its columns q is 0 under every filter: drawn within them, the row is a sixth
            # as long (a coupled draw needs the whole row: its noise is keyed by token id).
            column = self.ops.sample(z, params, key)
            return self.head.vocab_ids[column], self.head.full_probs(self.ops.probs(z, params))
        logits = processed_row(self.ops, self.head.full_logits(z), params, history, drafted)
        return self.ops.sample(logits, params, key), None if params.greedy else self.ops.probs(logits, params)

    def _run_pending(self) -> tuple[Any, Any]:
        """Run the slots of real target features not run yet: the head's guess of the first draft."""
        feats = self.pending_features
        pred, z = self._run(self.ops.concatenate(feats) if len(feats) > 1 else feats[0],
                            self.ops.tokens(self.pending_tokens))
        self.pending_features, self.pending_tokens = [], []
        return pred, z

    def propose(self, history: list[int], k: int, params: SamplingParams, key: Any) -> Proposal:
        ops = self.ops
        self.fed = 0
        if k == 0 or not self.pending_tokens:
            return no_draft(ops)
        pred, z = self._run_pending()
        self.fed = k - 1
        tokens, dists = [], []
        for i, sub in enumerate(ops.split(key, k)):
            tok, q = self._pick(z, params, sub, history, tokens)
            tokens.append(tok)
            if q is not None:
                dists.append(q)
            if i < k - 1:
                pred, z = self._run(pred, tok)
        return Proposal(ops.tokens(ops.stack(tokens)), ops.stack(dists) if dists else None)

    def propose_tree(self, history: list[int], shape: TreeShape, params: SamplingParams, key: Any,
                     draft_probs: bool = False) -> Proposal:
        """Each node's top-``shape.branch`` children by the head's logits (or, for a sampled
        shape at T > 0, ``branch`` draws from its distribution, the proposal's q), one head
        pass per level: a node's slot pairs its parent's predicted feature with its own token."""
        ops = self.ops
        self.fed = 0
        if shape.auto:
            return self._propose_auto(shape, params, draft_probs)
        parents = shape.parents()
        if not parents or not self.pending_tokens:
            return no_draft(ops)
        pred, z = self._run_pending()
        z = z[None]  # the root's row: pred (1, D), z (1, head_vocab)
        base = self.cache[0].offset
        tokens, qs, dists, previous = [], [], [], None
        by_level = levels(parents)
        keys = ops.split(key, len(by_level)) if shape.sampled and not params.greedy else None
        for depth, level in enumerate(by_level, start=1):
            rows, ranks = (ops.tokens(x) for x in child_picks(parents, level, previous))
            if keys is None:
                picked = ops.top_children(z, shape.branch)[rows, ranks]  # columns of the head's vocabulary
                tokens.append(self.head.vocab_ids[picked])
                if draft_probs:  # the head gives no mass outside its vocabulary
                    qs.append(ops.node_probs(z, rows, picked, params))
            else:
                full = self.head.full_logits(z)
                picks, q = ops.sample_children(full, shape.branch, params, keys[depth - 1])
                tokens.append(picks[rows, ranks])
                dists.append(q[rows])
                if draft_probs:
                    qs.append(ops.node_probs(full, rows, tokens[-1], params))
            if depth < len(by_level):
                mask = ops.from_numpy(node_mask(parents, base, level.start, level.stop))
                positions = ops.tokens([base + depth - 1] * len(level))
                out, zs = self.head(pred[rows][None], tokens[-1][None], self.cache, mask, positions)
                pred, z = out[0], zs[0]
            previous = level
        self.fed = by_level[-1].start
        return Proposal(ops.tokens(ops.concatenate(tokens)), ops.concatenate(dists) if dists else None, parents,
                        ops.concatenate(qs) if qs else None)

    def _propose_auto(self, shape: TreeShape, params: SamplingParams, draft_probs: bool) -> Proposal:
        """An auto tree (``grow_tree``): a node's slot pairs its parent's predicted feature
        with its own token, as in a static tree."""
        ops = self.ops
        if not self.pending_tokens:
            return no_draft(ops)
        pred, z = self._run_pending()
        base = self.cache[0].offset
        features = {-1: pred}  # node -> the feature the head predicted at its slot

        def expand(ids: list[int], tree: GrowingTree) -> Any:
            parent_features = ops.concatenate([features[tree.parent[i]] for i in ids])
            mask = ops.from_numpy(tree.feed_mask(ids, base))
            positions = ops.tokens([base + tree.depth[i] - 1 for i in ids])
            out, zs = self.head(parent_features[None], ops.tokens([tree.tokens[i] for i in ids])[None], self.cache,
                                mask, positions)
            features.update({i: out[0, r : r + 1] for r, i in enumerate(ids)})
            return zs[0]

        tree = grow_tree(shape, z[None], expand, params, ops, to_tokens=lambda top: self.head.vocab_ids[top])
        self.fed = len(tree.fed)
        return auto_proposal(tree, shape, draft_probs, ops)[0]

    def commit(self, commit: Commit) -> None:
        if commit.hidden is None:
            raise ValueError("the eagle drafter needs the target's hidden states in every commit")
        # Slots run on predicted features (every fed draft) are dropped; the kept ones are
        # re-run with the target's real features on the next propose, in one call.
        rewind(self.cache, self.fed)
        self.fed = 0
        self.pending_features.append(self.ops.astype(commit.hidden, self.head.fc.weight))
        self.pending_tokens += commit.committed
