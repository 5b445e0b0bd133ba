"""The decoding loop. Yields ``Step`` events as tokens are committed, then one ``Done``.

MLX is lazy: each step builds its graph and the host waits once, for the values the next
decision needs. The loop calls its arrays' operations through ``ops`` (``core.ops`` for MLX,
``torchpath.ops`` for a torch target), so the same loop drives either backend.

Invariant: the target cache holds every committed token but the last, ``y``. A step feeds
[y, d_1..d_m] in one pass; row i of its logits judges d_{i+1} and row m gives the bonus. A
tree's nodes go in the same pass, each seeing only its ancestors, and afterwards the cache
keeps just the accepted path's rows.

A K policy (``--k auto``) learns acceptance step by step but this call's timings only when it
ends: K within a call then depends on the tokens alone, so a seed fixes a sampled reply (the
random draws follow the steps, and the steps follow K). Later calls plan with the timings.

Logits processors (penalties, logit bias: ``SamplingParams.processes``) and reported
log-probabilities are extra work on the rows of the same pass, evaluated with the step's one
sync; with neither asked for, the loop is what it was without them.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from dataclasses import replace

from types import ModuleType
from typing import Any

from mlxspec.core.cache import check_trimmable
from mlxspec.core.drafters import Commit, Drafter, FixedK, KPolicy, Proposal, can_branch, trait
from mlxspec.core.events import Done, Event, NodeStats, Status, Step, Token, Tree
from mlxspec.core.ops import ops_for
from mlxspec.core.prefill import Interrupted
from mlxspec.core.processors import emitted_logprobs, prefix_tails
from mlxspec.core.prompt_cache import PromptCache, Reuse
from mlxspec.core.sampling import GREEDY, CoupledKey, SamplingParams
from mlxspec.core.target import Target
from mlxspec.core.tree import TreeShape, first_line, path_to, verify_mask, verify_positions
from mlxspec.errors import MlxspecError

# A recurrent target (Mamba-style state) still decodes, one token at a time.
NOT_TRIMMABLE_HINT = "; decode it target-only (--draft none)"


def token_budget(prompt: list[int], max_tokens: int, context: int) -> tuple[int, str]:
    """How many tokens may be generated, and the stop reason once that many are; an error for
    a prompt that leaves no room."""
    if max_tokens <= 0:
        raise MlxspecError(f"--max-tokens must be > 0, got {max_tokens}")
    if not prompt:
        raise MlxspecError("the prompt is empty")
    if len(prompt) >= context:
        raise MlxspecError(f"prompt is {len(prompt)} tokens; the model's context is {context}")
    limit = min(max_tokens, context - len(prompt))
    return limit, "length" if limit == max_tokens else "context"


def generate_plain(
    model: Target,
    prompt: list[int],
    params: SamplingParams,
    max_tokens: int,
    stop_ids: set[int],
    context: int,
    seed: int = 0,
    kept: PromptCache | None = None,
    logprobs: int | None = None,
    interrupt: Callable[[], bool] | None = None,
) -> Iterator[Event]:
    """Target-only decoding. The next token is computed while the host handles the current one
    (``async_eval``), as mlx-lm does; the one extra step at the end is discarded. ``kept``: a
    cache from an earlier call to reuse, and to leave this call's cache in. ``logprobs`` and
    ``interrupt``: as ``generate``."""
    ops = ops_for(model)
    limit, at_limit = token_budget(prompt, max_tokens, context)
    reuse = kept.take(prompt[:-1], False) if kept else Reuse()
    cache, n_kept = reuse.cache if reuse.cache is not None else model.make_cache(), reuse.n
    key = ops.key(seed)

    def step(logits: Any, key: Any, tail: Any, position: int) -> tuple[Any, Any, tuple]:
        return _plain_step(ops, params, logprobs, logits, key, tail, (seed, position))

    t0 = time.perf_counter()
    first_tail = ops.tokens(prompt[-params.window:])[None] if params.processes else None
    y, key, y_lps = step(_prefill(ops, model, cache, prompt[:n_kept], prompt[n_kept:], kept, interrupt=interrupt),
                         key, first_tail, len(prompt))
    ops.async_evaluate(y, key, *_present(y_lps))
    n, reason, t_first, t_prev = 0, at_limit, None, None
    fed = list(prompt)  # what the cache holds once the pass in flight is done
    try:
        while n < limit:
            nxt, key, nxt_lps = step(model(y.reshape(1, 1), cache)[0, -1], key, _tail_after(ops, params, fed, y),
                                     len(fed) + 1)
            ops.async_evaluate(nxt, key, *_present(nxt_lps))
            tok = y.item()
            fed.append(tok)
            now = time.perf_counter()
            if t_first is None:
                t_first = t_prev = now
            if tok in stop_ids:
                reason = "eos"
                break
            n += 1
            token = Token(tok, Status.PLAIN)
            yield Step(_with_logprobs([token], y_lps, (), []), k=0, accepted=0, draft_ms=0.0,
                       verify_ms=(now - t_prev) * 1e3)
            t_prev = now
            y, y_lps = nxt, nxt_lps
    except Exception:
        kept = None  # a step that failed halfway leaves no cache worth keeping
        raise
    finally:  # also when the consumer stops early: at every yield the cache is consistent
        if kept is not None:
            kept.keep(cache, fed)
    end = time.perf_counter()
    ops.synchronize()  # the speculative next step is still running; finish it before we return
    yield Done(len(prompt), n, prefill_s=t_first - t0, decode_s=end - t_first, stop_reason=reason, steps=n)


def _plain_step(ops: ModuleType, params: SamplingParams, logprobs: int | None, logits: Any, key: Any,
                tail: Any, at: tuple[int, int]) -> tuple[Any, Any, tuple]:
    """Target-only decoding's next token from one row of logits (processed over ``tail`` when
    the processors read a window), the key to use next, and its log-probabilities if asked.
    ``at``: the seed and the token's position, for coupled sampling."""
    if tail is not None:
        logits = ops.process_logits(logits[None], tail, None, params)[0]
    if params.greedy:  # no randomness: skip the key split and its evaluation
        tok = ops.sample(logits, params, None)
    elif params.is_coupled:
        tok = ops.sample(ops.coupled_scores(logits[None], params, at[0], [at[1]])[0], GREEDY, None)
    else:
        key, sub = ops.split(key, 2)
        tok = ops.sample(logits, params, sub)
    lps = () if logprobs is None else ops.step_logprobs(logits[None], (), None, tok, logprobs)
    return tok, key, lps


