"""The study's run: ``run_study(StudyOptions(...))`` decodes every prompt with tree speculation
through a ``Session``, asking the engine for every verified node's ``events.NodeStats``, logs the
nodes (resuming a log with the same settings), and summarises them into a ``StudyResult``."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from mlxspec.core.drafters import can_branch
from mlxspec.core.sampling import SamplingParams
from mlxspec.core.tree import TreeShape, parse_tree
from mlxspec.errors import MlxspecError
from mlxspec.measure.runs import SCHEMA, RunHeader, encode_prompts, run_header
from mlxspec.measure.study.claims import Claim, Paper, paper_claims
from mlxspec.measure.study.figures import DepthRow, DomainRow, EntropyBin, depth_rows, domain_rows, entropy_bins
from mlxspec.measure.study.log import (
    DEFAULT_MAX_TOKENS,
    DEFAULT_PER_DOMAIN,
    QUICK_MAX_TOKENS,
    QUICK_PER_DOMAIN,
    StudyLog,
    StudySettings,
    default_log_path,
    prompt_records,
    run_prompts,
)
from mlxspec.measure.study.prompts import DOMAINS, distilled_on, study_prompts
from mlxspec.measure.study.stats import MIN_CLUSTERS, RESAMPLES
from mlxspec.measure.study.variance import VarianceTest, domain_vs_depth
from mlxspec.session import Session
from mlxspec.targets import loading, store
from mlxspec.targets.drafts import make_drafter

Progress = Callable[[int, int, str], Any] | None


@dataclass(frozen=True)
class StudyOptions:
    """What ``mlxspec study`` was asked for; a field's name is its flag's. ``model``: a spec or
    a loaded model; ``log``: the JSON-lines log (None: ``default_log_path``); ``held_out``: pass
    over the prompts a trained draft was distilled on (``distilled_on``)."""

    model: Any = "default"
    draft: str = "default"
    tree: str = "3x2"
    tree_nodes: int | None = 8
    temp: float = 0.0
    top_p: float = 1.0
    per_domain: int = DEFAULT_PER_DOMAIN
    max_tokens: int = DEFAULT_MAX_TOKENS
    seed: int = 0
    dtype: str = "auto"
    log: str | Path | None = None
    fresh: bool = False
    held_out: bool = False
    quick: bool = False
    resamples: int = RESAMPLES

    def checked(self) -> StudyOptions:
        """``--quick``'s CI-sized prompt and token counts in place of the ones they stand for,
        then everything that can be refused before a model loads, the prompt data included."""
        o = replace(self, per_domain=QUICK_PER_DOMAIN, max_tokens=QUICK_MAX_TOKENS) if self.quick else self
        o.decoding()
        study_prompts(o.per_domain)  # the data folder, before the model loads
        return o

    def decoding(self) -> tuple[TreeShape, SamplingParams]:
        """The tree shape and sampling the study decodes with, checked."""
        if self.per_domain < 1:
            raise MlxspecError(f"--prompts-per-domain must be >= 1, got {self.per_domain}")
        if self.max_tokens <= 0:
            raise MlxspecError(f"--max-tokens must be > 0, got {self.max_tokens}")
        shape = parse_tree(self.tree, self.tree_nodes)
        if self.draft in ("none", ""):
            raise MlxspecError("the study needs a drafter that can branch, but --draft is none "
                               "(e.g. --draft smollm2-135m-draft, self:8 or ngram:3)")
        return shape, SamplingParams(temperature=float(self.temp), top_p=float(self.top_p))


@dataclass(frozen=True)
class StudyResult:
    """Every figure of a study. ``to_json()``: schema, the run header's keys, settings, log,
    notes, prompts, nodes, ran, domains (``DomainRow``), depths (``DepthRow``), entropy_bins
    (``EntropyBin``), variance (``VarianceTest``), claims (``Claim``), paper."""

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
              resamples: int = RESAMPLES) -> StudyResult:
    """Every figure of the study from its node records; the bootstrap draws from ``settings.seed``."""
    seed = settings.seed
    rows, depths = domain_rows(nodes, resamples, seed), depth_rows(nodes)
    test = domain_vs_depth(nodes)
    n_prompts = prompts if prompts is not None else len({(n["domain"], n["prompt_id"]) for n in nodes})
    notes = list(notes)
    if any(r.prompts < MIN_CLUSTERS for r in rows):
        notes.append(f"no 95% intervals (and no verdict on rho) for domains with fewer than {MIN_CLUSTERS} prompts")
    return StudyResult(header, settings, log, notes, n_prompts, len(nodes), ran, rows, depths,
                       entropy_bins(nodes), test, paper_claims(rows, depths, test))


def default_draft(lm: Any) -> str:
    """The study's drafter when none is named: the registry's draft model for the target (a
    separate small model that branches, as the paper's TinyLlama), else ``self:L`` with half
    the target's layers."""
    for d in store.drafts():
        if d["target"] == lm.name and d["present"] and (Path(d["path"]) / "draft.safetensors").is_file():
            return d["name"]
    return f"self:{max(1, lm.config.num_layers // 2)}"


def _prompts_for(draft: str, options: StudyOptions) -> tuple[list[dict[str, Any]], list[str]]:
    """The study's prompts and notes; with ``held_out`` the draft's training prompts passed
    over, else a note saying how many of them it saw in training."""
    seen = distilled_on(draft)
    items, notes = study_prompts(options.per_domain, skip=seen if options.held_out else None)
    if seen and not options.held_out:
        overlap = Counter(it["domain"] for it in items if it["text"] in seen)
        if overlap:
            notes.append(f"{draft} was distilled on {sum(overlap.values())} of these prompts ("
                         + ", ".join(f"{d} {overlap[d]}" for d in DOMAINS if overlap[d])
                         + "): its acceptance there is in-sample; --held-out passes over them")
    return items, notes


def _branching_session(lm: Any, draft: str, shape: TreeShape) -> Session:
    drafter = make_drafter(draft, lm, lm.dtype)
    if drafter is None or not can_branch(drafter):
        raise MlxspecError(f"drafter {draft!r} cannot branch: the study drafts trees, which need a draft model, "
                           "self:L, an eagle head or ngram:N")
    return Session(lm, drafter, tree=shape, log=None)


def run_study(options: StudyOptions, progress: Progress = None,
              on_log: Callable[[Path, int], Any] | None = None) -> StudyResult:
    """Run (or resume) the study ``options`` asks for and summarise it. Prompts the log already
    holds are not run again; ``progress(done, total, label)`` over the prompts still to run;
    ``on_log(path, done_before)`` once the log is open."""
    o = options
    shape, params = o.decoding()
    lm = loading.as_loaded(o.model, o.dtype)
    draft = default_draft(lm) if o.draft == "default" else o.draft
    items, notes = _prompts_for(draft, o)
    session = _branching_session(lm, draft, shape)
    stop = session.stop_ids
    ids = encode_prompts(lm, items, o.max_tokens + shape.nodes)
    settings = StudySettings(lm.name, draft, str(shape), shape.nodes, float(o.temp), float(o.top_p), o.max_tokens,
                             o.seed, lm.dtype, o.per_domain, o.held_out)
    log = StudyLog(o.log or default_log_path(settings), settings, o.fresh)
    by_key = {(it["domain"], it["id"]): p for it, p in zip(items, ids)}
    if on_log is not None:
        on_log(log.path, len(log.done & set(by_key)))

    def run_one(it: dict[str, Any]) -> tuple[list[dict], dict]:
        p = by_key[(it["domain"], it["id"])]
        events = session.stream(p, params, o.max_tokens, o.seed, stop_ids=stop, node_stats=True)
        return prompt_records(events, it["domain"], it["id"], len(p))

    ran = run_prompts(items, log, run_one, progress)
    nodes = [n for n in log.contents.nodes if (n["domain"], n["prompt_id"]) in by_key]
    if any(n.get("q_draft") is None for n in nodes):
        notes.append(f"{draft} gives no draft probabilities: alpha and its correlations are left out")
    return summarise(nodes, settings, run_header(lm), str(log.path), notes, len(items), ran, o.resamples)
