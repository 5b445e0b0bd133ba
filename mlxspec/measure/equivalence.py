"""Real-model distribution equivalence (level c of the design's three levels): ``mlxspec verify``.

Two checks on the real target, both against target-only decoding with the same weights:

* ``sampling_check``: sample about ``tokens`` new tokens with target-only decoding and as many
  with speculative decoding, over the same prompts (MT-Bench first turns, cycled; one sequence
  per prompt per method per round, with different seeds), then a two-sample chi-squared test of
  homogeneity on the pooled token histograms. Bins: the most frequent token ids of the pooled
  sample, at most ``MAX_BINS`` (200) and only ids counted at least ``MIN_POOLED_COUNT`` (10)
  times in the pooled sample, plus one "other" bin for everything else; so dof = number of bins
  - 1 = number of named ids. Sequences that end at a stop token count one pseudo-token
  ``EOS_BIN`` (-1, shown as "<eos>"), so when a sequence ends is tested too. The full run
  (9,200 tokens per method) gets the full 200 ids (dof 200, as in the source study); the quick
  run (600 tokens) gets fewer (about 15), every cell then still expected at >= ~5 counts per
  method, as the chi-squared approximation needs.

  Reported: chi2, dof and p from ``scipy.stats.chi2_contingency`` (comparable with the study's
  chi2 = 162.5, dof = 200, p = 0.976). That p assumes independent tokens; tokens of one
  sequence are not (one answer full of quotes or code indentation fills a bin by itself), which
  makes it too small, badly so with few sequences (the quick run has ~13 per method). So the
  verdict uses ``p_permutation``: the same statistic under random swaps of the method labels
  of the two sequences of each round (same prompt), exact under the null whatever the
  dependence within a sequence. Passes iff p_permutation > ``ALPHA`` (0.01); the asymptotic
  verdict is reported as ``passed_asymptotic``.

* ``greedy_check``: greedy speculative output must equal greedy target-only output token for
  token (end-of-sequence ignored, so every prompt compares exactly ``tokens`` tokens). At a
  divergence the target is run on the common prefix in one fresh pass: if both tokens' logits
  are within ``NEAR_TIE`` (1e-3) of the maximum (so the top-2 gap is below it too) the two
  paths merely broke a floating-point near-tie differently (batched verification and one-token
  decoding round differently); otherwise it is a real mismatch. Passes iff no real mismatch.

Both return JSON-serialisable dicts; ``print_verify`` renders either or both
(``{"sampling": ..., "greedy": ...}``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import numpy as np

from mlxspec.measure.runs import (
    Run,
    data_dir,
    engine_run,
    fallback_prompts,
    first_mismatch,
    jsonl_rows,
    run_header,
)
from mlxspec.measure.verdict import Kind, markup

ALPHA = 0.01  # the sampling check passes iff its permutation p-value > ALPHA
MAX_BINS = 200  # named token ids at most (dof = number of named ids)
MIN_POOLED_COUNT = 10  # a token id gets its own bin only if counted this often in the pooled sample
NEAR_TIE = 1e-3  # logit gap below which a greedy divergence is a floating-point near-tie
PERMUTATIONS = 10_000  # label swaps for the sequence-level permutation p-value
EOS_BIN = -1  # pseudo token id counted once per sequence that ended at a stop token
MT_BENCH_FILE = "mt_bench_questions.jsonl"

# What the CLI's --quick runs (CI). With draft ngram:3: ~100 s on a shared 2-core Linux CPU
# (1,200 sampled + 144 greedy tokens at ~14 tok/s); self:L drafters are slower there (they accept little).
QUICK_SAMPLING = {"tokens": 600, "max_tokens_per_prompt": 48}
QUICK_GREEDY = {"prompts": 3, "tokens": 24}

Progress = Callable[[int, int, str], Any] | None


# ----------------------------------------------------------------------------- inputs


def verify_prompts() -> list[dict[str, Any]]:
    """[{id, category, text}]: MT-Bench first turns, interleaved across categories (one of each
    category, then the second of each, ...) so that any prefix of the list is varied. Falls back
    to the benchmark's built-in prompts when the shared data folder is missing."""
    path = data_dir() / MT_BENCH_FILE
    by_cat: dict[str, list[dict[str, Any]]] = {}
    if path.is_file():
        for row in jsonl_rows(path):
            if row.get("turns"):
                cat = row.get("category", "mt_bench")
                by_cat.setdefault(cat, []).append({"id": row.get("question_id"), "category": cat,
                                                   "text": row["turns"][0]})
    if not by_cat:
        return fallback_prompts()
    out: list[dict[str, Any]] = []
    lists = list(by_cat.values())
    for i in range(max(len(v) for v in lists)):
        out += [v[i] for v in lists if i < len(v)]
    return out