def _tail_after(ops: ModuleType, params: SamplingParams, fed: list[int], last: Any) -> Any:
    """The processors' window for the position after ``last`` (lazy, not yet in ``fed``)."""
    if not params.processes:
        return None
    return ops.concatenate([ops.tokens(fed[max(0, len(fed) - params.window + 1):]), last.reshape(1)])[None]


def _present(arrays: tuple) -> list:
    """The arrays of ``step_logprobs``'s result that exist (it leaves None for what was not asked)."""
    return [a for a in arrays if a is not None]


def _with_logprobs(tokens: list[Token], lps: tuple, parents: tuple[int, ...], path: list[int]) -> list[Token]:
    """``tokens`` with each emitted one's log-probability (and alternatives) from ``lps``, the
    evaluated ``step_logprobs`` of its step (nothing when none were asked for). The emitted
    tokens are the path's then the target's own, in order, cut at a stop or the budget."""
    if not lps:
        return tokens
    values = iter(emitted_logprobs(lps, parents, path))
    out = []
    for t in tokens:
        if t.emitted:
            lp, top = next(values)
            t = replace(t, logprob=lp, top_logprobs=top)
        out.append(t)
    return out


def _tails(ops: ModuleType, history: list[int], drafted: list[int], parents: tuple[int, ...] | None,
           params: SamplingParams) -> tuple[Any, Any] | None:
    """The processors' windows for every row of a verify pass (``prefix_tails``), None when no
    processor is on."""
    if not params.processes:
        return None
    tails, real = prefix_tails(history, drafted, parents, params.window)
    return ops.from_numpy(tails), ops.from_numpy(real)


