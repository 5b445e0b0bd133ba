"""``mlxspec study``: when are drafts accepted, by domain, by depth in the draft tree, and
against the target's uncertainty, as the published study of tree acceptance measured it.

The run: four domains (``DOMAINS``: code = HumanEval, maths = GSM8K, logic = FOLIO, chat =
MT-Bench first turns of its open-ended categories), the first ``per_domain`` prompts of each,
chat-templated, decoded with tree speculation (``--tree 3x2 --tree-nodes 8``, greedy, as the
paper) and the engine asked for every verified node's ``events.NodeStats``. Every node becomes
one line of a JSON-lines log:

    {"record": "node", "domain", "prompt_id", "step", "pos", "node", "parent", "depth", "rank",
     "token", "q_draft", "entropy", "p_target", "target_top", "judged", "accepted"}

``step``: the step of the prompt's generation; ``pos``: tokens generated before it; ``rank``:
the node's place among its siblings (0 = the drafter's favourite); ``q_draft``: the drafter's
probability of the token (null for prompt lookup); ``entropy`` (nats) and ``p_target``: the
target's distribution the node was judged against (at its parent's position); ``judged``: its
parent was accepted (or is the root), so the target really ruled on it; ``accepted``: it is on
the accepted path. After a prompt's nodes comes one ``{"record": "prompt", ...}`` line (its
generated tokens, steps, stop reason): a prompt counts as done only with that line, so an
interrupted run resumes at the first prompt without one, and lines of a half-logged prompt are
dropped. The first line is the ``{"record": "header", "settings": ...}`` a resumed run must match.

The figures (pure functions of the node records; ``summarise``):

* per domain: E[accepted length] per step (mean path length over tree steps, with a 95%
  bootstrap interval over prompts), acceptance rate of judged nodes, mean alpha = min(1, p/q)
  over all nodes (the paper's per-node measure), mean target entropy;
* the depth profile: acceptance of judged nodes and mean alpha by depth, per domain and pooled;
* Spearman rho between entropy and acceptance (judged nodes) and between entropy and alpha (all
  nodes) per domain, each with a 95% percentile bootstrap interval that resamples *prompts*
  (nodes of one prompt are not independent);
* domain against depth: logistic regressions of ``accepted`` (judged nodes) on domain dummies,
  depth dummies and both (numpy IRLS on the domain x depth cells), their deviances and the
  likelihood-ratio test of each factor given the other;
* the paper's claims (``PAPER``), each marked holds / does not hold / cannot tell.

The result is a ``StudyResult``; its ``to_json()`` is the JSON (``schema``: see ``runs``).
"""

from __future__ import annotations

import gzip
import json
import math
import os
import re
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from mlxspec.errors import MlxspecError
from mlxspec.session import Session
from mlxspec.measure.runs import SCHEMA, RunHeader, data_dir, fmt, jsonl_rows

DOMAINS: tuple[str, ...] = ("code", "maths", "logic", "chat")
SOURCES: dict[str, str] = {"code": "humaneval.jsonl.gz", "maths": "gsm8k_test.jsonl",
                           "logic": "folio_validation.jsonl", "chat": "mt_bench_questions.jsonl"}
SOURCE_NAMES: dict[str, str] = {"code": "HumanEval", "maths": "GSM8K", "logic": "FOLIO", "chat": "MT-Bench"}
# MT-Bench's open-ended categories; its reasoning, math and coding questions belong to the other domains.
CHAT_CATEGORIES: tuple[str, ...] = ("writing", "roleplay", "extraction", "stem", "humanities")
DEFAULT_PER_DOMAIN = 50
DEFAULT_MAX_TOKENS = 64
QUICK_PER_DOMAIN, QUICK_MAX_TOKENS = 2, 24
LOG_VERSION = 1
RESAMPLES = 1000
LEVEL = 0.95
# Fewer prompts than this give no interval: resampling 2 or 3 prompts has only a handful of
# distinct outcomes, and its percentile interval is far narrower than the truth (as verdict.MIN_PAIRS).
MIN_CLUSTERS = 5
FLAT_DEPTH = 0.10  # a depth profile whose acceptance spans less than this is "flat"
WEAK_RHO = 0.3  # |rho| below this is a "weak" correlation
SIGNIFICANT = 0.01  # likelihood-ratio tests


@dataclass(frozen=True)
class Paper:
    """The published figures (TinyLlama-1.1B drafting for Llama-2-7B, 50 prompts per domain,
    3x2 trees of at most 8 nodes, greedy). Its domains: code (HumanEval), maths
    (MATH algebra), reasoning (GSM8K), chat (UltraChat)."""

    expected_length: tuple[float, float] = (0.91, 1.07)  # per step, maths lowest, chat highest
    mean_alpha: tuple[float, float] = (0.52, 0.57)
    rho: tuple[float, float] = (-0.20, -0.15)  # entropy vs alpha, within each domain
    above_one: tuple[str, ...] = ("chat",)
    text: str = ("TinyLlama-1.1B -> Llama-2-7B, 200 prompts, ~100k nodes, 3x2 trees (8 nodes), greedy; its "
                 "domains: code HumanEval, maths MATH algebra, reasoning GSM8K, chat UltraChat")


PAPER = Paper()


# ----------------------------------------------------------------------------- prompts


def _read_rows(path: Path) -> list[dict[str, Any]]:
    if path.suffix == ".gz":
        with gzip.open(path, "rt", encoding="utf-8") as f:
            return [json.loads(ln) for ln in f if ln.strip()]
    return list(jsonl_rows(path))