def _load(model_spec):
    """A registry name / path, or an already loaded ``LoadedModel`` (tests reuse theirs)."""
    from mlxspec.targets import loading

    return model_spec if isinstance(model_spec, loading.LoadedModel) else loading.load(model_spec)


def _drafter(draft: str, lm):
    from mlxspec.errors import MlxspecError
    from mlxspec.targets.drafts import make_drafter

    d = make_drafter(draft, lm)
    if d is None:
        raise MlxspecError("verify compares speculative decoding with target-only decoding: give a drafter, not 'none'")
    return d


@dataclass
class MethodTotals:
    """What one method produced over a check: tokens, sequences, steps, drafts, time."""

    speculative: bool
    tokens: int = 0
    sequences: int = 0
    steps: int = 0
    drafted: int = 0
    accepted: int = 0
    elapsed_s: float = 0.0
    eos: int = 0

    def add(self, run: Run) -> None:
        self.tokens += run.generated_tokens
        self.sequences += 1
        self.steps += run.steps
        self.drafted += sum(run.drafted)
        self.accepted += sum(run.accepted)
        self.elapsed_s += run.total_s
        self.eos += run.stop_reason == "eos"

    def to_json(self) -> dict[str, Any]:
        """tokens/s, and for speculative runs: acceptance rate (accepted / drafted), tau (mean
        accepted draft tokens per step) and tokens per step (mean emitted per target pass)."""
        el = self.elapsed_s
        d = {"tokens": self.tokens, "sequences": self.sequences, "eos": self.eos, "elapsed_s": el,
             "tokens_per_s": self.tokens / el if el > 0 else 0.0}
        if not (self.drafted or self.speculative):
            return d
        steps = max(self.steps, 1)
        return {**d, "steps": self.steps, "drafted": self.drafted, "accepted": self.accepted,
                "acceptance_rate": self.accepted / self.drafted if self.drafted else 0.0,
                "tau": self.accepted / steps, "tokens_per_step": self.tokens / steps}


def _header(lm, draft: str, k: int) -> dict[str, Any]:
    return {**run_header(lm).to_json(), "draft": draft, "k": k}


# ----------------------------------------------------------------------------- sampling check


def contingency_bins(plain: Counter, spec: Counter, max_bins: int = MAX_BINS,
                     min_count: int = MIN_POOLED_COUNT) -> tuple[list[int], np.ndarray]:
    """The named token ids (most frequent in the pooled sample first, ties by id) and the
    2 x (len(ids) + 1) table of counts, last column "other". The "other" column is dropped when
    it is empty in both rows."""
    pooled = plain + spec
    ranked = sorted((i for i, c in pooled.items() if c >= min_count), key=lambda i: (-pooled[i], i))
    ids = ranked[:max_bins]
    rows = []
    for c in (plain, spec):
        named = [c.get(i, 0) for i in ids]
        rows.append(named + [sum(c.values()) - sum(named)])
    table = np.array(rows, dtype=np.int64)
    if table[:, -1].sum() == 0:
        table = table[:, :-1]
    return ids, table


def _chi2_stat(rows0: np.ndarray, col_tot: np.ndarray) -> np.ndarray:
    """Pearson chi2 of 2 x B tables given row 0 (P, B) and the fixed column totals (B,)."""
    rows1 = col_tot - rows0
    n = col_tot.sum()
    stat = np.zeros(rows0.shape[0])
    for row in (rows0, rows1):
        expected = row.sum(axis=1, keepdims=True) * col_tot / n
        stat += ((row - expected) ** 2 / expected).sum(axis=1)
    return stat