def _prefill(ops: ModuleType, model: Target, cache: list, held: list[int], ids: list[int], kept: PromptCache | None,
             want: bool | tuple[int, ...] = False, hidden: Any = None,
             interrupt: Callable[[], bool] | None = None) -> Any:
    """``ops.prefill`` of ``ids`` into a cache holding ``held``. Given up (``Interrupted``), the
    cache with the chunks it did prefill goes to ``kept``: the same prompt sent again (a client's
    retry) resumes there instead of starting over."""
    try:
        return ops.prefill(model, cache, ids, return_hidden=want, stop=interrupt)
    except Interrupted as stopped:
        if kept is not None:
            part = stopped.hidden if hidden is None or stopped.hidden is None else ops.concatenate([hidden, stopped.hidden])
            kept.keep(cache, held + ids[: stopped.done], part, want)
        raise


def _start(ops: ModuleType, model: Target, drafter: Drafter, prompt: list[int],
           kept: PromptCache | None, interrupt: Callable[[], bool] | None = None) -> tuple[list, Any]:
    """Prefill the target with all but the last prompt token (only those ``kept`` does not
    hold already), and the drafter with the prompt (and the target's hidden states of those
    tokens if it reads them). Returns the cache and those hidden states."""
    head, want = prompt[:-1], drafter.wants_hidden
    reuse = kept.take(head, want) if kept else Reuse()
    # A kept cache may come from target-only decoding of a model whose state cannot roll back.
    cache = check_trimmable(model.make_cache() if reuse.cache is None else reuse.cache, "the target",
                            NOT_TRIMMABLE_HINT)
    n, hidden = reuse.n, reuse.hidden
    if len(head) > n:
        out = _prefill(ops, model, cache, head[:n], head[n:], kept, want, hidden, interrupt)
        if want:
            hidden = out[1] if hidden is None else ops.concatenate([hidden, out[1]])
        ops.evaluate([c.state for c in cache], hidden)
    drafter.reset(prompt, hidden)
    return cache, hidden


def _verify(ops: ModuleType, model: Target, cache: list, y: int, proposal: Proposal, params: SamplingParams,
            key: Any, want_hidden: bool | tuple[int, ...], tails: tuple[Any, Any] | None,
            at: tuple[int, int]) -> tuple[Any, Any, Any, Any]:
    """One target pass over [y, d_1..d_m]: how many drafts it keeps, its next token, and its
    hidden states and (processed, with ``tails``) logits of the pass (lazy). ``at``: the seed
    and the position of the token the first row draws, for coupled sampling."""
    draft = proposal.tokens
    out = model(ops.concatenate([ops.tokens([y]), draft])[None], cache,
                **({"return_hidden": want_hidden} if want_hidden else {}))
    logits, hidden = (out[0][0], out[1][0]) if want_hidden else (out[0], None)
    if tails is not None:
        logits = ops.process_logits(logits, *tails, params)
    if params.greedy:
        n_acc, nxt = ops.greedy_verify(draft, logits)
    elif params.is_coupled:  # a draft is kept where it is the target's own coupled draw
        seed, first = at
        n_acc, nxt = ops.greedy_verify(draft, ops.coupled_scores(logits, params, seed,
                                                                  range(first, first + logits.shape[0])))
    else:
        p = ops.probs(logits, params)
        # A chain sampled from q is judged as a block; a lookup's point masses token by token
        # (the same rule then).
        rule = ops.block_verify if params.block_verify and proposal.q is not None else ops.rejection_verify
        n_acc, nxt = rule(draft, ops.pad_vocab(proposal.q, p.shape[-1]), p, key)
    return n_acc, nxt, hidden, logits


