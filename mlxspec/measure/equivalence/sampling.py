"""The sampling check: about ``tokens`` new tokens sampled with target-only decoding and as many
with speculative decoding over the same prompts (one sequence per prompt per method per round,
with different seeds), then the homogeneity test of the two samples (``homogeneity``)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import numpy as np

from mlxspec.core.sampling import SamplingParams
from mlxspec.errors import MlxspecError
from mlxspec.measure.equivalence.homogeneity import (
    ALPHA,
    EOS_BIN,
    MAX_BINS,
    MIN_POOLED_COUNT,
    PERMUTATIONS,
    Homogeneity,
    Sample,
    homogeneity,
)
from mlxspec.measure.equivalence.inputs import (
    METHODS,
    MT_BENCH_FILE,
    MethodTotals,
    VerifyOptions,
    checked_drafter,
    load_model,
    result_header,
    verify_prompts,
)
from mlxspec.measure.runs import engine_run
from mlxspec.targets.tokenizer import encode_prompt, stop_token_ids

Progress = Callable[[int, int, str], Any] | None


def _sample_rounds(lm, drafter, items: list[dict[str, Any]], ids: list[list[int]], o: VerifyOptions,
                   progress: Progress) -> Sample:
    """Round r: the next prompt, one sequence per method (seeds ``seed * 1_000_003 + 2r`` and
    ``+ 1``), until both methods have at least ``o.tokens`` tokens."""
    params = SamplingParams(temperature=o.temp, top_p=o.top_p)
    stop = stop_token_ids(lm.tokenizer)
    sample = Sample({m: [] for m in METHODS}, {m: MethodTotals(m == "speculative") for m in METHODS}, Counter())
    while min(t.tokens for t in sample.tallies.values()) < o.tokens:
        r, j = sample.rounds, sample.rounds % len(items)
        for method in METHODS:
            run = engine_run(lm, ids[j], params, o.max_tokens_per_prompt, stop,
                             o.seed * 1_000_003 + 2 * r + (method == "speculative"),
                             drafter if method == "speculative" else None, o.k)
            sample.tallies[method].add(run)
            sample.seqs[method].append(run.tokens + ([EOS_BIN] if run.stop_reason == "eos" else []))
            if progress is not None:
                done = sum(min(t.tokens, o.tokens) for t in sample.tallies.values())
                progress(done, 2 * o.tokens, f"{method.replace('_', '-')} · {items[j]['category']} #{items[j]['id']}")
        sample.used[j] += 1
        sample.rounds += 1
    return sample


def _bins(tokenizer, bin_ids: list[int], table: np.ndarray) -> list[dict[str, Any]]:
    bins = [{"id": int(i), "text": "<eos>" if i == EOS_BIN else tokenizer.decode([int(i)]),
             "target_only": int(a), "speculative": int(b)} for i, a, b in zip(bin_ids, table[0], table[1])]
    if table.shape[1] > len(bin_ids):
        bins.append({"id": None, "text": "<other>", "target_only": int(table[0, -1]), "speculative": int(table[1, -1])})
    return bins


def _settings(o: VerifyOptions, items: list[dict[str, Any]]) -> dict[str, Any]:
    return {"tokens": o.tokens, "temperature": o.temp, "top_p": o.top_p,
            "max_tokens_per_prompt": o.max_tokens_per_prompt, "seed": o.seed, "max_bins": MAX_BINS,
            "min_pooled_count": MIN_POOLED_COUNT,
            "prompt_source": MT_BENCH_FILE if items[0]["category"] != "builtin" else "builtin"}


def _sampling_result(lm, o: VerifyOptions, items: list[dict[str, Any]], ids: list[list[int]], sample: Sample,
                     h: Homogeneity) -> dict[str, Any]:
    counts = Counter(tok for m in METHODS for seq in sample.seqs[m] for tok in seq)
    return {
        "check": "sampling", **result_header(lm, o.draft, o.k), "settings": _settings(o, items),
        "prompts_used": [{"id": items[j]["id"], "category": items[j]["category"], "prompt_tokens": len(ids[j]),
                          "rounds": sample.used[j]} for j in sorted(sample.used)],
        "target_only": sample.tallies["target_only"].to_json(), "speculative": sample.tallies["speculative"].to_json(),
        "distinct_ids": len(counts), "bins": _bins(lm.tokenizer, h.bin_ids, h.table),
        "chi2": h.chi2, "dof": h.dof, "p": h.p, "p_permutation": h.p_permutation, "permutations": PERMUTATIONS,
        "permutation_null_mean": float(h.null.mean()),  # vs dof: how much within-sequence dependence inflates chi2
        "permutation_null_q99": float(np.quantile(h.null, 0.99)),
        "alpha": ALPHA, "passed_asymptotic": bool(h.p > ALPHA), "passed": bool(h.p_permutation > ALPHA),
        "decided_by": "p_permutation",
        "note": ("p is chi2_contingency's asymptotic p-value, which assumes independent tokens; tokens of one "
                 "sequence are not, so pass/fail uses p_permutation (paired sequence-level label swaps)"),
    }


def sampling_check(options: VerifyOptions, progress: Progress = None, keep_sequences: bool = False) -> dict[str, Any]:
    """Two-sample chi-squared test: token histograms of target-only vs speculative sampling,
    rounds going on until both methods have at least ``options.tokens`` tokens. Result keys:
    check, the run header's, draft, k, settings, prompts_used, target_only and speculative
    (``MethodTotals``), distinct_ids, bins, chi2, dof, p (asymptotic), p_permutation,
    permutations, permutation_null_mean/_q99, alpha, passed_asymptotic, passed (p_permutation
    > alpha), decided_by, note; with ``keep_sequences`` also every round's token ids."""
    o = options
    if SamplingParams(temperature=o.temp, top_p=o.top_p).greedy:
        raise MlxspecError("the sampling check needs temperature > 0 (greedy is greedy_check)")
    if o.tokens < 1 or o.max_tokens_per_prompt < 1:
        raise MlxspecError("tokens and max_tokens_per_prompt must be >= 1")
    lm = load_model(o.model)
    drafter = checked_drafter(o.draft, lm)
    items = verify_prompts()
    ids = [encode_prompt(lm.tokenizer, it["text"]) for it in items]
    sample = _sample_rounds(lm, drafter, items, ids, o, progress)
    result = _sampling_result(lm, o, items, ids, sample, homogeneity(sample, o.seed))
    return {**result, "sequences": sample.seqs} if keep_sequences else result
