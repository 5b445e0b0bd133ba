"""The study's prompts: four domains (code = HumanEval, maths = GSM8K, logic = FOLIO, chat =
MT-Bench first turns of its open-ended categories) from the shared data folder, in study order,
and the prompts a trained draft was distilled on (so a run can pass over them)."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path
from typing import Any

from mlxspec.errors import MlxspecError
from mlxspec.measure.runs import data_dir, jsonl_rows
from mlxspec.targets.folders import find_draft
from mlxspec.training.distill import training_prompts

DOMAINS: tuple[str, ...] = ("code", "maths", "logic", "chat")
SOURCES: dict[str, str] = {"code": "humaneval.jsonl.gz", "maths": "gsm8k_test.jsonl",
                           "logic": "folio_validation.jsonl", "chat": "mt_bench_questions.jsonl"}
SOURCE_NAMES: dict[str, str] = {"code": "HumanEval", "maths": "GSM8K", "logic": "FOLIO", "chat": "MT-Bench"}
# MT-Bench's open-ended categories; its reasoning, math and coding questions belong to the other domains.
CHAT_CATEGORIES: tuple[str, ...] = ("writing", "roleplay", "extraction", "stem", "humanities")


def read_rows(path: Path) -> list[dict[str, Any]]:
    """The JSON lines of ``path``, gzipped or not."""
    if path.suffix == ".gz":
        with gzip.open(path, "rt", encoding="utf-8") as f:
            return [json.loads(ln) for ln in f if ln.strip()]
    return list(jsonl_rows(path))


def _logic_prompts(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out, seen = [], set()
    for i, r in enumerate(rows):
        premises = r["premises"] if isinstance(r["premises"], list) else [r["premises"]]
        text = ("Premises:\n" + "\n".join(f"- {p}" for p in premises)
                + f"\nDoes it follow that: {r['conclusion']}? Explain step by step.")
        if text not in seen:
            seen.add(text)
            out.append({"id": f"folio/{i}", "text": text})
    return out


def _chat_prompts(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Round-robin over the open-ended categories, so a few prompts still mix them."""
    by_cat: dict[str, list[dict[str, Any]]] = {c: [] for c in CHAT_CATEGORIES}
    for r in rows:
        if r.get("category") in by_cat and r.get("turns"):
            by_cat[r["category"]].append({"id": f"mt_bench/{r['question_id']}", "text": r["turns"][0]})
    out = []
    for i in range(max((len(v) for v in by_cat.values()), default=0)):
        out += [v[i] for v in by_cat.values() if i < len(v)]
    return out


def domain_prompts(domain: str, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """All prompts of a domain in study order: {id, text}."""
    if domain == "code":
        return [{"id": r["task_id"], "text": f"Complete this Python function.\n\n{r['prompt']}"} for r in rows]
    if domain == "maths":
        return [{"id": f"gsm8k/{i}", "text": r["question"]} for i, r in enumerate(rows)]
    if domain == "logic":
        return _logic_prompts(rows)
    return _chat_prompts(rows)


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
            prompts = domain_prompts(d, read_rows(folder / SOURCES[d]))
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
    try:
        prompts, _ = training_prompts(data_dir(), int(m[1]), int(m[2]))
    except (OSError, ValueError, KeyError):
        return None
    return {p["text"] for p in prompts}