def _verify_tree(ops: ModuleType, model: Target, cache: list, offset: int, y: int, proposal: Proposal,
                 params: SamplingParams, key: Any, want_hidden: bool | tuple[int, ...],
                 tails: tuple[Any, Any] | None, seed: int) -> tuple[Any, Any, Any, Any]:
    """One target pass over [y, tree nodes], ``offset`` committed tokens cached before y: the
    last accepted node (-1: none), the next token and the hidden states and logits of the pass
    (lazy).
    Each node sees the context and its ancestors only, at the position its depth gives it."""
    parents = proposal.parents
    mask, positions = verify_mask(parents, offset), verify_positions(parents, offset)
    out = model(ops.concatenate([ops.tokens([y]), proposal.tokens])[None], cache,
                mask=ops.from_numpy(mask), positions=ops.from_numpy(positions),
                **({"return_hidden": want_hidden} if want_hidden else {}))
    logits, hidden = (out[0][0], out[1][0]) if want_hidden else (out[0], None)
    if tails is not None:  # row 1 + i with node i's own ancestry
        logits = ops.process_logits(logits, *tails, params)
    if params.greedy:
        last, nxt = ops.tree_greedy_verify(proposal.tokens, parents, logits)
    elif params.is_coupled:  # each row draws the token one past its own position
        scores = ops.coupled_scores(logits, params, seed, [int(p) + 1 for p in positions])
        last, nxt = ops.tree_greedy_verify(proposal.tokens, parents, scores)
    elif proposal.q is not None:  # children sampled from q: multi-round rejection
        p = ops.probs(logits, params)
        last, nxt = ops.tree_residual_verify(proposal.tokens, parents, ops.pad_vocab(proposal.q, p.shape[-1]), p, key)
    else:
        last, nxt = ops.tree_sample_verify(proposal.tokens, parents, ops.probs(logits, params), key)
    return last, nxt, hidden, logits


def _check_tree(model: Target, drafter: Drafter, shape: TreeShape, prompt: list[int], context: int) -> None:
    """Refuse, before any work, a tree the target cannot verify, the drafter cannot draft, or
    the context cannot hold."""
    caps = getattr(model, "capabilities", None)
    if caps is not None and not caps.tree_masks:
        raise MlxspecError("this target cannot verify a draft tree (it takes no tree attention mask: it runs "
                           "through mlx-lm's own class); speculate with a chain (--k) instead of --tree")
    if not can_branch(drafter):
        raise MlxspecError(f"drafter {drafter.name!r} cannot branch: --tree needs a drafter that drafts trees")
    if shape.sampled and not trait(drafter, "samples_children"):
        raise MlxspecError(f"drafter {drafter.name!r} cannot sample a tree's children (it has no distribution to "
                           f"draw them from): drop ':sample' from --tree {shape}")
    if len(prompt) + shape.nodes >= context:
        raise MlxspecError(f"a {shape} tree of {shape.nodes} nodes does not fit in the model's context of {context} "
                           f"after the {len(prompt)}-token prompt; use a smaller --tree or --tree-nodes")


def _stats_of(stats: tuple, node_q: Any) -> NodeStats | None:
    """The evaluated ``_node_stats`` (and the drafter's probabilities) as plain values."""
    if not stats:
        return None
    entropy, p_target, top = (tuple(x.tolist()) for x in stats)
    return NodeStats(entropy, p_target, top, None if node_q is None else tuple(node_q.tolist()))


def _rows_of(ops: ModuleType, hidden: Any, path: list[int]) -> Any:
    """The hidden states of y and the accepted nodes, out of a pass over [y, drafts]."""
    if hidden is None:
        return None
    if path == list(range(len(path))):
        return hidden[: len(path) + 1]
    return hidden[ops.tokens([0] + [1 + i for i in path])]


def _step_tokens(kept: list[int], refused: list[int], y: int, stop_ids: set[int], budget: int) -> tuple[list[Token], bool]:
    """The tokens a step shows, with their status: accepted drafts, the refused ones struck
    through just before the target's own token, cut at a stop token or after ``budget`` emitted
    tokens. Also whether a stop token ended it."""
    n = len(kept)
    last = Status.PLAIN if not kept and not refused else Status.CORRECTED if refused else Status.BONUS
    tokens: list[Token] = []
    stop = False
    for tok, st in zip(kept + [y], [Status.ACCEPTED] * n + [last]):
        if tok in stop_ids:
            stop = True
            break
        tokens.append(Token(tok, st))
        if len(tokens) == budget:
            break
    if refused and len(tokens) > n:
        tokens[n:n] = [Token(d, Status.REJECTED) for d in refused]
    return tokens, stop


