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

import datetime as _dt
import json
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import mlx.core as mx
import numpy as np


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
    from mlxspec.measure.bench import FALLBACK_PROMPTS, data_dir

    path = data_dir() / MT_BENCH_FILE
    by_cat: dict[str, list[dict[str, Any]]] = {}
    if path.is_file():
        with path.open(encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    row = json.loads(line)
                    if row.get("turns"):
                        cat = row.get("category", "mt_bench")
                        by_cat.setdefault(cat, []).append(
                            {"id": row.get("question_id"), "category": cat, "text": row["turns"][0]})
    if not by_cat:
        return [{"id": f"builtin-{i + 1}", "category": "builtin", "text": t} for i, t in enumerate(FALLBACK_PROMPTS)]
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


def _run(lm, ids, params, max_tokens, stop, seed, drafter=None, k=4) -> tuple[list[int], dict[str, Any]]:
    """Emitted tokens and {steps, drafted, accepted, elapsed_s, stop_reason} of one generation."""
    from mlxspec.core.engine import generate
    from mlxspec.core.events import Done, Step

    out: list[int] = []
    drafted = accepted = steps = 0
    reason = ""
    t0 = time.perf_counter()
    for ev in generate(lm.model, ids, params, max_tokens, stop, lm.context_length, seed, drafter, k):
        if isinstance(ev, Step):
            out += ev.emitted
            drafted += ev.k
            accepted += ev.accepted
        elif isinstance(ev, Done):
            steps, reason = ev.steps, ev.stop_reason
    return out, {"steps": steps, "drafted": drafted, "accepted": accepted, "elapsed_s": time.perf_counter() - t0,
                 "stop_reason": reason}


def _method_stats(tokens: int, sequences: int, st: dict[str, Any]) -> dict[str, Any]:
    """tokens/s, and for speculative runs: acceptance rate (accepted / drafted), tau (mean
    accepted draft tokens per step) and tokens per step (mean emitted per target pass)."""
    el = st["elapsed_s"]
    d = {"tokens": tokens, "sequences": sequences, "eos": st.get("eos", 0), "elapsed_s": el,
         "tokens_per_s": tokens / el if el > 0 else 0.0}
    if st["drafted"] or st.get("speculative"):
        steps = max(st["steps"], 1)
        d.update(steps=st["steps"], drafted=st["drafted"], accepted=st["accepted"],
                 acceptance_rate=st["accepted"] / st["drafted"] if st["drafted"] else 0.0,
                 tau=st["accepted"] / steps, tokens_per_step=tokens / steps)
    return d


def _add(total: dict[str, Any], st: dict[str, Any]) -> None:
    for key in ("steps", "drafted", "accepted", "elapsed_s"):
        total[key] = total.get(key, 0) + st[key]
    total["eos"] = total.get("eos", 0) + (st["stop_reason"] == "eos")


def _header(lm, draft: str, k: int) -> dict[str, Any]:
    from mlxspec.runtime import backend_description

    return {"date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "backend": backend_description(), "model": lm.name, "dtype": lm.dtype, "draft": draft, "k": k}


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
    from scipy.stats import chi2_contingency

    from mlxspec.core.sampling import SamplingParams
    from mlxspec.errors import MlxspecError
    from mlxspec.targets.tokenizer import encode_prompt, stop_token_ids

    params = SamplingParams(temperature=temperature, top_p=top_p)
    if params.greedy:
        raise MlxspecError("the sampling check needs temperature > 0 (greedy is greedy_check)")
    if tokens < 1 or max_tokens_per_prompt < 1:
        raise MlxspecError("tokens and max_tokens_per_prompt must be >= 1")
    lm = _load(model_spec)
    drafter = _drafter(draft, lm)
    items = verify_prompts()
    ids = [encode_prompt(lm.tokenizer, it["text"]) for it in items]
    stop = stop_token_ids(lm.tokenizer)

    counts = {"target_only": Counter(), "speculative": Counter()}
    seqs: dict[str, list[list[int]]] = {"target_only": [], "speculative": []}
    n_tok = {"target_only": 0, "speculative": 0}
    stats: dict[str, dict[str, Any]] = {"target_only": {}, "speculative": {"speculative": True}}
    used: Counter = Counter()
    r = 0
    while min(n_tok.values()) < tokens:
        j = r % len(items)
        for method in ("target_only", "speculative"):
            s = seed * 1_000_003 + 2 * r + (method == "speculative")
            d = drafter if method == "speculative" else None
            out, st = _run(lm, ids[j], params, max_tokens_per_prompt, stop, s, d, k)
            n_tok[method] += len(out)
            if st["stop_reason"] == "eos":  # ending is part of the distribution too
                out = out + [EOS_BIN]
            counts[method].update(out)
            seqs[method].append(out)
            _add(stats[method], st)
            if progress is not None:
                done = sum(min(v, tokens) for v in n_tok.values())
                progress(done, 2 * tokens, f"{method.replace('_', '-')} · {items[j]['category']} #{items[j]['id']}")
        used[j] += 1
        r += 1

    bin_ids, table = contingency_bins(counts["target_only"], counts["speculative"])
    if table.shape[1] < 2:
        raise MlxspecError(f"too few tokens to bin ({sum(n_tok.values())}): raise --tokens")
    chi2, p, dof, _ = chi2_contingency(table, correction=False)
    col = {int(i): c for c, i in enumerate(bin_ids)}
    per_seq = {}
    for method, lists in seqs.items():
        m = np.zeros((len(lists), table.shape[1]), dtype=np.int64)
        for r_i, out in enumerate(lists):
            for tok in out:
                c = col.get(tok, len(bin_ids))
                if c < table.shape[1]:
                    m[r_i, c] += 1
        per_seq[method] = m
    null = permutation_null(per_seq["target_only"], per_seq["speculative"], seed=seed)
    p_perm = (int((null >= chi2 * (1 - 1e-12)).sum()) + 1) / (len(null) + 1)
    bins = [{"id": int(i), "text": "<eos>" if i == EOS_BIN else lm.tokenizer.decode([int(i)]),
             "target_only": int(a), "speculative": int(b)} for i, a, b in zip(bin_ids, table[0], table[1])]
    if table.shape[1] > len(bin_ids):
        bins.append({"id": None, "text": "<other>", "target_only": int(table[0, -1]), "speculative": int(table[1, -1])})

    result = {
        "check": "sampling",
        **_header(lm, draft, k),
        "settings": {"tokens": tokens, "temperature": temperature, "top_p": top_p,
                     "max_tokens_per_prompt": max_tokens_per_prompt, "seed": seed, "max_bins": MAX_BINS,
                     "min_pooled_count": MIN_POOLED_COUNT, "prompt_source": MT_BENCH_FILE
                     if items[0]["category"] != "builtin" else "builtin"},
        "prompts_used": [{"id": items[j]["id"], "category": items[j]["category"], "prompt_tokens": len(ids[j]),
                          "rounds": used[j]} for j in sorted(used)],
        "target_only": _method_stats(n_tok["target_only"], r, stats["target_only"]),
        "speculative": _method_stats(n_tok["speculative"], r, stats["speculative"]),
        "distinct_ids": len(counts["target_only"] + counts["speculative"]),
        "bins": bins,
        "chi2": float(chi2),
        "dof": int(dof),
        "p": float(p),
        "p_permutation": float(p_perm),
        "permutations": PERMUTATIONS,
        "permutation_null_mean": float(null.mean()),  # vs dof: how much within-sequence dependence inflates chi2
        "permutation_null_q99": float(np.quantile(null, 0.99)),
        "alpha": ALPHA,
        "passed_asymptotic": bool(p > ALPHA),
        "passed": bool(p_perm > ALPHA),
        "decided_by": "p_permutation",
        "note": ("p is chi2_contingency's asymptotic p-value, which assumes independent tokens; tokens of one "
                 "sequence are not, so pass/fail uses p_permutation (paired sequence-level label swaps)"),
    }
    if keep_sequences:
        result["sequences"] = seqs
    return result


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
    stats: dict[str, dict[str, Any]] = {"target_only": {}, "speculative": {"speculative": True}}
    n_tok = {"target_only": 0, "speculative": 0}
    done = 0
    for i in range(prompts):
        it = items[i % len(items)]
        ids = encode_prompt(lm.tokenizer, it["text"])
        n = min(tokens, lm.context_length - len(ids))
        outs = {}
        for method in ("target_only", "speculative"):
            d = drafter if method == "speculative" else None
            outs[method], st = _run(lm, ids, params, n, set(), 0, d, k)
            _add(stats[method], st)
            n_tok[method] += len(outs[method])
            done += n
            if progress is not None:
                progress(done, 2 * prompts * tokens, f"greedy {method.replace('_', '-')} · {it['category']} #{it['id']}")
        a, b = outs["target_only"], outs["speculative"]
        row: dict[str, Any] = {"id": it["id"], "category": it["category"], "prompt_tokens": len(ids),
                               "tokens": len(a), "identical": a == b}
        if a == b:
            row.update(classification="identical", diverged_at=None, agreeing=len(a))
        else:
            at = next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            if at < min(len(a), len(b)):
                div = _divergence(lm, ids + a[:at], a[at], b[at])
                row.update(diverged_at=at, target_token=a[at], spec_token=b[at],
                           target_text=lm.tokenizer.decode([a[at]]), spec_text=lm.tokenizer.decode([b[at]]),
                           agreeing=at, **div)
            else:  # one is a strict prefix of the other: lengths differ, an engine bug
                row.update(diverged_at=at, classification="mismatch", agreeing=at,
                           reason=f"lengths differ: target-only {len(a)}, speculative {len(b)}")
        results.append(row)

    classes = Counter(r["classification"] for r in results)
    return {
        "check": "greedy",
        **_header(lm, draft, k),
        "settings": {"prompts": prompts, "tokens": tokens, "near_tie": NEAR_TIE, "stop_on_eos": False},
        "results": results,
        "summary": {"prompts": prompts, "identical": classes["identical"], "near_ties": classes["near_tie"],
                    "mismatches": classes["mismatch"], "tokens_compared": n_tok["target_only"],
                    "tokens_agreeing": sum(r["agreeing"] for r in results)},
        "target_only": _method_stats(n_tok["target_only"], prompts, stats["target_only"]),
        "speculative": _method_stats(n_tok["speculative"], prompts, stats["speculative"]),
        "passed": classes["mismatch"] == 0,
    }


# ----------------------------------------------------------------------------- output


def _verdict(ok: bool) -> str:
    return "[bold green]PASS[/]" if ok else "[bold red]FAIL[/]"


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
                          "near-tie" if x["classification"] == "near_tie" else "[red]mismatch[/]")
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