def _domain_prompts(domain: str, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """All prompts of a domain in study order: {id, domain, text}."""
    if domain == "code":
        return [{"id": r["task_id"], "text": f"Complete this Python function.\n\n{r['prompt']}"} for r in rows]
    if domain == "maths":
        return [{"id": f"gsm8k/{i}", "text": r["question"]} for i, r in enumerate(rows)]
    if domain == "logic":
        out, seen = [], set()
        for i, r in enumerate(rows):
            premises = r["premises"] if isinstance(r["premises"], list) else [r["premises"]]
            text = ("Premises:\n" + "\n".join(f"- {p}" for p in premises)
                    + f"\nDoes it follow that: {r['conclusion']}? Explain step by step.")
            if text not in seen:
                seen.add(text)
                out.append({"id": f"folio/{i}", "text": text})
        return out
    # chat: round-robin over the open-ended categories, so a few prompts still mix them
    by_cat: dict[str, list[dict[str, Any]]] = {c: [] for c in CHAT_CATEGORIES}
    for r in rows:
        if r.get("category") in by_cat and r.get("turns"):
            by_cat[r["category"]].append({"id": f"mt_bench/{r['question_id']}", "text": r["turns"][0]})
    out = []
    for i in range(max((len(v) for v in by_cat.values()), default=0)):
        out += [v[i] for v in by_cat.values() if i < len(v)]
    return out


def study_prompts(per_domain: int, folder: Path | None = None,
                  skip: set[str] | None = None) -> tuple[list[dict[str, Any]], list[str]]:
    """The first ``per_domain`` prompts of each domain (``DOMAINS``) from the shared data folder
    (``runs.data_dir``), passing over texts in ``skip``: items {id, domain, text}, domain by
    domain, and notes (a domain with fewer prompts than asked)."""
    if per_domain < 1:
        raise MlxspecError(f"--prompts-per-domain must be >= 1, got {per_domain}")
    folder = data_dir() if folder is None else Path(folder)
    missing = [SOURCES[d] for d in DOMAINS if not (folder / SOURCES[d]).is_file()]
    if missing:
        raise MlxspecError(f"the study's prompt data is missing from {folder} ({', '.join(missing)}); "
                           "set MLXSPEC_DATA to the shared data folder")
    items, notes = [], []
    for d in DOMAINS:
        try:
            prompts = _domain_prompts(d, _read_rows(folder / SOURCES[d]))
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise MlxspecError(f"cannot read {folder / SOURCES[d]}: {e}") from None
        prompts = [q for q in prompts if not skip or q["text"] not in skip]
        if len(prompts) < per_domain:
            notes.append(f"{d} has only {len(prompts)} prompts ({SOURCE_NAMES[d]}); all of them are used")
        items += [{**p, "domain": d} for p in prompts[:per_domain]]
    return items, notes


def distilled_on(draft: str) -> set[str] | None:
    """The prompt texts a trained draft (``train-draft``) was distilled on, rebuilt from the
    name of its data set in its config (``training.train`` names it ...-p<prompts>-...-s<seed>.npz
    and ``distill.training_prompts`` draws them deterministically from the same shared data
    folder); None for other drafters or when its config does not say."""
    from mlxspec.targets.folders import find_draft

    folder = find_draft(draft)
    if folder is None:
        return None
    try:
        data = str(json.loads((folder / "config.json").read_text()).get("data", ""))
    except (OSError, ValueError):
        return None
    m = re.search(r"-p(\d+)-n\d+-v\d+-s(\d+)\.npz$", data)
    if m is None:
        return None
    from mlxspec.training.distill import training_prompts

    try:
        prompts, _ = training_prompts(data_dir(), int(m[1]), int(m[2]))
    except (OSError, ValueError, KeyError):
        return None
    return {p["text"] for p in prompts}


# ----------------------------------------------------------------------------- the log


@dataclass(frozen=True)
class StudySettings:
    """What identifies a study's log (a resumed run must match it), and the prompt count."""

    model: str
    draft: str
    tree: str
    tree_nodes: int
    temperature: float
    top_p: float
    max_tokens: int
    seed: int
    dtype: str
    per_domain: int = DEFAULT_PER_DOMAIN
    held_out: bool = False  # prompts the draft was distilled on passed over

    def identity(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("per_domain")
        d.pop("held_out")  # a prompt's records do not depend on which others were picked
        return d


def default_log_path(s: StudySettings) -> Path:
    """``$MLXSPEC_HOME/study/<settings>.jsonl``: one log per setting, so a rerun resumes it."""
    from mlxspec.targets.store import home

    slug = (f"{s.model}_{s.draft}_{s.tree}n{s.tree_nodes}_T{s.temperature:g}_p{s.top_p:g}_"
            f"n{s.max_tokens}_seed{s.seed}_{s.dtype}")
    return home() / "study" / (re.sub(r"[^A-Za-z0-9._-]+", "-", slug).strip("-") + ".jsonl")


@dataclass
class LogContents:
    header: dict[str, Any] | None
    nodes: list[dict[str, Any]]
    prompts: list[dict[str, Any]]
    dropped: int  # lines of prompts that were not finished, or unreadable lines


def read_log(path: str | Path) -> LogContents:
    """A study log: its header, the node and prompt records of finished prompts (those with a
    prompt line), and how many lines were left out (a prompt cut short, a torn last line)."""
    header, nodes, prompts, pending, dropped = None, [], [], defaultdict(list), 0
    with Path(path).open(encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
                kind = rec["record"]
            except (json.JSONDecodeError, KeyError, TypeError):
                dropped += 1
                continue
            if kind == "header" and header is None:
                header = rec
            elif kind == "node":
                pending[(rec.get("domain"), rec.get("prompt_id"))].append(rec)
            elif kind == "prompt":
                nodes += pending.pop((rec.get("domain"), rec.get("prompt_id")), [])
                prompts.append(rec)
            else:
                dropped += 1
    dropped += sum(len(v) for v in pending.values())
    return LogContents(header, nodes, prompts, dropped)


class StudyLog:
    """The JSON-lines log of a study: opened (created, or checked against ``settings`` and
    cleaned of a half-logged prompt), then one ``add`` per finished prompt."""

    def __init__(self, path: str | Path, settings: StudySettings, fresh: bool = False):
        self.path = Path(path)
        ident = settings.identity()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            if self.path.is_dir():
                raise MlxspecError(f"--log {self.path} is a folder; give a file")
            if fresh or not self.path.exists() or self.path.stat().st_size == 0:
                self._rewrite({"record": "header", "version": LOG_VERSION, "settings": ident}, [], [])
                self.contents = LogContents(None, [], [], 0)
                return
            c = read_log(self.path)
            if c.header is None:
                raise MlxspecError(f"{self.path} is not a study log (no header line); give another --log or --fresh")
            theirs = c.header.get("settings", {})
            diff = [f"{k} {theirs.get(k)!r} (now {v!r})" for k, v in ident.items() if theirs.get(k) != v]
            if diff:
                raise MlxspecError(f"{self.path} was logged with other settings: {', '.join(diff)}; "
                                   "give another --log, or --fresh to start it again")
            if c.dropped:  # keep only whole prompts, so nothing is logged twice
                self._rewrite(c.header, c.nodes, c.prompts)
            self.contents = c
        except OSError as e:
            raise MlxspecError(f"cannot use the study log {self.path}: {e.strerror or e}") from None

    def _rewrite(self, header: dict, nodes: list[dict], prompts: list[dict]) -> None:
        by_prompt = defaultdict(list)
        for n in nodes:
            by_prompt[(n["domain"], n["prompt_id"])].append(n)
        tmp = self.path.with_name(self.path.name + ".tmp")
        with tmp.open("w", encoding="utf-8") as f:
            f.write(json.dumps(header) + "\n")
            for p in prompts:
                for n in by_prompt.get((p["domain"], p["prompt_id"]), []):
                    f.write(json.dumps(n) + "\n")
                f.write(json.dumps(p) + "\n")
        os.replace(tmp, self.path)

    @property
    def done(self) -> set[tuple[str, Any]]:
        return {(p["domain"], p["prompt_id"]) for p in self.contents.prompts}

    def add(self, nodes: list[dict[str, Any]], prompt: dict[str, Any]) -> None:
        """A finished prompt: its nodes, then its prompt line, in one write."""
        text = "".join(json.dumps(n) + "\n" for n in nodes) + json.dumps(prompt) + "\n"
        try:
            with self.path.open("a", encoding="utf-8") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
        except OSError as e:
            raise MlxspecError(f"cannot write the study log {self.path}: {e.strerror or e}") from None
        self.contents.nodes += nodes
        self.contents.prompts.append(prompt)


def run_prompts(items: Sequence[dict[str, Any]], log: StudyLog,
                run_one: Callable[[dict[str, Any]], tuple[list[dict], dict]],
                progress: Callable[[int, int, str], Any] | None = None) -> int:
    """Run every item not finished in ``log`` (``run_one(item) -> (nodes, prompt record)``),
    logging each as it finishes. Returns how many ran."""
    done = log.done
    todo = [it for it in items if (it["domain"], it["id"]) not in done]
    before = len(items) - len(todo)
    for i, it in enumerate(todo):
        if progress is not None:
            progress(i, len(todo), f"study · {it['domain']} {it['id']}"
                     + (f" · {before} done before" if before else ""))
        nodes, prompt = run_one(it)
        log.add(nodes, prompt)
    if progress is not None and todo:
        progress(len(todo), len(todo), "study · summarising")
    return len(todo)


# ----------------------------------------------------------------------------- node records


def prompt_records(events: Iterable[Any], domain: str, prompt_id: Any,
                   prompt_tokens: int = 0) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The node records and the prompt record of one generation, from the engine's events
    (``generate(..., tree=..., node_stats=True)``)."""
    from mlxspec.core.events import Done, Step
    from mlxspec.core.tree import depths

    nodes: list[dict[str, Any]] = []
    tokens: list[int] = []
    steps = tree_steps = 0
    done = None
    t0 = time.perf_counter()
    for ev in events:
        if isinstance(ev, Done):
            done = ev
            continue
        if not isinstance(ev, Step):
            continue
        t = ev.tree
        if t is not None and t.tokens and t.stats is not None:
            tree_steps += 1
            s, path = t.stats, set(t.path)
            seen: Counter = Counter()
            for i, (tok, par, depth) in enumerate(zip(t.tokens, t.parents, depths(t.parents))):
                rank = seen[par]
                seen[par] += 1
                nodes.append({
                    "record": "node", "domain": domain, "prompt_id": prompt_id, "step": steps, "pos": len(tokens),
                    "node": i, "parent": par, "depth": depth, "rank": rank, "token": tok,
                    "q_draft": None if s.q_draft is None else s.q_draft[i], "entropy": s.entropy[i],
                    "p_target": s.p_target[i], "target_top": s.target_top[i],
                    "judged": par < 0 or par in path, "accepted": i in path,
                })
        tokens += ev.emitted
        steps += 1
    prompt = {"record": "prompt", "domain": domain, "prompt_id": prompt_id, "prompt_tokens": prompt_tokens,
              "generated": len(tokens), "steps": steps, "tree_steps": tree_steps, "nodes": len(nodes),
              "stop_reason": done.stop_reason if done else None, "seconds": time.perf_counter() - t0,
              "tokens": tokens}
    return nodes, prompt


def alpha(node: dict[str, Any]) -> float | None:
    """The paper's per-node acceptance measure min(1, p/q); None without a draft probability."""
    q = node.get("q_draft")
    if q is None:
        return None
    return 1.0 if q <= 0 else min(1.0, node["p_target"] / q)


# ----------------------------------------------------------------------------- statistics


def average_ranks(values: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Ranks (1-based, ties averaged) of ``values`` (n,) in each row of ``weights`` (R, n): the
    ranks the values would get if value i occurred ``weights[r, i]`` times (a resample)."""
    values = np.asarray(values, dtype=np.float64)
    order = np.argsort(values, kind="stable")
    v = values[order]
    starts = np.flatnonzero(np.r_[True, v[1:] != v[:-1]]) if v.size else np.array([], dtype=np.int64)
    gid = np.cumsum(np.r_[True, v[1:] != v[:-1]]) - 1 if v.size else np.array([], dtype=np.int64)
    w = weights[:, order]
    gsum = np.add.reduceat(w, starts, axis=1) if v.size else w
    before = np.cumsum(gsum, axis=1) - gsum
    ranked = (before + (gsum + 1) / 2)[:, gid]
    out = np.empty_like(ranked)
    out[:, order] = ranked
    return out


def weighted_spearman(x: Sequence[float], y: Sequence[float], weights: np.ndarray) -> np.ndarray:
    """Spearman rho (ties averaged, as scipy's) of (x, y) for each row of ``weights`` (R, n):
    the rho of the sample in which pair i occurs ``weights[r, i]`` times. nan where a row
    has no spread."""
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    w = np.asarray(weights, dtype=np.float64)
    rx, ry = average_ranks(x, w), average_ranks(y, w)
    total = w.sum(axis=1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        dx = rx - (w * rx).sum(axis=1, keepdims=True) / total
        dy = ry - (w * ry).sum(axis=1, keepdims=True) / total
        return (w * dx * dy).sum(axis=1) / np.sqrt((w * dx * dx).sum(axis=1) * (w * dy * dy).sum(axis=1))


@dataclass(frozen=True)
class Estimate:
    """A statistic with its percentile bootstrap interval over prompts (None: too few)."""

    value: float | None
    lo: float | None = None
    hi: float | None = None
    n: int = 0  # the observations it rests on (nodes or steps)
    clusters: int = 0  # prompts resampled

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def cell(self, spec: str = "{:+.2f}") -> str:
        if self.value is None:
            return "-"
        iv = "" if self.lo is None else f" [{spec.format(self.lo)}, {spec.format(self.hi)}]"
        return spec.format(self.value) + iv


def _cluster_weights(clusters: Sequence[Any], rng: np.random.Generator, resamples: int) -> tuple[np.ndarray, int]:
    """(R, n) multiplicities of n observations when their ``clusters`` are resampled with
    replacement R times; and the number of clusters."""
    keys = {c: i for i, c in enumerate(dict.fromkeys(clusters))}
    cid = np.array([keys[c] for c in clusters], dtype=np.int64)
    k = len(keys)
    picks = rng.integers(0, k, size=(resamples, k))
    counts = np.zeros((resamples, k))
    np.add.at(counts, (np.repeat(np.arange(resamples), k), picks.ravel()), 1.0)
    return counts[:, cid], k


def _interval(values: np.ndarray, level: float) -> tuple[float | None, float | None]:
    values = values[np.isfinite(values)]
    if values.size == 0:
        return None, None
    tail = (1 - level) / 2
    lo, hi = np.quantile(values, [tail, 1 - tail])
    return float(lo), float(hi)


def spearman_estimate(x: Sequence[float], y: Sequence[float], clusters: Sequence[Any], resamples: int = RESAMPLES,
                      seed: int = 0, level: float = LEVEL) -> Estimate:
    """Spearman rho of (x, y) with a percentile bootstrap interval that resamples whole
    clusters (prompts); no interval with fewer than ``MIN_CLUSTERS``."""
    n = len(x)
    if n < 3:
        return Estimate(None, n=n)
    rho = float(weighted_spearman(x, y, np.ones((1, n)))[0])
    if not math.isfinite(rho):
        return Estimate(None, n=n, clusters=len(set(clusters)))
    k = len(set(clusters))
    if k < MIN_CLUSTERS:
        return Estimate(rho, n=n, clusters=k)
    rng = np.random.default_rng(seed)
    chunk = max(1, min(resamples, 2_000_000 // max(n, 1)))  # bound memory: (chunk, n) float arrays
    values = []
    for start in range(0, resamples, chunk):
        w, _ = _cluster_weights(clusters, rng, min(chunk, resamples - start))
        values.append(weighted_spearman(x, y, w))
    lo, hi = _interval(np.concatenate(values), level)
    return Estimate(rho, lo, hi, n, k)


def ratio_estimate(num: Sequence[float], den: Sequence[float], clusters: Sequence[Any], resamples: int = RESAMPLES,
                   seed: int = 0, level: float = LEVEL) -> Estimate:
    """sum(num) / sum(den) with a bootstrap interval over clusters (none with fewer than
    ``MIN_CLUSTERS``)."""
    num, den = np.asarray(num, dtype=np.float64), np.asarray(den, dtype=np.float64)
    if den.sum() <= 0:
        return Estimate(None, n=len(num))
    value = float(num.sum() / den.sum())
    k = len(set(clusters))
    if k < MIN_CLUSTERS:
        return Estimate(value, n=len(num), clusters=k)
    w, _ = _cluster_weights(clusters, np.random.default_rng(seed), resamples)
    with np.errstate(divide="ignore", invalid="ignore"):
        lo, hi = _interval((w @ num) / (w @ den), level)
    return Estimate(value, lo, hi, len(num), k)


def logistic_deviance(X: np.ndarray, successes: np.ndarray, trials: np.ndarray, max_iter: int = 200,
                      tol: float = 1e-10) -> float:
    """-2 log-likelihood of the maximum-likelihood logistic regression of binomial counts
    (``successes`` of ``trials`` per row of the design ``X``), by Newton's method (IRLS) with
    step halving. A category whose cells all succeed or all fail drives its coefficient off to
    infinity; the deviance still converges, to that of the fitted cell rates."""
    X = np.asarray(X, dtype=np.float64)
    s, n = np.asarray(successes, dtype=np.float64), np.asarray(trials, dtype=np.float64)

    def dev(beta: np.ndarray) -> tuple[float, np.ndarray]:
        eta = np.clip(X @ beta, -40, 40)
        mu = 1.0 / (1.0 + np.exp(-eta))
        ll = s * np.log(np.maximum(mu, 1e-300)) + (n - s) * np.log(np.maximum(1 - mu, 1e-300))
        return float(-2 * ll.sum()), mu

    beta = np.zeros(X.shape[1])
    d, mu = dev(beta)
    for _ in range(max_iter):
        w = n * mu * (1 - mu)
        grad = X.T @ (s - n * mu)
        hess = (X.T * w) @ X + 1e-9 * np.eye(X.shape[1])
        step = np.linalg.lstsq(hess, grad, rcond=None)[0]
        for _ in range(30):
            d_new, mu_new = dev(beta + step)
            if d_new <= d + 1e-12:
                break
            step = step / 2
        else:
            break
        beta = beta + step
        improved = d - d_new
        d, mu = d_new, mu_new
        if improved < tol * max(1.0, abs(d)):
            break
    return d


def _dummies(levels: Sequence[Any], values: Sequence[Any]) -> np.ndarray:
    """Treatment coding: one column per level but the first."""
    return np.array([[v == lv for lv in levels[1:]] for v in values], dtype=np.float64).reshape(len(values), -1)


@dataclass(frozen=True)
class FactorTest:
    """How much of the deviance of ``accepted`` a factor explains, alone and given the other."""

    factor: str
    levels: int
    deviance: float  # of the model with this factor alone
    explained: float  # null deviance minus that
    pseudo_r2: float  # McFadden: explained / null deviance
    lr_given_other: float  # deviance drop when it joins the other factor
    df: int
    p_given_other: float


@dataclass(frozen=True)
class VarianceTest:
    """Logistic regressions of ``accepted`` (judged nodes) on domain, depth and both."""

    nodes: int
    null_deviance: float
    both_deviance: float
    domain: FactorTest
    depth: FactorTest

    @property
    def stronger(self) -> str | None:
        """The factor that explains more deviance alone ("domain", "depth"; None on a tie)."""
        a, b = self.domain.explained, self.depth.explained
        return None if abs(a - b) < 1e-9 else "domain" if a > b else "depth"

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "stronger": self.stronger}


def domain_vs_depth(nodes: Sequence[dict[str, Any]]) -> VarianceTest | None:
    """``VarianceTest`` of the judged nodes; None when there are none, or nothing varies."""
    from scipy.stats import chi2

    judged = [n for n in nodes if n["judged"]]
    if not judged:
        return None
    doms = [d for d in DOMAINS if any(n["domain"] == d for n in judged)]
    doms += sorted({n["domain"] for n in judged} - set(doms))
    deps = sorted({n["depth"] for n in judged})
    cells: dict[tuple[str, int], list[int]] = defaultdict(lambda: [0, 0])
    for n in judged:
        c = cells[(n["domain"], n["depth"])]
        c[0] += bool(n["accepted"])
        c[1] += 1
    keys = list(cells)
    s = np.array([cells[k][0] for k in keys], dtype=np.float64)
    t = np.array([cells[k][1] for k in keys], dtype=np.float64)
    one = np.ones((len(keys), 1))
    xd, xk = _dummies(doms, [k[0] for k in keys]), _dummies(deps, [k[1] for k in keys])
    d0 = logistic_deviance(one, s, t)
    dd = logistic_deviance(np.hstack([one, xd]), s, t)
    dk = logistic_deviance(np.hstack([one, xk]), s, t)
    db = logistic_deviance(np.hstack([one, xd, xk]), s, t)

    def test(name: str, levels: int, alone: float, other: float) -> FactorTest:
        lr, df = max(0.0, other - db), levels - 1
        return FactorTest(name, levels, alone, d0 - alone, (d0 - alone) / d0 if d0 > 0 else 0.0, lr, df,
                          float(chi2.sf(lr, df)) if df > 0 else 1.0)

    return VarianceTest(len(judged), d0, db, test("domain", len(doms), dd, dk), test("depth", len(deps), dk, dd))


# ----------------------------------------------------------------------------- figures


@dataclass(frozen=True)
class DomainRow:
    domain: str
    prompts: int
    steps: int  # tree steps
    nodes: int
    judged: int
    expected_length: Estimate  # accepted nodes per tree step
    acceptance: float | None  # accepted / judged nodes
    mean_alpha: float | None  # min(1, p/q) over all nodes (None without draft probabilities)
    mean_entropy: float | None  # nats, over all nodes
    rho_accepted: Estimate  # Spearman(entropy, accepted), judged nodes
    rho_alpha: Estimate  # Spearman(entropy, alpha), all nodes with q

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        for k in ("expected_length", "rho_accepted", "rho_alpha"):
            d[k] = getattr(self, k).to_json()
        return d


@dataclass(frozen=True)
class DepthRow:
    """One depth of the profile. Node level: ``acceptance`` = accepted / judged nodes (at most
    1/B with B siblings, one of which can be on the path) and ``mean_alpha``. Path level:
    ``reached`` steps whose accepted path got to depth - 1 with children below it, of which
    ``continued`` accepted one of them; ``continues`` = their ratio, as a chain's acceptance
    by position (E[accepted length] = sum over depths of the product of continues up to there)."""

    domain: str  # or "all"
    depth: int
    nodes: int
    judged: int
    accepted: int
    acceptance: float | None  # accepted / judged
    mean_alpha: float | None
    reached: int = 0
    continued: int = 0
    continues: float | None = None


@dataclass(frozen=True)
class EntropyBin:
    domain: str  # or "all"
    lo: float
    hi: float
    judged: int
    acceptance: float | None
    nodes: int
    mean_alpha: float | None


@dataclass(frozen=True)
class Claim:
    claim: str
    paper: str
    ours: str
    verdict: str  # "holds" | "does not hold" | "cannot tell"


def _mean(xs: Sequence[float]) -> float | None:
    return float(np.mean(xs)) if len(xs) else None


def _domains_in(nodes: Sequence[dict[str, Any]]) -> list[str]:
    present = {n["domain"] for n in nodes}
    return [d for d in DOMAINS if d in present] + sorted(present - set(DOMAINS))


def domain_rows(nodes: Sequence[dict[str, Any]], resamples: int = RESAMPLES, seed: int = 0) -> list[DomainRow]:
    rows = []
    for d in _domains_in(nodes):
        mine = [n for n in nodes if n["domain"] == d]
        steps: dict[tuple, int] = defaultdict(int)
        for n in mine:
            steps[(n["prompt_id"], n["step"])] += bool(n["accepted"])
        skeys = list(steps)
        judged = [n for n in mine if n["judged"]]
        with_q = [(n["entropy"], a) for n in mine if (a := alpha(n)) is not None]
        rows.append(DomainRow(
            domain=d, prompts=len({n["prompt_id"] for n in mine}), steps=len(skeys), nodes=len(mine),
            judged=len(judged),
            expected_length=ratio_estimate([steps[k] for k in skeys], [1.0] * len(skeys), [k[0] for k in skeys],
                                           resamples, seed),
            acceptance=_mean([float(n["accepted"]) for n in judged]),
            mean_alpha=_mean([a for _, a in with_q]), mean_entropy=_mean([n["entropy"] for n in mine]),
            rho_accepted=spearman_estimate([n["entropy"] for n in judged], [float(n["accepted"]) for n in judged],
                                           [n["prompt_id"] for n in judged], resamples, seed),
            rho_alpha=spearman_estimate([h for h, _ in with_q], [a for _, a in with_q],
                                        [n["prompt_id"] for n in mine if alpha(n) is not None], resamples, seed),
        ))
    return rows


def depth_rows(nodes: Sequence[dict[str, Any]]) -> list[DepthRow]:
    """The depth profile per domain, then pooled ("all")."""
    out = []
    for d in [*_domains_in(nodes), "all"]:
        mine = [n for n in nodes if d == "all" or n["domain"] == d]
        for depth in sorted({n["depth"] for n in mine}):
            at = [n for n in mine if n["depth"] == depth]
            judged = [n for n in at if n["judged"]]
            acc = sum(bool(n["accepted"]) for n in judged)
            # the judged nodes of one step at one depth are the children of its path's node above
            groups = {(n["domain"], n["prompt_id"], n["step"]) for n in judged}
            went_on = {(n["domain"], n["prompt_id"], n["step"]) for n in judged if n["accepted"]}
            out.append(DepthRow(d, depth, len(at), len(judged), acc, acc / len(judged) if judged else None,
                                _mean([a for n in at if (a := alpha(n)) is not None]), len(groups), len(went_on),
                                len(went_on) / len(groups) if groups else None))
    return out


def entropy_bins(nodes: Sequence[dict[str, Any]], bins: int = 8) -> list[EntropyBin]:
    """Acceptance (judged nodes) and mean alpha (all nodes) in entropy bins: quantiles of the
    pooled entropies, the same edges for every domain."""
    if not nodes:
        return []
    h = np.array([n["entropy"] for n in nodes])
    edges = np.unique(np.quantile(h, np.linspace(0, 1, bins + 1)))
    if edges.size < 2:
        edges = np.array([h.min(), h.max() + 1e-9])
    out = []
    for d in [*_domains_in(nodes), "all"]:
        mine = [n for n in nodes if d == "all" or n["domain"] == d]
        idx = np.clip(np.searchsorted(edges, [n["entropy"] for n in mine], side="right") - 1, 0, edges.size - 2)
        for b in range(edges.size - 1):
            at = [n for n, i in zip(mine, idx) if i == b]
            judged = [n for n in at if n["judged"]]
            out.append(EntropyBin(d, float(edges[b]), float(edges[b + 1]), len(judged),
                                  _mean([float(n["accepted"]) for n in judged]), len(at),
                                  _mean([a for n in at if (a := alpha(n)) is not None])))
    return out


def _range(xs: Sequence[float]) -> str:
    return f"{min(xs):.2f}-{max(xs):.2f}" if xs else "-"


def paper_claims(rows: Sequence[DomainRow], depths: Sequence[DepthRow], test: VarianceTest | None) -> list[Claim]:
    """The paper's findings, each against ours."""
    p, out = PAPER, []
    el = {r.domain: r.expected_length.value for r in rows if r.expected_length.value is not None}
    if el:
        inside = all(p.expected_length[0] - 0.05 <= v <= p.expected_length[1] + 0.05 for v in el.values())
        out.append(Claim("E[accepted length] per step across domains", "0.91 (maths) - 1.07 (chat)",
                         ", ".join(f"{d} {v:.2f}" for d, v in el.items()),
                         "holds" if inside else "does not hold"))
        above = sorted(d for d, v in el.items() if v > 1.0)
        out.append(Claim("only chat accepts more than 1.0 token per step", "chat only",
                         ", ".join(above) or "none", "holds" if above == ["chat"] else
                         "cannot tell" if "chat" not in el else "does not hold"))
    alphas = [r.mean_alpha for r in rows if r.mean_alpha is not None]
    if alphas:
        inside = all(p.mean_alpha[0] - 0.05 <= a <= p.mean_alpha[1] + 0.05 for a in alphas)
        out.append(Claim("mean alpha = min(1, p/q) per node", "0.52-0.57", _range(alphas),
                         "holds" if inside else "does not hold"))
    for label, get in (("entropy vs alpha", lambda r: r.rho_alpha), ("entropy vs acceptance", lambda r: r.rho_accepted)):
        ests = [(r.domain, get(r)) for r in rows if get(r).value is not None]
        if not ests:
            continue
        if any(e.hi is None for _, e in ests):
            verdict = "cannot tell"
        elif all(e.hi < 0 and e.value > -WEAK_RHO for _, e in ests):
            verdict = "holds"
        elif any(e.lo > 0 or e.value <= -WEAK_RHO for _, e in ests):
            verdict = "does not hold"
        else:
            verdict = "cannot tell"  # some interval includes 0
        out.append(Claim(f"Spearman rho, {label}: weak and negative in every domain",
                         "-0.20 to -0.15 (entropy vs alpha)", ", ".join(f"{d} {e.value:+.2f}" for d, e in ests), verdict))
    if test is not None:
        dom, dep = test.domain, test.depth
        ours = (f"deviance explained: domain {dom.explained:.1f} ({dom.df} df, p={dom.p_given_other:.2g} given depth), "
                f"depth {dep.explained:.1f} ({dep.df} df, p={dep.p_given_other:.2g} given domain)")
        verdict = ("cannot tell" if test.stronger is None or (dom.p_given_other > SIGNIFICANT and dep.p_given_other > SIGNIFICANT)
                   else "holds" if test.stronger == "domain" else "does not hold")
        out.append(Claim("task type predicts acceptance better than depth", "yes", ours, verdict))
    # the paper's profile is of alpha; without draft probabilities, of the judged nodes' acceptance
    every = [r for r in depths if r.domain == "all" and r.judged >= 20]
    by_alpha = all(r.mean_alpha is not None for r in every)
    pooled = [r.mean_alpha if by_alpha else r.acceptance for r in every]
    if len(pooled) >= 2:
        spread = max(pooled) - min(pooled)
        out.append(Claim(f"flat depth profile ({'mean alpha' if by_alpha else 'acceptance of judged nodes'} by depth)",
                         "flat",
                         " / ".join(f"{a:.2f}" for a in pooled) + f" (spread {spread:.2f})",
                         "holds" if spread < FLAT_DEPTH else "does not hold"))
    ent = {r.domain: r.mean_entropy for r in rows if r.mean_entropy is not None}
    acc = {r.domain: r.acceptance for r in rows if r.acceptance is not None}
    if "chat" in ent and "chat" in acc and len(ent) > 1:
        top_h, top_a = max(ent, key=ent.get), max(acc, key=acc.get)
        out.append(Claim("chat has the highest entropy and yet the highest acceptance", "chat, chat",
                         f"highest entropy {top_h} ({ent[top_h]:.2f} nats), highest acceptance {top_a} ({acc[top_a]:.2f})",
                         "holds" if top_h == top_a == "chat" else "does not hold"))
    return out


# ----------------------------------------------------------------------------- the result


@dataclass(frozen=True)
class StudyResult:
    header: RunHeader | None
    settings: StudySettings
    log: str
    notes: list[str]
    prompts: int
    nodes: int
    ran: int  # prompts run now (the rest came from the log)
    domains: list[DomainRow]
    depths: list[DepthRow]
    entropy: list[EntropyBin]
    variance: VarianceTest | None
    claims: list[Claim]
    paper: Paper = field(default_factory=Paper)

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA, **(self.header.to_json() if self.header else {}), "settings": asdict(self.settings),
            "log": self.log, "notes": list(self.notes), "prompts": self.prompts, "nodes": self.nodes, "ran": self.ran,
            "domains": [r.to_json() for r in self.domains], "depths": [asdict(r) for r in self.depths],
            "entropy_bins": [asdict(b) for b in self.entropy],
            "variance": None if self.variance is None else self.variance.to_json(),
            "claims": [asdict(c) for c in self.claims], "paper": asdict(self.paper),
        }


def summarise(nodes: Sequence[dict[str, Any]], settings: StudySettings, header: RunHeader | None = None,
              log: str = "", notes: Sequence[str] = (), prompts: int | None = None, ran: int = 0,
              resamples: int = RESAMPLES, seed: int = 0) -> StudyResult:
    """Every figure of the study from its node records."""
    rows, depths = domain_rows(nodes, resamples, seed), depth_rows(nodes)
    test = domain_vs_depth(nodes)
    n_prompts = prompts if prompts is not None else len({(n["domain"], n["prompt_id"]) for n in nodes})
    notes = list(notes)
    if any(r.prompts < MIN_CLUSTERS for r in rows):
        notes.append(f"no 95% intervals (and no verdict on rho) for domains with fewer than {MIN_CLUSTERS} prompts")
    return StudyResult(header, settings, log, notes, n_prompts, len(nodes), ran, rows, depths,
                       entropy_bins(nodes), test, paper_claims(rows, depths, test))


# ----------------------------------------------------------------------------- running it


def default_draft(lm: Any) -> str:
    """The study's drafter when none is named: the registry's draft model for the target (a
    separate small model that branches, as the paper's TinyLlama), else ``self:L`` with half
    the target's layers."""
    from mlxspec.targets import store

    for d in store.drafts():
        if d["target"] == lm.name and d["present"] and (Path(d["path"]) / "draft.safetensors").is_file():
            return d["name"]
    return f"self:{max(1, lm.config.num_layers // 2)}"


def check_study_args(per_domain: int, max_tokens: int, tree: str, tree_nodes: int | None, temp: float,
                     top_p: float = 1.0, draft: str = "default"):
    """Everything that can be refused before a model loads; returns (shape, params)."""
    from mlxspec.core.sampling import SamplingParams
    from mlxspec.core.tree import parse_tree

    if per_domain < 1:
        raise MlxspecError(f"--prompts-per-domain must be >= 1, got {per_domain}")
    if max_tokens <= 0:
        raise MlxspecError(f"--max-tokens must be > 0, got {max_tokens}")
    shape = parse_tree(tree, tree_nodes)
    if draft in ("none", ""):
        raise MlxspecError("the study needs a drafter that can branch, but --draft is none "
                           "(e.g. --draft smollm2-135m-draft, self:8 or ngram:3)")
    return shape, SamplingParams(temperature=float(temp), top_p=float(top_p))


def run_study(
    model_spec: Any = "default",
    draft: str = "default",
    tree: str = "3x2",
    tree_nodes: int | None = 8,
    temp: float = 0.0,
    top_p: float = 1.0,
    per_domain: int = DEFAULT_PER_DOMAIN,
    max_tokens: int = DEFAULT_MAX_TOKENS,
    seed: int = 0,
    dtype: str = "auto",
    log_path: str | Path | None = None,
    fresh: bool = False,
    progress: Callable[[int, int, str], Any] | None = None,
    resamples: int = RESAMPLES,
    on_log: Callable[[Path, int], Any] | None = None,
    held_out: bool = False,
) -> StudyResult:
    """Run (or resume) the study of ``draft`` on ``model_spec`` and summarise it.

    ``log_path``: the JSON-lines log (default ``default_log_path``); prompts it already holds
    are not run again. ``progress(done, total, label)`` over the prompts still to run;
    ``on_log(path, done_before)`` once the log is open. ``held_out``: pass over the prompts a
    trained draft was distilled on (``distilled_on``); without it, a note says how many of the
    prompts it saw in training. JSON keys (``to_json``): schema, the
    run header (date, machine, backend, blas, mlx_version, mlx_lm_version, model, dtype),
    settings, log, notes, prompts, nodes, ran, domains[{domain, prompts, steps, nodes, judged,
    expected_length{value, lo, hi, n, clusters}, acceptance, mean_alpha, mean_entropy,
    rho_accepted{...}, rho_alpha{...}}], depths[{domain, depth, nodes, judged, accepted,
    acceptance, mean_alpha}], entropy_bins[{domain, lo, hi, judged, acceptance, nodes,
    mean_alpha}], variance{nodes, null_deviance, both_deviance, domain{...}, depth{...},
    stronger}, claims[{claim, paper, ours, verdict}], paper.
    """
    from mlxspec.core.drafters import can_branch
    from mlxspec.measure.runs import encode_prompts, run_header
    from mlxspec.targets import loading
    from mlxspec.targets.drafts import make_drafter

    shape, params = check_study_args(per_domain, max_tokens, tree, tree_nodes, temp, top_p, draft)
    study_prompts(per_domain)  # the data folder, before the model loads

    lm = model_spec if hasattr(model_spec, "model") else loading.load(model_spec, dtype)
    draft = default_draft(lm) if draft == "default" else draft
    seen = distilled_on(draft)
    items, notes = study_prompts(per_domain, skip=seen if held_out else None)
    if seen and not held_out:
        overlap = Counter(it["domain"] for it in items if it["text"] in seen)
        if overlap:
            notes.append(f"{draft} was distilled on {sum(overlap.values())} of these prompts ("
                         + ", ".join(f"{d} {overlap[d]}" for d in DOMAINS if overlap[d])
                         + "): its acceptance there is in-sample; --held-out passes over them")
    drafter = make_drafter(draft, lm, lm.dtype)
    if drafter is None or not can_branch(drafter):
        raise MlxspecError(f"drafter {draft!r} cannot branch: the study drafts trees, which need a draft model, "
                           "self:L, an eagle head or ngram:N")
    session = Session(lm, drafter, tree=shape, log=None)
    stop = session.stop_ids
    ids = encode_prompts(lm, items, max_tokens + shape.nodes)
    settings = StudySettings(lm.name, draft, str(shape), shape.nodes, float(temp), float(top_p), max_tokens, seed,
                             lm.dtype, per_domain, held_out)
    log = StudyLog(log_path or default_log_path(settings), settings, fresh)
    if on_log is not None:
        on_log(log.path, len(log.done & {(it["domain"], it["id"]) for it in items}))
    by_key = {(it["domain"], it["id"]): p for it, p in zip(items, ids)}

    def run_one(it: dict[str, Any]) -> tuple[list[dict], dict]:
        p = by_key[(it["domain"], it["id"])]
        events = session.stream(p, params, max_tokens, seed, stop_ids=stop, node_stats=True)
        return prompt_records(events, it["domain"], it["id"], len(p))

    ran = run_prompts(items, log, run_one, progress)
    wanted = set(by_key)
    nodes = [n for n in log.contents.nodes if (n["domain"], n["prompt_id"]) in wanted]
    if any(n.get("q_draft") is None for n in nodes):
        notes.append(f"{draft} gives no draft probabilities: alpha and its correlations are left out")
    return summarise(nodes, settings, run_header(lm), str(log.path), notes, len(items), ran, resamples, seed)


# ----------------------------------------------------------------------------- output


VERDICT_STYLE = {"holds": "bold green", "does not hold": "bold red", "cannot tell": "yellow"}


def print_study(result: StudyResult, console) -> None:
    """Two rich tables: our figures by domain (with the depth profile), and the paper's claims
    beside ours; then the domain-vs-depth regression."""
    from rich.markup import escape
    from rich.table import Table

    s, h = result.settings, result.header
    temp = "greedy" if s.temperature == 0 else f"T={s.temperature:g}"
    title = (f"acceptance study: {s.model} ({s.dtype}) + {s.draft}, tree {s.tree} ({s.tree_nodes} nodes), {temp}"
             + (f" — {h.backend}" if h else ""))
    table = Table(title=escape(title), caption=escape(
        f"{result.prompts} prompts, {result.nodes} tree nodes, {s.max_tokens} new tokens max per prompt; "
        "E[len]: accepted drafts per tree step, 95% bootstrap over prompts; acc: accepted / judged nodes (parent "
        "accepted); alpha = min(1, p/q) over all nodes; H: target entropy (nats) at the node's parent; rho: Spearman "
        "with H [95% bootstrap over prompts]; path continues: share of steps whose accepted path, having reached "
        "depth d - 1, accepted a node at depth d = 1, 2, ..."))
    for col, just in (("domain", "left"), ("prompts", "right"), ("steps", "right"), ("nodes", "right"),
                      ("E[len]/step", "right"), ("acc", "right"), ("alpha", "right"), ("H", "right"),
                      ("rho(H, accepted)", "right"), ("rho(H, alpha)", "right"), ("path continues", "left")):
        table.add_column(escape(col), justify=just)
    for r in result.domains:
        prof = " ".join(fmt(d.continues, "{:.2f}") for d in result.depths if d.domain == r.domain)
        table.add_row(*map(escape, (
            r.domain, str(r.prompts), str(r.steps), str(r.nodes), r.expected_length.cell("{:.2f}"),
            fmt(r.acceptance, "{:.2f}"), fmt(r.mean_alpha, "{:.2f}"), fmt(r.mean_entropy, "{:.2f}"),
            r.rho_accepted.cell(), r.rho_alpha.cell(), prof)))
    pooled = " ".join(fmt(d.continues, "{:.2f}") for d in result.depths if d.domain == "all")
    table.add_row("all", str(result.prompts), str(sum(r.steps for r in result.domains)), str(result.nodes),
                  "", "", "", "", "", "", pooled, style="dim")
    console.print(table)

    claims = Table(title="the paper's findings beside ours", caption=escape(PAPER.text))
    for col in ("claim", "paper", "ours", "verdict"):
        claims.add_column(col)
    for c in result.claims:
        claims.add_row(escape(c.claim), escape(c.paper), escape(c.ours), f"[{VERDICT_STYLE[c.verdict]}]{c.verdict}[/]")
    console.print(claims)
    v = result.variance
    if v is not None:
        console.print(
            f"logistic regression of accepted on {v.nodes} judged nodes: null deviance {v.null_deviance:.1f}; domain "
            f"alone explains {v.domain.explained:.1f} (pseudo-R² {v.domain.pseudo_r2:.3f}), depth alone "
            f"{v.depth.explained:.1f} (pseudo-R² {v.depth.pseudo_r2:.3f}); both {v.null_deviance - v.both_deviance:.1f}. "
            f"[bold]{v.stronger or 'neither'}[/] explains more.", highlight=False)
    for n in result.notes:
        console.print(f"[yellow]note:[/] {escape(n)}", highlight=False)
    if result.log:
        console.print(f"[dim]log: {escape(result.log)}[/]", highlight=False)


def _figure(size: tuple[float, float]):
    try:
        import matplotlib

        matplotlib.use("Agg")
        from matplotlib.figure import Figure
    except ImportError:
        raise MlxspecError("plotting needs matplotlib: pip install matplotlib") from None
    return Figure(figsize=size, dpi=110, layout="constrained")


def _title(result: StudyResult) -> str:
    s = result.settings
    temp = "greedy" if s.temperature == 0 else f"T={s.temperature:g}"
    return f"{s.model} + {s.draft}, tree {s.tree} ({s.tree_nodes} nodes), {temp}, {result.nodes} nodes"


def plot_study(result: StudyResult, prefix: str | Path) -> list[Path]:
    """Two PNGs, one line per domain (dashed black: all pooled): ``PREFIX-depth.png``, by depth
    in the tree: how often the accepted path goes on to that depth, the acceptance of judged
    nodes and mean alpha; ``PREFIX-entropy.png``: the latter two against binned target entropy."""
    prefix = Path(prefix)
    prefix.parent.mkdir(parents=True, exist_ok=True)
    domains = [r.domain for r in result.domains]
    panels = {
        "continues": "path continues to this depth", "acceptance": "acceptance of judged nodes",
        "mean_alpha": "mean alpha = min(1, p/q)",
    }
    paths = []
    for name, source, keys, xlabel in (
        ("depth", result.depths, ["continues", "acceptance", "mean_alpha"], "depth in the draft tree"),
        ("entropy", result.entropy, ["acceptance", "mean_alpha"], "target entropy at the parent (nats, bin middle)"),
    ):
        fig = _figure((6 * len(keys), 4.6))
        axes = fig.subplots(1, len(keys))
        fig.suptitle(f"acceptance by {name}: {_title(result)}", fontsize=10)
        for d in [*domains, "all"]:
            rows = [r for r in source if r.domain == d]
            style = {"color": "black", "linestyle": "--", "linewidth": 2} if d == "all" else {}
            xs = [r.depth for r in rows] if name == "depth" else [(r.lo + r.hi) / 2 for r in rows]
            for ax, key in zip(axes, keys):
                ys = [getattr(r, key) for r in rows]
                ax.plot(xs, [np.nan if y is None else y for y in ys], marker="o", label=d, **style)
        for ax, key in zip(axes, keys):
            ax.set_ylabel(panels[key])
            ax.set_xlabel(xlabel)
            ax.set_ylim(0, 1.02)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
            if name == "depth":
                ax.set_xticks(sorted({r.depth for r in result.depths}))
        path = prefix.with_name(f"{prefix.name}-{name}.png")
        fig.savefig(path, format="png")
        paths.append(path)
    return paths