def generate(model: Target, prompt: list[int], params: SamplingParams, max_tokens: int, stop_ids: set[int],
             context: int, seed: int = 0, drafter: Drafter | None = None, k: int | KPolicy = 4,
             kept: PromptCache | None = None, tree: TreeShape | None = None, node_stats: bool = False,
             logprobs: int | None = None, interrupt: Callable[[], bool] | None = None) -> Iterator[Event]:
    """Speculative decoding with ``drafter`` (target-only decoding without one), drafting ``k``
    tokens a step, or as many as a ``KPolicy`` asks for each step, or a ``tree`` of that shape.
    ``kept``: a cache from an earlier call (a chat's last turn) to reuse, and to leave this
    call's cache in, with the hidden states of its tokens when the drafter reads them.
    ``node_stats``: give every step's tree its ``NodeStats`` (for ``mlxspec study``).
    ``logprobs``: None, or give every emitted ``Token`` the target's log-probability of it and
    its ``logprobs`` most likely alternatives (0: none), from the verify pass. ``interrupt``: asked
    between the prompt's chunks; True gives it up (``prefill.Interrupted``; see ``_prefill``)."""
    if drafter is None:
        yield from generate_plain(model, prompt, params, max_tokens, stop_ids, context, seed, kept, logprobs, interrupt)
        return
    limit, reason = token_budget(prompt, max_tokens, context)
    if tree is not None:
        _check_tree(model, drafter, tree, prompt, context)
    policy, ops, t0 = FixedK(k) if isinstance(k, int) else k, ops_for(model), time.perf_counter()
    cache, prompt_hidden = _start(ops, model, drafter, prompt, kept, interrupt)
    history, key = list(prompt), ops.key(seed)  # the cache holds history[:-1]
    # the hidden states of what the cache holds, for ``kept``, when the drafter reads them
    held_hidden = [prompt_hidden] if kept is not None and prompt_hidden is not None else None
    emitted, accepted_lengths, t_first, timings = 0, [], None, []
    try:
        while emitted < limit:
            key, draft_key, verify_key = ops.split(key, 3)
            # Never draft past what may still be emitted: the verify pass adds one token itself.
            room = max(0, min(tree.depth if tree else policy.next_k(), limit - emitted - 1))
            proposal, draft_ms = _draft(ops, drafter, history, room, tree, params, draft_key, seed, node_stats)
            drafted, t_drafted = proposal.tokens.tolist(), time.perf_counter()  # evaluated by _draft
            path, y, hidden, stats, lps = _decide(ops, model, cache, history, proposal, drafted, params, verify_key,
                                                  drafter.wants_hidden, node_stats, logprobs, seed)
            verify_ms = ((t_verified := time.perf_counter()) - t_drafted) * 1e3
            policy.observe(len(drafted), len(path))
            timings.append((draft_ms, verify_ms, len(drafted)))
            kept_hidden = _commit(ops, cache, drafter, history, proposal, drafted, path, y, hidden)
            if held_hidden is not None:
                held_hidden.append(kept_hidden)
            accepted_lengths.append(len(path))
            tokens, shown, stop = _shown(proposal, drafted, path, y, stats, lps, stop_ids, limit - emitted)
            emitted += sum(t.emitted for t in tokens)
            t_first = t_first or t_verified
            yield Step(tokens, k=len(drafted), accepted=len(path), draft_ms=draft_ms, verify_ms=verify_ms,
                       room=room, tree=shown, drafter=(trait(drafter, "proposer") or drafter.name) if drafted else None)
            if stop:
                reason = "eos"
                break
    except Exception:
        kept = None  # a step that failed halfway leaves no cache worth keeping
        raise
    finally:  # also when the consumer stops early: at every yield the cache holds history[:-1]
        if kept is not None:
            kept.keep(cache, history[:-1], ops.concatenate(held_hidden) if held_hidden else None,
                      drafter.wants_hidden)
        for i, (d, v, n) in enumerate(timings):  # only now: K follows the seed, not the clock (module docstring)
            policy.observe_timing(d if i else math.nan, v, n)  # a first draft also reads the prompt's features
    end = time.perf_counter()
    yield Done(len(prompt), emitted, prefill_s=(t_first or end) - t0, decode_s=end - (t_first or end),
               stop_reason=reason, steps=len(accepted_lengths), accepted_lengths=accepted_lengths)


def _drawn_with(params: SamplingParams, tree: TreeShape | None, key: Any, seed: int,
                position: int) -> tuple[SamplingParams, Any]:
    """The sampling and key a step's drafts are drawn with. Coupled, a chain's drafts take the
    noise the target draws their positions with (``CoupledKey``): a draft then hits the target's
    draw wherever q and p agree on the noisy argmax, not only where p's argmax happens to win."""
    if not params.is_coupled:
        return params, key
    return (params.for_tree_drafts(), key) if tree is not None else (params, CoupledKey(seed, position))