def permutation_null(plain_seqs: np.ndarray, spec_seqs: np.ndarray, permutations: int = PERMUTATIONS,
                     seed: int = 0) -> np.ndarray:
    """The chi2 statistic under ``permutations`` random label swaps, paired by round.

    ``plain_seqs``/``spec_seqs``: (R, B) binned counts of each round's target-only and
    speculative sequence (same prompt). Under the null the two sequences of a round are
    exchangeable, so swapping their labels at random gives the null distribution of the
    statistic, whatever the dependence between the tokens of one sequence (which makes the
    asymptotic chi2 p-value too small when a few sequences dominate some bins)."""
    rng = np.random.default_rng(seed)
    a, d = plain_seqs.sum(axis=0), (spec_seqs - plain_seqs).astype(np.float64)
    col_tot = (plain_seqs + spec_seqs).sum(axis=0).astype(np.float64)
    out = []
    for start in range(0, permutations, 1000):
        swap = rng.random((min(1000, permutations - start), len(d))) < 0.5
        out.append(_chi2_stat(a + swap @ d, col_tot))
    return np.concatenate(out)


def permutation_p(plain_seqs: np.ndarray, spec_seqs: np.ndarray, observed: float,
                  permutations: int = PERMUTATIONS, seed: int = 0) -> float:
    """(1 + #{null >= observed}) / (1 + permutations) over ``permutation_null``."""
    null = permutation_null(plain_seqs, spec_seqs, permutations, seed)
    return (int((null >= observed * (1 - 1e-12)).sum()) + 1) / (permutations + 1)


METHODS = ("target_only", "speculative")


@dataclass
class Sample:
    """The sequences each method sampled, round by round (``EOS_BIN`` appended to a sequence
    that ended at a stop token: when a sequence ends is part of the distribution too)."""

    seqs: dict[str, list[list[int]]]
    tallies: dict[str, MethodTotals]
    used: Counter  # prompt index -> rounds it was used in
    rounds: int = 0


def _sample_rounds(lm, drafter, items: list[dict[str, Any]], ids: list[list[int]], params, k: int, tokens: int,
                   max_tokens: int, seed: int, progress: Progress) -> Sample:
    """Round r: the next prompt, one sequence per method (seeds ``seed * 1_000_003 + 2r`` and
    ``+ 1``), until both methods have at least ``tokens`` tokens."""
    from mlxspec.targets.tokenizer import stop_token_ids

    stop = stop_token_ids(lm.tokenizer)
    sample = Sample({m: [] for m in METHODS}, {m: MethodTotals(m == "speculative") for m in METHODS}, Counter())
    while min(t.tokens for t in sample.tallies.values()) < tokens:
        r, j = sample.rounds, sample.rounds % len(items)
        for method in METHODS:
            run = engine_run(lm, ids[j], params, max_tokens, stop, seed * 1_000_003 + 2 * r + (method == "speculative"),
                             drafter if method == "speculative" else None, k)
            sample.tallies[method].add(run)
            sample.seqs[method].append(run.tokens + ([EOS_BIN] if run.stop_reason == "eos" else []))
            if progress is not None:
                done = sum(min(t.tokens, tokens) for t in sample.tallies.values())
                progress(done, 2 * tokens, f"{method.replace('_', '-')} · {items[j]['category']} #{items[j]['id']}")
        sample.used[j] += 1
        sample.rounds += 1
    return sample


def _per_sequence(lists: list[list[int]], bin_ids: list[int], ncols: int) -> np.ndarray:
    """(sequences, ncols) binned counts: named ids in their column, the rest in "other" (the
    last column, when the table has one)."""
    col = {int(i): c for c, i in enumerate(bin_ids)}
    m = np.zeros((len(lists), ncols), dtype=np.int64)
    for r, out in enumerate(lists):
        for tok in out:
            c = col.get(tok, len(bin_ids))
            if c < ncols:
                m[r, c] += 1
    return m


def _bins(tokenizer, bin_ids: list[int], table: np.ndarray) -> list[dict[str, Any]]:
    bins = [{"id": int(i), "text": "<eos>" if i == EOS_BIN else tokenizer.decode([int(i)]),
             "target_only": int(a), "speculative": int(b)} for i, a, b in zip(bin_ids, table[0], table[1])]
    if table.shape[1] > len(bin_ids):
        bins.append({"id": None, "text": "<other>", "target_only": int(table[0, -1]), "speculative": int(table[1, -1])})
    return bins


