"""The shared prompt data (``../shared/data``): GSM8K worked solutions (maths), HumanEval
reference code (code), FOLIO premises with their logic and verdict (reasoning)."""

from __future__ import annotations

import gzip
import json
import random
import re
from pathlib import Path

from mlxspec.training.corpus.records import Example, SourceMissing
from mlxspec.training.corpus.text import pick


def _jsonl(path: Path) -> list[dict]:
    if not path.is_file():
        raise SourceMissing(str(path))
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [json.loads(ln) for ln in f if ln.strip()]


def gsm8k_examples(data_dir: Path, rng: random.Random) -> dict[str, list[Example]]:
    out = []
    for r in _jsonl(data_dir / "gsm8k_test.jsonl"):
        body, _, final = r["answer"].partition("####")
        body = re.sub(r"<<[^>]*>>", "", body).strip()
        resp = f"{body}\nThe answer is {final.strip()}." if final.strip() else body
        prompt = pick(rng, ("{q}", "{q}", "Solve this step by step.\n\n{q}",
                            "{q}\nShow your working.", "Math problem: {q}")).format(q=r["question"])
        out.append(Example("math", prompt, resp, "gsm8k"))
    return {"math": out}


def humaneval_examples(data_dir: Path, rng: random.Random) -> dict[str, list[Example]]:
    out = []
    for r in _jsonl(data_dir / "humaneval.jsonl.gz"):
        code = (r["prompt"] + r["canonical_solution"]).strip("\n")
        prompt = pick(rng, ("Complete this Python function.\n\n{p}",
                            "Implement the following function in Python:\n\n```python\n{p}```",
                            "Write the body of this function so that it does what the docstring says.\n\n{p}"))
        out.append(Example("code", prompt.format(p=r["prompt"]), f"```python\n{code}\n```", "humaneval"))
    return {"code": out}


_FOLIO_VERDICT = {
    "True": "the conclusion follows from the premises: it is true.",
    "False": "the premises contradict the conclusion: it is false.",
    "Uncertain": "the premises neither prove nor refute the conclusion: it is uncertain.",
}


def folio_examples(data_dir: Path, rng: random.Random) -> dict[str, list[Example]]:
    """Each story's verdict, reasoned from its first-order logic where that is given, and once
    per premise set the formalisation itself."""
    out: list[Example] = []
    seen: set[str] = set()
    for r in _jsonl(data_dir / "folio_validation.jsonl"):
        prem = r["premises"] if isinstance(r["premises"], list) else [r["premises"]]
        fol = r.get("premises-FOL") or []
        fol = fol if isinstance(fol, list) else [fol]
        prem = [p.strip() for p in prem if p.strip()]
        listing = "\n".join(f"- {p}" for p in prem)
        verdict = _FOLIO_VERDICT.get(str(r.get("label")))
        if verdict is None:
            continue
        prompt = pick(rng, ("Premises:\n{l}\n\nConclusion: {c}\nIs the conclusion true, false, or uncertain given the premises?",
                            "Given these statements:\n{l}\n\nCan we conclude that \"{c}\"? Answer true, false or uncertain, and explain.",
                            "Logic question. Assume the following:\n{l}\nWhat can you say about this claim: {c}"))
        resp = ""
        if len(fol) == len(prem) and r.get("conclusion-FOL"):
            resp = ("In first-order logic the premises read:\n" + "\n".join(f"- {f}" for f in fol)
                    + f"\nand the conclusion reads: {r['conclusion-FOL']}.\n")
        resp += f"Reasoning from these premises alone, {verdict}"
        out.append(Example("reasoning", prompt.format(l=listing, c=r["conclusion"].strip()), resp, "folio"))
        key = "\n".join(prem)
        if fol and len(fol) == len(prem) and key not in seen:
            seen.add(key)
            p2 = pick(rng, ("Translate these statements into first-order logic, one formula per statement:\n{l}",
                            "Formalise each premise in first-order logic.\n{l}"))
            out.append(Example("reasoning", p2.format(l=listing),
                               "\n".join(f"{i}. {f}" for i, f in enumerate(fol, 1)), "folio"))
    return {"reasoning": out}