def _draft(ops: ModuleType, drafter: Drafter, history: list[int], room: int, tree: TreeShape | None,
           params: SamplingParams, key: Any, seed: int, node_stats: bool) -> tuple[Proposal, float]:
    """The drafter's chain of ``room`` tokens, or its tree cut to ``room`` levels, evaluated (a
    sync of its own only so that draft and verify time are reported apart), and the
    milliseconds it took. Under coupling, drawn as ``_drawn_with`` says."""
    t0 = time.perf_counter()
    params, key = _drawn_with(params, tree, key, seed, len(history))
    if tree is None:
        proposal = drafter.propose(history, room, params, key)
    else:
        proposal = drafter.propose_tree(history, tree.cut(room), params, key,
                                        **({"draft_probs": True} if node_stats else {}))
    ops.evaluate(proposal.tokens, proposal.q, proposal.node_q)
    return proposal, (time.perf_counter() - t0) * 1e3


def _decide(ops: ModuleType, model: Target, cache: list, history: list[int], proposal: Proposal,
            drafted: list[int], params: SamplingParams, key: Any, want_hidden: bool | tuple[int, ...], node_stats: bool,
            logprobs: int | None, seed: int) -> tuple[list[int], int, Any, tuple, tuple]:
    """One target pass over [y, proposal] (y = ``history[-1]``, not yet cached): the accepted
    path (indices into the proposal), the target's next token, the pass's hidden states (lazy),
    with ``node_stats`` each node's statistics and with ``logprobs`` the evaluated
    ``step_logprobs``. The step's one sync for the decision."""
    y = history[-1]
    tails = _tails(ops, history, drafted, proposal.parents, params)
    if proposal.is_chain:
        decided, nxt, hidden, logits = _verify(ops, model, cache, y, proposal, params, key, want_hidden, tails,
                                               (seed, len(history)))
    else:
        decided, nxt, hidden, logits = _verify_tree(ops, model, cache, len(history) - 1, y, proposal, params, key,
                                                    want_hidden, tails, seed)
    stats = ops.node_stats(logits, proposal.tokens, proposal.parents, params) if node_stats and proposal.parents else ()
    lps = () if logprobs is None else ops.step_logprobs(logits, proposal.tree_parents, proposal.tokens, nxt, logprobs)
    ops.evaluate(decided, nxt, *stats, *_present(lps))
    path = list(range(decided.item())) if proposal.is_chain else path_to(proposal.parents, decided.item())
    return path, nxt.item(), hidden, stats, lps


def _commit(ops: ModuleType, cache: list, drafter: Drafter, history: list[int], proposal: Proposal,
            drafted: list[int], path: list[int], y: int, hidden: Any) -> Any:
    """Keep the accepted path: the cache keeps y and the path's rows, the drafter learns what was
    accepted, ``history`` grows by the path and the target's token. Returns the kept rows'
    hidden states (None when the drafter reads none)."""
    ops.keep_rows(cache, len(history), path)
    kept_hidden = _rows_of(ops, hidden, path)
    drafter.commit(Commit(drafted, len(path), y, kept_hidden, None if proposal.is_chain else tuple(path)))
    history += [drafted[i] for i in path] + [y]
    return kept_hidden


def _shown(proposal: Proposal, drafted: list[int], path: list[int], y: int, stats: tuple, lps: tuple,
           stop_ids: set[int], budget: int) -> tuple[list[Token], Tree | None, bool]:
    """What a step shows: its tokens (the refused drafts struck through, as far as the drafter
    would have continued below the path; with their log-probabilities from ``lps`` when asked
    for), its tree if it drafted one, and whether it stopped."""
    refused = first_line(proposal.tree_parents, path[-1] if path else -1)
    tokens, stop = _step_tokens([drafted[i] for i in path], [drafted[i] for i in refused], y, stop_ids, budget)
    tokens = _with_logprobs(tokens, lps, proposal.tree_parents, path)
    shown = None if proposal.parents is None else Tree(tuple(drafted), proposal.parents, tuple(path),
                                                       _stats_of(stats, proposal.node_q))
    return tokens, shown, stop