@dataclass(frozen=True)
class Homogeneity:
    """The chi-squared test of the two samples, asymptotic and by paired permutation."""

    bin_ids: list[int]
    table: np.ndarray
    chi2: float
    dof: int
    p: float
    null: np.ndarray
    p_permutation: float


def homogeneity(sample: Sample, seed: int) -> Homogeneity:
    """Bin the pooled sample, test it with ``chi2_contingency``, and against the paired
    permutation null of the same statistic."""
    from scipy.stats import chi2_contingency

    from mlxspec.errors import MlxspecError

    counts = {m: Counter(tok for seq in sample.seqs[m] for tok in seq) for m in METHODS}
    bin_ids, table = contingency_bins(counts["target_only"], counts["speculative"])
    if table.shape[1] < 2:
        raise MlxspecError(f"too few tokens to bin ({sum(t.tokens for t in sample.tallies.values())}): raise --tokens")
    chi2, p, dof, _ = chi2_contingency(table, correction=False)
    per_seq = {m: _per_sequence(sample.seqs[m], bin_ids, table.shape[1]) for m in METHODS}
    null = permutation_null(per_seq["target_only"], per_seq["speculative"], seed=seed)
    p_perm = (int((null >= chi2 * (1 - 1e-12)).sum()) + 1) / (len(null) + 1)
    return Homogeneity(bin_ids, table, float(chi2), int(dof), float(p), null, float(p_perm))


