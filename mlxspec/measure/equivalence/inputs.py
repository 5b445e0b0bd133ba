"""What both equivalence checks take: the ``VerifyOptions`` record, the prompts (MT-Bench first
turns, interleaved across categories), the model and the drafter, and ``MethodTotals``, what
one method produced over a check."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from mlxspec.core.drafters import parse_k
from mlxspec.core.sampling import SamplingParams
from mlxspec.errors import MlxspecError
from mlxspec.core.runs import Run
from mlxspec.measure.runs import data_dir, fallback_prompts, jsonl_rows, run_header
from mlxspec.targets import loading
from mlxspec.targets.drafts import make_drafter

MT_BENCH_FILE = "mt_bench_questions.jsonl"
METHODS = ("target_only", "speculative")
# What the CLI's --quick runs (CI). With draft ngram:3: ~100 s on a shared 2-core Linux CPU
# (1,200 sampled + 144 greedy tokens at ~14 tok/s); self:L drafters are slower there (they accept little).
QUICK_SAMPLING = {"tokens": 600, "max_tokens_per_prompt": 48}
QUICK_GREEDY = {"prompts": 3, "greedy_tokens": 24}


@dataclass(frozen=True)
class VerifyOptions:
    """What ``mlxspec verify`` is asked for. ``model``: a spec or a loaded model; the sampling
    check draws about ``tokens`` tokens per method at ``temp``/``top_p``, at most
    ``max_tokens_per_prompt`` a sequence; the greedy check compares ``prompts`` prompts x
    ``greedy_tokens`` tokens."""

    model: Any = "default"
    draft: str = "self:8"
    k: int = 4
    tokens: int = 9200
    temp: float = 1.0
    top_p: float = 1.0
    max_tokens_per_prompt: int = 128
    prompts: int = 20
    greedy_tokens: int = 64
    seed: int = 0
    quick: bool = False

    def checked(self) -> VerifyOptions:
        """The flags checked before a model loads, ``--quick``'s CI-sized counts in place."""
        parse_k(self.k)
        SamplingParams(self.temp, self.top_p)
        o = replace(self, **QUICK_SAMPLING, **QUICK_GREEDY) if self.quick else self
        if o.tokens <= 0 or o.prompts <= 0 or o.greedy_tokens <= 0:
            raise MlxspecError("--tokens, --prompts and --greedy-tokens must be > 0")
        return o


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


def load_model(model_spec: Any) -> Any:
    """A registry name / path, or an already loaded ``LoadedModel`` (tests reuse theirs)."""
    return model_spec if isinstance(model_spec, loading.LoadedModel) else loading.load(model_spec)


def checked_drafter(draft: str, lm: Any) -> Any:
    """The drafter ``draft`` names for ``lm``; refused when it names none."""
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


def result_header(lm: Any, draft: str, k: int) -> dict[str, Any]:
    """The run header's keys, the drafter and K: the top of either check's result."""
    return {**run_header(lm).to_json(), "draft": draft, "k": k}
