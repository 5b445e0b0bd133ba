"""The greedy check: greedy speculative output must equal greedy target-only output token for
token (end-of-sequence ignored, so every prompt compares exactly the tokens asked for). At a
divergence the target runs the common prefix in one fresh pass: if both tokens' logits are within
``NEAR_TIE`` of the maximum the two paths merely broke a floating-point near-tie differently
(batched verification and one-token decoding round differently); otherwise it is a mismatch."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import mlx.core as mx
import numpy as np

from mlxspec.core.prefill import prefill
from mlxspec.core.sampling import SamplingParams
from mlxspec.errors import MlxspecError
from mlxspec.measure.equivalence.inputs import (
    METHODS,
    MethodTotals,
    VerifyOptions,
    checked_drafter,
    load_model,
    result_header,
    verify_prompts,
)
from mlxspec.measure.runs import engine_run, first_mismatch
from mlxspec.targets.tokenizer import encode_prompt

NEAR_TIE = 1e-3  # logit gap below which a greedy divergence is a floating-point near-tie

Progress = Callable[[int, int, str], Any] | None


def _divergence(lm, prefix: list[int], plain_tok: int, spec_tok: int) -> dict[str, Any]:
    """The target's logits after ``prefix`` (one fresh pass): top-2 gap and where the two
    diverging tokens stand."""
    logits = prefill(lm.model, lm.model.make_cache(), prefix).astype(mx.float32)
    lg = np.array(logits, dtype=np.float64)
    order = np.argsort(-lg, kind="stable")
    top = lg[order[0]]
    rank = {int(t): int(np.flatnonzero(order == t)[0]) for t in (plain_tok, spec_tok)}
    below_plain, below_spec = top - lg[plain_tok], top - lg[spec_tok]
    near = bool(max(below_plain, below_spec) < NEAR_TIE)
    return {
        "top2_gap": float(lg[order[0]] - lg[order[1]]),
        "top_token": int(order[0]),
        "plain_below_top": float(below_plain),
        "spec_below_top": float(below_spec),
        "plain_rank": rank[int(plain_tok)],
        "spec_rank": rank[int(spec_tok)],
        "classification": "near_tie" if near else "mismatch",
    }


def greedy_check(options: VerifyOptions, progress: Progress = None) -> dict[str, Any]:
    """Greedy speculative output == greedy target-only output, token for token, on the first
    ``options.prompts`` verify prompts (cycled if more are asked for) x exactly
    ``options.greedy_tokens`` tokens. Result keys: check, the run header's, draft, k, settings,
    results[{id, category, prompt_tokens, tokens, identical, classification ("identical" |
    "near_tie" | "mismatch"), diverged_at, ...}], summary{prompts, identical, near_ties,
    mismatches, tokens_compared, tokens_agreeing}, target_only, speculative, passed."""
    o = options
    if o.prompts < 1 or o.greedy_tokens < 1:
        raise MlxspecError("prompts and tokens must be >= 1")
    lm = load_model(o.model)
    drafter = checked_drafter(o.draft, lm)
    items = verify_prompts()
    params = SamplingParams()  # greedy
    results = []
    tallies = {m: MethodTotals(m == "speculative") for m in METHODS}
    done = 0
    for i in range(o.prompts):
        it = items[i % len(items)]
        ids = encode_prompt(lm.tokenizer, it["text"])
        n = min(o.greedy_tokens, lm.context_length - len(ids))
        outs = {}
        for method in METHODS:
            run = engine_run(lm, ids, params, n, set(), 0, drafter if method == "speculative" else None, o.k)
            tallies[method].add(run)
            outs[method] = run.tokens
            done += n
            if progress is not None:
                progress(done, 2 * o.prompts * o.greedy_tokens,
                         f"greedy {method.replace('_', '-')} · {it['category']} #{it['id']}")
        results.append(_greedy_row(lm, it, ids, outs["target_only"], outs["speculative"]))
    return _greedy_result(lm, o, results, tallies)


def _greedy_row(lm, it: dict[str, Any], ids: list[int], a: list[int], b: list[int]) -> dict[str, Any]:
    """One prompt's comparison: identical, a floating-point near-tie, or a real mismatch."""
    row: dict[str, Any] = {"id": it["id"], "category": it["category"], "prompt_tokens": len(ids),
                           "tokens": len(a), "identical": a == b}
    at = first_mismatch(a, b)
    if at is None:
        return {**row, "classification": "identical", "diverged_at": None, "agreeing": len(a)}
    if at == min(len(a), len(b)):  # one is a strict prefix of the other: lengths differ, an engine bug
        return {**row, "diverged_at": at, "classification": "mismatch", "agreeing": at,
                "reason": f"lengths differ: target-only {len(a)}, speculative {len(b)}"}
    return {**row, "diverged_at": at, "target_token": a[at], "spec_token": b[at],
            "target_text": lm.tokenizer.decode([a[at]]), "spec_text": lm.tokenizer.decode([b[at]]), "agreeing": at,
            **_divergence(lm, ids + a[:at], a[at], b[at])}


def _greedy_result(lm, o: VerifyOptions, results: list[dict[str, Any]],
                   tallies: dict[str, MethodTotals]) -> dict[str, Any]:
    classes = Counter(r["classification"] for r in results)
    return {
        "check": "greedy",
        **result_header(lm, o.draft, o.k),
        "settings": {"prompts": o.prompts, "tokens": o.greedy_tokens, "near_tie": NEAR_TIE, "stop_on_eos": False},
        "results": results,
        "summary": {"prompts": o.prompts, "identical": classes["identical"], "near_ties": classes["near_tie"],
                    "mismatches": classes["mismatch"], "tokens_compared": tallies["target_only"].tokens,
                    "tokens_agreeing": sum(r["agreeing"] for r in results)},
        "target_only": tallies["target_only"].to_json(),
        "speculative": tallies["speculative"].to_json(),
        "passed": classes["mismatch"] == 0,
    }