def _sampling_result(lm, draft: str, k: int, settings: dict[str, Any], items: list[dict[str, Any]],
                     ids: list[list[int]], sample: Sample, h: Homogeneity) -> dict[str, Any]:
    counts = Counter(tok for m in METHODS for seq in sample.seqs[m] for tok in seq)
    return {
        "check": "sampling", **_header(lm, draft, k), "settings": settings,
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


def sampling_check(
    model_spec="default",
    draft: str = "self:8",
    k: int = 4,
    tokens: int = 9200,
    temperature: float = 1.0,
    top_p: float = 1.0,
    max_tokens_per_prompt: int = 128,
    seed: int = 0,
    progress: Progress = None,
    keep_sequences: bool = False,
) -> dict[str, Any]:
    """Two-sample chi-squared test: token histograms of target-only vs speculative sampling.

    Each round takes the next prompt (cycling), samples one sequence of at most
    ``max_tokens_per_prompt`` tokens (stopping at end-of-sequence) with target-only decoding
    (seed ``seed * 1_000_003 + 2r``) and one with speculative decoding (``... + 2r + 1``); rounds
    go on until both methods have at least ``tokens`` tokens. Result keys: check, date, backend,
    model, dtype, draft, k, settings{...}, prompts_used, target_only{tokens, sequences,
    elapsed_s, tokens_per_s}, speculative{... steps, drafted, accepted, acceptance_rate, tau,
    tokens_per_step, eos (sequences ended at a stop token)}, distinct_ids (incl. <eos>),
    bins[{id (-1 = <eos>), text, target_only, speculative}] (+ "other"),
    chi2, dof, p (asymptotic), p_permutation, permutations, permutation_null_mean and
    permutation_null_q99 (the statistic's null mean and 99th percentile), alpha,
    passed_asymptotic, passed (p_permutation > alpha), decided_by, note; with ``keep_sequences``
    also sequences{target_only, speculative}: every round's token ids (+ -1 if it ended at a
    stop token).
    """
    from mlxspec.core.sampling import SamplingParams
    from mlxspec.errors import MlxspecError
    from mlxspec.targets.tokenizer import encode_prompt

    params = SamplingParams(temperature=temperature, top_p=top_p)
    if params.greedy:
        raise MlxspecError("the sampling check needs temperature > 0 (greedy is greedy_check)")
    if tokens < 1 or max_tokens_per_prompt < 1:
        raise MlxspecError("tokens and max_tokens_per_prompt must be >= 1")
    lm = _load(model_spec)
    drafter = _drafter(draft, lm)
    items = verify_prompts()
    ids = [encode_prompt(lm.tokenizer, it["text"]) for it in items]
    sample = _sample_rounds(lm, drafter, items, ids, params, k, tokens, max_tokens_per_prompt, seed, progress)
    settings = {"tokens": tokens, "temperature": temperature, "top_p": top_p,
                "max_tokens_per_prompt": max_tokens_per_prompt, "seed": seed, "max_bins": MAX_BINS,
                "min_pooled_count": MIN_POOLED_COUNT,
                "prompt_source": MT_BENCH_FILE if items[0]["category"] != "builtin" else "builtin"}
    result = _sampling_result(lm, draft, k, settings, items, ids, sample, homogeneity(sample, seed))
    return {**result, "sequences": sample.seqs} if keep_sequences else result


# ----------------------------------------------------------------------------- greedy check


def _divergence(lm, prefix: list[int], plain_tok: int, spec_tok: int) -> dict[str, Any]:
    """The target's logits after ``prefix`` (one fresh pass): top-2 gap and where the two
    diverging tokens stand."""
    from mlxspec.core.prefill import prefill

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


def greedy_check(
    model_spec="default",
    draft: str = "self:8",
    k: int = 4,
    prompts: int = 20,
    tokens: int = 64,
    progress: Progress = None,
) -> dict[str, Any]:
    """Greedy speculative output == greedy target-only output, token for token, on the first
    ``prompts`` verify prompts (cycled if more are asked for) x exactly ``tokens`` tokens.

    Result keys: check, date, backend, model, dtype, draft, k, settings{prompts, tokens,
    near_tie}, results[{id, category, prompt_tokens, tokens, identical, classification
    ("identical" | "near_tie" | "mismatch"), diverged_at, target_token, spec_token, top2_gap,
    ...}], summary{prompts, identical, near_ties, mismatches, tokens_compared,
    tokens_agreeing}, target_only{...}, speculative{...}, passed.
    """
    from mlxspec.core.sampling import SamplingParams
    from mlxspec.errors import MlxspecError
    from mlxspec.targets.tokenizer import encode_prompt

    if prompts < 1 or tokens < 1:
        raise MlxspecError("prompts and tokens must be >= 1")
    lm = _load(model_spec)
    drafter = _drafter(draft, lm)
    items = verify_prompts()
    params = SamplingParams()  # greedy
    results = []
    tallies = {m: MethodTotals(m == "speculative") for m in METHODS}
    done = 0
    for i in range(prompts):
        it = items[i % len(items)]
        ids = encode_prompt(lm.tokenizer, it["text"])
        n = min(tokens, lm.context_length - len(ids))
        outs = {}
        for method in METHODS:
            run = engine_run(lm, ids, params, n, set(), 0, drafter if method == "speculative" else None, k)
            tallies[method].add(run)
            outs[method] = run.tokens
            done += n
            if progress is not None:
                progress(done, 2 * prompts * tokens, f"greedy {method.replace('_', '-')} · {it['category']} #{it['id']}")
        results.append(_greedy_row(lm, it, ids, outs["target_only"], outs["speculative"]))
    return _greedy_result(lm, draft, k, prompts, tokens, results, tallies)


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


def _greedy_result(lm, draft: str, k: int, prompts: int, tokens: int, results: list[dict[str, Any]],
                   tallies: dict[str, MethodTotals]) -> dict[str, Any]:
    classes = Counter(r["classification"] for r in results)
    return {
        "check": "greedy",
        **_header(lm, draft, k),
        "settings": {"prompts": prompts, "tokens": tokens, "near_tie": NEAR_TIE, "stop_on_eos": False},
        "results": results,
        "summary": {"prompts": prompts, "identical": classes["identical"], "near_ties": classes["near_tie"],
                    "mismatches": classes["mismatch"], "tokens_compared": tallies["target_only"].tokens,
                    "tokens_agreeing": sum(r["agreeing"] for r in results)},
        "target_only": tallies["target_only"].to_json(),
        "speculative": tallies["speculative"].to_json(),
        "passed": classes["mismatch"] == 0,
    }


# ----------------------------------------------------------------------------- output


def _verdict(ok: bool) -> str:
    return markup(Kind.PASS, "PASS") if ok else markup(Kind.FAIL, "FAIL")


def _print_sampling(r: dict[str, Any], console) -> None:
    from rich.table import Table

    s, t, sp = r["settings"], r["target_only"], r["speculative"]
    console.print(
        f"[bold]Sampling equivalence[/] · {r['model']} ({r['dtype']}), draft {r['draft']}, K={r['k']}, "
        f"T={s['temperature']}, top-p={s['top_p']} · {r['backend']}"
    )
    console.print(
        f"  target-only: {t['tokens']} tokens in {t['sequences']} sequences, {t['elapsed_s']:.1f} s "
        f"({t['tokens_per_s']:.1f} tok/s)"
    )
    console.print(
        f"  speculative: {sp['tokens']} tokens in {sp['sequences']} sequences, {sp['elapsed_s']:.1f} s "
        f"({sp['tokens_per_s']:.1f} tok/s); acceptance {sp.get('acceptance_rate', 0):.1%}, "
        f"tau {sp.get('tau', 0):.2f} accepted/step, {sp.get('tokens_per_step', 0):.2f} tokens/step"
    )
    named = [b for b in r["bins"] if b["id"] is not None]
    table = Table(title=f"most frequent of {len(named)} binned token ids ({r['distinct_ids']} distinct seen)")
    for col, just in (("id", "right"), ("token", "left"), ("target-only", "right"), ("speculative", "right")):
        table.add_column(col, justify=just)
    for b in named[:10] + [b for b in r["bins"] if b["id"] is None]:
        table.add_row("" if b["id"] is None else str(b["id"]), repr(b["text"]), str(b["target_only"]),
                      str(b["speculative"]))
    console.print(table)
    console.print(f"  chi2 = {r['chi2']:.1f}, dof = {r['dof']}, p = {r['p']:.3f} (asymptotic, assumes independent tokens)")
    console.print(f"  permutation p = {r['p_permutation']:.3f} ({r['permutations']} paired sequence swaps: null chi2 "
                  f"mean {r['permutation_null_mean']:.1f}, 99th percentile {r['permutation_null_q99']:.1f}; "
                  f"pass iff p > {r['alpha']})")
    console.print(f"  sampling: {_verdict(r['passed'])}")


def _print_greedy(r: dict[str, Any], console) -> None:
    from rich.table import Table

    s, sm, sp = r["settings"], r["summary"], r["speculative"]
    console.print(
        f"[bold]Greedy equivalence[/] · {r['model']} ({r['dtype']}), draft {r['draft']}, K={r['k']} · "
        f"{s['prompts']} prompts x {s['tokens']} tokens"
    )
    console.print(
        f"  {sm['identical']}/{sm['prompts']} prompts identical, {sm['tokens_agreeing']}/{sm['tokens_compared']} "
        f"tokens agree before any divergence; near-ties {sm['near_ties']} (gap < {s['near_tie']:g}), "
        f"real mismatches {sm['mismatches']}"
    )
    console.print(
        f"  speculative: acceptance {sp.get('acceptance_rate', 0):.1%}, {sp.get('tokens_per_step', 0):.2f} tokens/step, "
        f"{sp['tokens_per_s']:.1f} tok/s vs target-only {r['target_only']['tokens_per_s']:.1f} tok/s"
    )
    diverged = [x for x in r["results"] if not x["identical"]]
    if diverged:
        table = Table(title="divergences")
        for col in ("prompt", "at", "target-only", "speculative", "top-2 gap", "verdict"):
            table.add_column(col)
        for x in diverged:
            gap = f"{x['top2_gap']:.2e}" if "top2_gap" in x else x.get("reason", "-")
            table.add_row(f"{x['category']} #{x['id']}", str(x["diverged_at"]), repr(x.get("target_text", "")),
                          repr(x.get("spec_text", "")), gap,
                          "near-tie" if x["classification"] == "near_tie" else markup(Kind.CAUSE, "mismatch"))
        console.print(table)
    console.print(f"  greedy: {_verdict(r['passed'])}")


def print_verify(result: dict[str, Any], console) -> None:
    """Render a ``sampling_check`` or ``greedy_check`` result, or ``{"sampling": ..., "greedy": ...}``
    with either or both, then an overall verdict when both are there."""
    parts = {result["check"]: result} if "check" in result else {k: v for k, v in result.items()
                                                                  if k in ("sampling", "greedy") and v}
    if "sampling" in parts:
        _print_sampling(parts["sampling"], console)
    if "greedy" in parts:
        _print_greedy(parts["greedy"], console)
    if len(parts) > 1:
        ok = all(p["passed"] for p in parts.values())
        console.print(f"verify: {_verdict(ok)}")
