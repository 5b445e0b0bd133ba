"""Offline, deterministic chat examples for draft-head training, broad enough for what users ask.

Every example is a (prompt, response) pair whose *response* is real text: the target is later
teacher-forced over it and its hidden states at the response positions become training
features, so nothing here is invented. Responses are worked solutions and reference code from
the public sets in ``../shared/data`` (GSM8K, HumanEval, FOLIO), or a passage of openly
licensed text from Debian packages, or a faithful piece of one (the lead sentences for
"summarize", the marked-up names for "extract", the sentence that answers a question about a
passage, the English original of a German manual page for "translate"). Licences and what was
taken from each source are in ``SOURCES.md`` next to this file.

Categories (``CATEGORIES``) cover Spec-Bench's six subtasks and MT-Bench's eight: chat and
instructions, closed-book questions (qa), writing, roleplay, extraction, translation (German
<-> English), summarization, question answering over a given document (rag), maths, code and
reasoning.

No benchmark text is ever used: every prompt and response is checked against each turn of
``spec_bench_questions.jsonl`` and ``mt_bench_questions.jsonl`` with
``distill.is_benchmark`` (equal after normalisation, or one contains the other). A word-trigram
pre-filter, a necessary condition for a match, keeps that check cheap.

A source whose package is not installed is skipped with a warning and reported in the stats as
``source/<name>/missing = 1``; ``make draft-data-deps`` installs the packages.
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
import re
import warnings
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from mlxspec.targets.store import data_dir
from mlxspec.training.distill import benchmark_texts, is_benchmark, normalise

CATEGORIES = ("chat", "qa", "writing", "roleplay", "extraction", "translation", "summarization",
              "rag", "math", "code", "reasoning")

MAX_PASSAGE = 1200  # characters of a passage shown in a prompt
MAX_RESPONSE = 1600  # characters of a response: long ones dominate teacher-forcing cost


@dataclass(frozen=True)
class Example:
    category: str
    prompt: str
    response: str
    source: str


@dataclass(frozen=True)
class PackagePaths:
    """Where the Debian packages put their text; tests point these at small fake trees."""

    python_doc: Path = Path("/usr/share/doc/python3.11/html/_sources")  # python3.11-doc
    wordnet: Path = Path("/usr/share/wordnet")  # wordnet-base
    fortunes: Path = Path("/usr/share/games/fortunes")  # fortunes, fortunes-min
    man_de: Path = Path("/usr/share/man/de")  # manpages-de
    man_en: Path = Path("/usr/share/man")  # the English originals, from the packages owning them
    dpkg_info: Path | None = Path("/var/lib/dpkg/info")  # owner of each English page; None: don't ask


def system_paths() -> PackagePaths:
    """Where this machine's packages put their text (the test session points it at nothing)."""
    return PackagePaths()


class SourceMissing(Exception):
    pass


# ----------------------------------------------------------------------------------------------
# Benchmark guard


class BenchmarkGuard:
    """``is_benchmark`` over Spec-Bench and MT-Bench turns, with an exact pre-filter.

    If a text t (>= 40 chars) lies inside a benchmark turn b, then t's 2nd-4th words are a word
    trigram of b; if b lies inside t, then b's 2nd-4th words are a trigram of t. Texts that pass
    neither test (and are not equal to a turn) cannot match, so only candidates pay for the
    full scan. Texts too short for the trigram argument always get the full check."""

    def __init__(self, data_dir: Path):
        bench = list(benchmark_texts(data_dir))
        mt = data_dir / "mt_bench_questions.jsonl"
        if mt.is_file():
            for line in mt.read_text(encoding="utf-8").splitlines():
                if line.strip():
                    bench.extend(normalise(t) for t in json.loads(line).get("turns", []))
        self.bench = list(dict.fromkeys(bench))
        self.bench_set = set(self.bench)
        self.trigrams: set[tuple[str, ...]] = set()
        self.keys: set[tuple[str, ...]] = set()
        self.unkeyed: list[str] = []  # long turns with too few words for a key
        for b in self.bench:
            w = b.split(" ")
            self.trigrams.update(zip(w, w[1:], w[2:]))
            if len(w) >= 5:
                self.keys.add(tuple(w[1:4]))
            elif len(b) >= 40:
                self.unkeyed.append(b)

    def __len__(self) -> int:
        return len(self.bench)

    def hit(self, text: str) -> bool:
        t = normalise(text)
        if t in self.bench_set:
            return True
        if len(t) < 40:
            return False  # is_benchmark needs an exact match below 40 characters
        w = t.split(" ")
        if len(w) < 5:
            return is_benchmark(text, self.bench, self.bench_set)
        candidate = tuple(w[1:4]) in self.trigrams
        if not candidate and self.keys:
            candidate = not self.keys.isdisjoint(zip(w, w[1:], w[2:]))
        if not candidate:
            candidate = any(b in t for b in self.unkeyed)
        return candidate and is_benchmark(text, self.bench, self.bench_set)


# ----------------------------------------------------------------------------------------------
# Small text helpers

_SENT = re.compile(r"(?<=[.!?])\s+(?=[A-Z`\"'(\[])")


def sentences(text: str) -> list[str]:
    return [s.strip() for s in _SENT.split(text.strip()) if s.strip()]


def _clip(text: str, limit: int) -> str:
    """The longest run of whole sentences (at least one) within ``limit`` characters."""
    if len(text) <= limit:
        return text
    out = ""
    for s in sentences(text):
        if out and len(out) + 1 + len(s) > limit:
            break
        out = f"{out} {s}".strip()
    return out


def _pick(rng: random.Random, options: list[str] | tuple[str, ...]) -> str:
    return options[rng.randrange(len(options))]


def _strip_punct(text: str) -> str:
    return re.sub(r"[^\w\s'-]", "", text).lower()


# ----------------------------------------------------------------------------------------------
# ../shared/data: GSM8K (maths), HumanEval (code), FOLIO (reasoning)


def _jsonl(path: Path) -> list[dict]:
    if not path.is_file():
        raise SourceMissing(str(path))
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [json.loads(ln) for ln in f if ln.strip()]


def _gsm8k(data_dir: Path, rng: random.Random) -> dict[str, list[Example]]:
    out = []
    for r in _jsonl(data_dir / "gsm8k_test.jsonl"):
        body, _, final = r["answer"].partition("####")
        body = re.sub(r"<<[^>]*>>", "", body).strip()
        resp = f"{body}\nThe answer is {final.strip()}." if final.strip() else body
        prompt = _pick(rng, ("{q}", "{q}", "Solve this step by step.\n\n{q}",
                             "{q}\nShow your working.", "Math problem: {q}")).format(q=r["question"])
        out.append(Example("math", prompt, resp, "gsm8k"))
    return {"math": out}


def _humaneval(data_dir: Path, rng: random.Random) -> dict[str, list[Example]]:
    out = []
    for r in _jsonl(data_dir / "humaneval.jsonl.gz"):
        code = (r["prompt"] + r["canonical_solution"]).strip("\n")
        prompt = _pick(rng, ("Complete this Python function.\n\n{p}",
                             "Implement the following function in Python:\n\n```python\n{p}```",
                             "Write the body of this function so that it does what the docstring says.\n\n{p}"))
        out.append(Example("code", prompt.format(p=r["prompt"]), f"```python\n{code}\n```", "humaneval"))
    return {"code": out}


_FOLIO_VERDICT = {
    "True": "the conclusion follows from the premises: it is true.",
    "False": "the premises contradict the conclusion: it is false.",
    "Uncertain": "the premises neither prove nor refute the conclusion: it is uncertain.",
}


def _folio(data_dir: Path, rng: random.Random) -> dict[str, list[Example]]:
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
        prompt = _pick(rng, ("Premises:\n{l}\n\nConclusion: {c}\nIs the conclusion true, false, or uncertain given the premises?",
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
            p2 = _pick(rng, ("Translate these statements into first-order logic, one formula per statement:\n{l}",
                             "Formalise each premise in first-order logic.\n{l}"))
            out.append(Example("reasoning", p2.format(l=listing),
                               "\n".join(f"{i}. {f}" for i, f in enumerate(fol, 1)), "folio"))
    return {"reasoning": out}


# ----------------------------------------------------------------------------------------------
# python3.11-doc: the reStructuredText sources of the Python documentation


@dataclass
class _Block:
    kind: str  # title | para | code | api | term
    text: str
    title: str = ""  # section title the block sits in
    name: str = ""  # api / term name
    sig: str = ""  # api signature
    body: list[str] = field(default_factory=list)  # api / term description paragraphs
    raw: str = ""  # para: the reStructuredText source


_API = {"function", "method", "class", "exception", "attribute", "data", "decorator",
        "classmethod", "staticmethod", "coroutinefunction", "coroutinemethod", "abstractmethod"}
_CODE = {"code-block", "sourcecode", "doctest", "testcode", "code"}
_UNDER = re.compile(r"^([=\-~^\"*#+'`:.])\1{2,}\s*$")
_ROLE = re.compile(r":(?:[\w-]+:)*([\w-]+):`([^`]+)`")
_PLAIN_ROLES = {"ref", "doc", "term", "dfn", "emphasis", "strong", "abbr", "title-reference", "index"}


def _role(m: re.Match) -> str:
    role, content = m.group(1).lower(), m.group(2).strip()
    lt = re.match(r"(.*?)\s*<[^>]*>$", content, re.S)
    if lt and lt.group(1):
        content = lt.group(1)
    if role == "abbr":
        content = re.sub(r"\s*\(.*\)$", "", content)
    if content.startswith("~"):
        content = content[1:].split(".")[-1]
    content = content.lstrip("!")
    if role == "pep":
        return f"PEP {content}"
    if role == "rfc":
        return f"RFC {content}"
    if role in _PLAIN_ROLES:
        return content
    if role in ("func", "meth") and not content.endswith(")"):
        content += "()"
    return f"`{content}`"


def rst_inline(text: str) -> str | None:
    """reStructuredText inline markup as plain text with `code` spans; None if unclear."""
    spans: list[str] = []

    def keep(span: str) -> str:
        spans.append(span)
        return f"\x01{len(spans) - 1}\x02"

    s = re.sub(r"``(.+?)``", lambda m: keep(f"`{m.group(1)}`"), text, flags=re.S)
    s = _ROLE.sub(lambda m: keep(_role(m)), s)
    s = re.sub(r"\s*\[(?:#\w*|\d+)\]_", "", s)  # footnote references
    s = re.sub(r"(?<![`\w])`([^`<]+?)\s*<[^>`]+>`__?", r"\1", s)  # hyperlinks
    s = re.sub(r"(?<![`\w])`([^`]+)`__?(?!\w)", r"\1", s)
    s = re.sub(r"\*\*(.+?)\*\*", r"\1", s)
    s = re.sub(r"(?<![\w*])\*(?![\s*])(.+?)(?<!\s)\*(?![\w*])", r"\1", s)
    s = s.replace("|release|", "3.11").replace("|version|", "3.11").replace("\\ ", "")
    if re.search(r":[\w-]+:`|\|\w+\||\.\. |\\|\x01|\x02", re.sub(r"\x01\d+\x02", "", s)):
        return None
    s = re.sub(r"\x01(\d+)\x02", lambda m: spans[int(m.group(1))], s)
    return re.sub(r"\s+", " ", s).strip()


def rst_blocks(text: str) -> list[_Block]:
    """A simple reading of one .rst file: titles, paragraphs, code, API entries, glossary terms."""
    lines = text.expandtabs(8).splitlines()
    n = len(lines)
    out: list[_Block] = []
    title = ""

    def indent(s: str) -> int:
        return len(s) - len(s.lstrip(" "))

    def body_from(i: int, ind: int) -> tuple[list[str], int]:
        body = []
        while i < n and (not lines[i].strip() or indent(lines[i]) > ind):
            body.append(lines[i])
            i += 1
        while body and not body[-1].strip():
            body.pop()
        if body:
            cut = min(indent(b) for b in body if b.strip())
            body = [b[cut:] for b in body]
        return body, i

    def paras(body: list[str]) -> list[str]:
        out_p, cur = [], []
        for b in body + [""]:
            if b.strip() and not b.startswith(" ") and not b.lstrip().startswith((".. ", ":")):
                cur.append(b.strip())
            else:
                if cur:
                    out_p.append(" ".join(cur))
                cur = []
                if b.strip():  # an indented or directive line ends the leading description
                    break
        return out_p

    i = 0
    while i < n:
        line = lines[i]
        s = line.strip()
        if not s:
            i += 1
            continue
        ind = indent(line)
        if i + 1 < n and _UNDER.match(lines[i + 1].strip()) and len(lines[i + 1].strip()) >= len(s) and not _UNDER.match(s):
            title = rst_inline(s) or s
            out.append(_Block("title", title, title))
            i += 2
            continue
        if _UNDER.match(s):
            i += 1
            continue
        m = re.match(r"\.\. ([\w:-]+)::\s*(.*)$", s)
        if s.startswith(".. "):
            body, j = body_from(i + 1, ind)
            name = m.group(1).split(":")[-1] if m else ""
            if name in _API and m:
                sig = m.group(2).strip()
                nm = re.match(r"([\w.]+)", sig)
                desc = [p for p in (rst_inline(x) for x in paras([b for b in body if not b.startswith(":")])) if p]
                if nm and desc:
                    out.append(_Block("api", desc[0], title, nm.group(1), sig, desc))
            elif name in _CODE and body:
                out.append(_Block("code", "\n".join(b for b in body if not b.startswith(":")).strip(), title))
            elif name == "glossary":
                k = 0
                while k < len(body):
                    if body[k].strip() and not body[k].startswith(" "):
                        term = body[k].strip()
                        sub, k2 = [], k + 1
                        while k2 < len(body) and (not body[k2].strip() or body[k2].startswith(" ")):
                            sub.append(body[k2])
                            k2 += 1
                        cut = min((len(x) - len(x.lstrip()) for x in sub if x.strip()), default=0)
                        desc = [p for p in (rst_inline(x) for x in paras([x[cut:] for x in sub])) if p]
                        if desc:
                            out.append(_Block("term", desc[0], title, term, "", desc))
                        k = k2
                    else:
                        k += 1
            i = j
            continue
        # a paragraph: lines at this indent up to a blank line
        j = i
        cur = []
        while j < n and lines[j].strip() and indent(lines[j]) == ind:
            cur.append(lines[j].strip())
            j += 1
        raw = "\n".join(cur)
        if cur[0].startswith(">>>"):
            out.append(_Block("code", "\n".join(lines[k][ind:] for k in range(i, j)).rstrip(), title))
            i = j
            continue
        if (cur[0].startswith(("+-", "==", "|")) or re.match(r"^[-*#]\s|^\d+\.\s|^#\.\s", cur[0])
                or any(re.search(r"\S {3,}\S|^=+ +=", c) for c in cur)):
            i = j  # tables, line blocks and lists are left out
            continue
        literal = raw.endswith("::")
        if literal:
            raw = raw[:-2].rstrip() + (":" if not raw[:-2].endswith(" ") and raw[:-2].strip() else "")
        text_ = rst_inline(raw) if raw.strip() else None
        if text_ and ind == 0:
            out.append(_Block("para", text_, title, raw=raw))
        i = j
        if literal:
            while i < n and not lines[i].strip():
                i += 1
            body, i = body_from(i - 1, ind) if i < n and indent(lines[i]) > ind else ([], i)
            if body:
                out.append(_Block("code", "\n".join(body).strip(), title))
    return out


_PY_SKIP_DIRS = ("whatsnew", "c-api", "distutils", "install", "includes")


def _python_doc(paths: PackagePaths, rng: random.Random) -> dict[str, list[Example]]:
    root = paths.python_doc
    if not root.is_dir():
        raise SourceMissing(str(root))
    files = sorted(p for p in root.rglob("*.txt")
                   if not p.relative_to(root).parts[0] in _PY_SKIP_DIRS and p.name not in ("license.rst.txt", "copyright.rst.txt"))
    if not files:
        raise SourceMissing(f"no .rst.txt under {root}")
    out: dict[str, list[Example]] = {c: [] for c in CATEGORIES}
    src = "python3.11-doc"

    def add(cat: str, prompt: str, resp: str) -> None:
        if resp and len(resp) <= MAX_RESPONSE:
            out[cat].append(Example(cat, prompt, resp, src))

    for path in files:
        rel = path.relative_to(root).as_posix()
        module = re.sub(r"\.rst\.txt$", "", path.name) if rel.startswith("library/") else ""
        blocks = rst_blocks(path.read_text(encoding="utf-8", errors="replace"))
        apis = [b for b in blocks if b.kind == "api"]
        terms = [b for b in blocks if b.kind == "term"]
        # sections: consecutive paragraphs under one title
        sections: dict[str, list[_Block]] = {}
        for b in blocks:
            if b.kind == "para" and b.title and not b.text.endswith(":") and not b.text[:1].islower():
                sections.setdefault(b.title, []).append(b)
        for b in apis:
            call = f"{b.name}()" if b.kind == "api" and re.search(r"\(", b.sig) else b.name
            where = f" in Python's `{module}` module" if module else " in Python"
            desc = _clip(" ".join(b.body[:2]), 900)
            add("qa", _pick(rng, (f"What does `{call}` do{where}?", f"Explain `{b.sig}`{where}.",
                                   f"In Python, what is `{call}` used for?")), desc)
            if len(b.body) >= 1 and len(sentences(b.body[0])) >= 2:
                add("chat", _pick(rng, (f"I'm reading about `{call}`{where}. Can you describe it briefly?",
                                        f"Quick question: how does `{call}` behave?")), desc)
        for b in terms:
            add("qa", _pick(rng, (f"In Python terminology, what is {_article(b.name)}{b.name}?",
                                   f"What does the term \"{b.name}\" mean in Python?")), _clip(" ".join(b.body[:2]), 900))
        # rag: one API entry asked about, shown among neighbours from the same page
        for k, b in enumerate(apis):
            if len(apis) < 2:
                break
            others = [a for a in apis if a.name != b.name]
            docs = [b] + [others[(k + d) % len(others)] for d in range(1, min(3, len(others) + 1))]
            docs = list({d.name: d for d in docs}.values())
            rng.shuffle(docs)
            pos = docs.index(b) + 1
            shown = "\n\n".join(f"[{q}] `{d.sig}`: {_clip(' '.join(d.body[:2]), 400)}" for q, d in enumerate(docs, 1))
            first = sentences(b.body[0])[0]
            add("rag", _pick(rng, ("{docs}\n\nUsing only the documents above: what does `{n}` do?",
                                   "Answer from the passages.\n\n{docs}\n\nQuestion: what is `{n}` for?",
                                   "Documentation excerpts:\n{docs}\n\nBased on these excerpts, describe `{n}`.")).format(docs=shown, n=b.name),
                f"According to document [{pos}], `{b.sig}`: {first}")
        # extraction: the API names or glossary terms of a passage
        for k in range(0, len(apis) - 2, 3):
            group = apis[k:k + 3]
            shown = "\n\n".join(f"{g.sig}\n    {_clip(g.body[0], 300)}" for g in group)
            add("extraction", _pick(rng, ("List the names of the functions, classes or attributes documented in this text:\n\n{t}",
                                          "Extract every documented name from the following reference text, one per line.\n\n{t}")).format(t=shown),
                "\n".join(f"- {g.name}" for g in group))
        for k in range(0, len(terms) - 2, 3):
            group = terms[k:k + 3]
            shown = "\n\n".join(f"{g.name}\n    {_clip(g.body[0], 300)}" for g in group)
            add("extraction", _pick(rng, ("Extract the defined terms from this glossary excerpt.\n\n{t}",
                                          "Which terms does this glossary excerpt define?\n\n{t}")).format(t=shown),
                "\n".join(f"- {g.name}" for g in group))
        # code: an explanatory paragraph and the code that follows it
        for k, b in enumerate(blocks):
            if b.kind != "code" or not (40 <= len(b.text) <= 1000) or not b.title:
                continue
            lead = blocks[k - 1] if k and blocks[k - 1].kind == "para" else None
            lang = "pycon" if b.text.startswith(">>>") else "python"
            if lang == "python" and not re.search(r"\b(def|import|print|for|class|return|=)\b|=", b.text):
                continue
            resp = (f"{lead.text}\n\n" if lead and len(lead.text) < 600 else "") + f"```{lang}\n{b.text}\n```"
            topic = b.title.rstrip(".:")
            add("code", _pick(rng, (f"Show me a short Python example about: {topic}.",
                                     f"Give a Python code example illustrating \"{topic}\"" + (f" (from the `{module}` docs)." if module else "."),
                                     f"How would I write code for this in Python: {topic}?")), resp)
        for title, ps in sections.items():
            text = " ".join(p.text for p in ps)
            sents = sentences(text)
            passage = _clip(text, MAX_PASSAGE)
            psents = sentences(passage)
            topic = title.rstrip(".:")
            if len(psents) >= 4:
                lead = " ".join(psents[:2])
                add("summarization", _pick(rng, ("Summarize the following passage in two sentences.\n\n{p}",
                                                 "Give a short summary of this text:\n\n{p}",
                                                 "TL;DR of the passage below, please.\n\n{p}")).format(p=passage), lead)
                add("summarization", _pick(rng, ("Suggest a title for this passage.\n\n{p}",
                                                 "What is a good heading for the following section?\n\n{p}")).format(p=passage),
                    f"A fitting title is \"{topic}\".")
                k = rng.randrange(1, len(psents))
                target = psents[k]
                words = re.findall(r"`[^`]+`", target)
                if words:
                    add("rag", _pick(rng, ("Read the passage and answer the question.\n\n{p}\n\nQuestion: what does the passage say about {w}?",
                                           "{p}\n\nBased on the text above, what is said about {w}?")).format(p=passage, w=words[0]),
                        f"The passage says: {target}")
            if 2 <= len(sents) and 150 <= len(passage):
                add("chat", _pick(rng, (f"Can you explain \"{topic}\" in Python?", f"Tell me about {topic} (Python).",
                                        f"I'm learning Python. What should I know about {topic.lower()}?")), passage)
                add("roleplay", _pick(rng, (f"You are a patient Python tutor. A student asks you about \"{topic}\". Answer them.",
                                            f"Act as the Python documentation and explain {topic}.",
                                            f"Pretend you are a senior developer mentoring a new colleague on {topic.lower()}. What do you tell them?")),
                    passage)
            if 2 <= len(psents) <= 8 and 120 <= len(passage) <= 700:
                kind = rng.randrange(3)
                if kind == 0:
                    add("writing", "Rewrite this passage as a bulleted list, one sentence per bullet.\n\n" + passage,
                        "\n".join(f"- {x}" for x in psents))
                elif kind == 1:
                    add("writing", "Restore the capitalisation and punctuation of this text:\n\n" + _strip_punct(passage), passage)
                elif ps[0].raw != ps[0].text and len(ps[0].raw) <= 700:
                    add("writing", "Rewrite this reStructuredText as plain prose without markup.\n\n" + ps[0].raw, ps[0].text)
    return out


def _article(word: str) -> str:
    return "an " if word[:1].lower() in "aeiou" else "a "


# ----------------------------------------------------------------------------------------------
# wordnet-base: definitions, examples, synonyms, antonyms and the is-a hierarchy


@dataclass
class _Synset:
    pos: str
    words: list[str]
    definition: str
    examples: list[str]
    hypernyms: list[str]
    antonyms: list[str]


_POS = {"noun": "noun", "verb": "verb", "adj": "adjective", "adv": "adverb"}


def read_wordnet(root: Path) -> dict[str, _Synset]:
    out: dict[str, _Synset] = {}
    found = False
    for pos in _POS:
        path = root / f"data.{pos}"
        if not path.is_file():
            continue
        found = True
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("  ") or "|" not in line:
                    continue
                head, gloss = line.split("|", 1)
                t = head.split()
                try:
                    off, ss_type, nw = t[0], t[2], int(t[3], 16)
                    words = [re.sub(r"\(\w+\)$", "", t[4 + 2 * k]).replace("_", " ") for k in range(nw)]
                    p = 4 + 2 * nw
                    npt = int(t[p])
                    hyper, anto = [], []
                    for k in range(npt):
                        sym, tgt, tpos, st = t[p + 1 + 4 * k: p + 5 + 4 * k]
                        key = f"{tgt}{'a' if tpos == 's' else tpos}"
                        if sym in ("@", "@i"):
                            hyper.append(key)
                        elif sym == "!":
                            anto.append(key)
                except (IndexError, ValueError):
                    continue
                parts = [x.strip() for x in gloss.strip().split(";")]
                examples = [x.strip().strip('"') for x in parts if x.startswith('"') and x.endswith('"')]
                definition = "; ".join(x for x in parts if not x.startswith('"')).strip()
                if not definition:
                    continue
                out[f"{off}{'a' if ss_type == 's' else ss_type}"] = _Synset(
                    _POS[pos], words, definition, [e for e in examples if len(e) > 8], hyper, anto)
    if not found:
        raise SourceMissing(f"no data.noun/verb/adj/adv under {root}")
    return out


def _chain(syn: dict[str, _Synset], key: str, depth: int) -> list[_Synset]:
    chain = [syn[key]]
    while len(chain) <= depth and chain[-1].hypernyms and chain[-1].hypernyms[0] in syn:
        nxt = syn[chain[-1].hypernyms[0]]
        if nxt in chain:
            break
        chain.append(nxt)
    return chain


def _wordnet(paths: PackagePaths, rng: random.Random, want: int) -> dict[str, list[Example]]:
    syn = read_wordnet(paths.wordnet)
    keys = sorted(syn)
    rng.shuffle(keys)
    out: dict[str, list[Example]] = {c: [] for c in CATEGORIES}
    src = "wordnet-base"
    by_word: dict[str, list[str]] = {}
    for k in sorted(syn):
        for w in syn[k].words[:1]:
            by_word.setdefault(w.lower(), []).append(k)

    def add(cat: str, prompt: str, resp: str) -> None:
        if len(out[cat]) < want:
            out[cat].append(Example(cat, prompt, resp, src))

    for idx, k in enumerate(keys):
        s = syn[k]
        w = s.words[0]
        if not re.fullmatch(r"[A-Za-z][A-Za-z' -]*", w) or w[0].isupper():
            continue  # skip proper names and odd entries
        ex = next((e for e in s.examples if w.lower() in e.lower()), None)
        d = s.definition
        resp = f"As {_article(s.pos)}{s.pos}, \"{w}\" means: {d}."
        if ex:
            resp += f" For example: \"{ex}\"."
        add("qa", _pick(rng, (f"What does the word \"{w}\" mean?", f"Define \"{w}\".", f"What is the meaning of {w}?",
                              f"What's the definition of the {s.pos} \"{w}\"?")), resp)
        if ex:
            add("chat", _pick(rng, (f"Use the word \"{w}\" in a sentence.", f"Give me an example sentence with \"{w}\".")),
                f"Here is one, using \"{w}\" in the sense \"{d}\": \"{ex[0].upper() + ex[1:]}\"")
        if len(s.words) >= 3:
            others = ", ".join(f"\"{x}\"" for x in s.words[1:6])
            add("chat", _pick(rng, (f"Give me some synonyms for \"{w}\".", f"What are other words for \"{w}\"?",
                                    f"Suggest alternatives to the word \"{w}\".")),
                f"In the sense \"{d}\", words with the same meaning as \"{w}\" are {others}.")
        if s.antonyms and s.antonyms[0] in syn:
            a = syn[s.antonyms[0]]
            add("chat", _pick(rng, (f"What is the opposite of \"{w}\"?", f"Give me an antonym of \"{w}\".")),
                f"The opposite of \"{w}\" ({d}) is \"{a.words[0]}\" ({a.definition}).")
        if s.pos == "noun":
            ch = _chain(syn, k, 6)
            names = [c.words[0] for c in ch]
            if len(ch) >= 4 and len(set(names)) == len(names):
                top = names[-1]
                steps = ", ".join(f"{_article(a)}{a} is a kind of {b}" for a, b in zip(names, names[1:]))
                add("reasoning", _pick(rng, (f"Is {_article(w)}{w} a kind of {top}? Explain your reasoning.",
                                             f"Reason step by step: is every {w} {_article(top)}{top}?")),
                    f"Yes. Step by step: {steps}. Since each step is a kind-of relation, {_article(w)}{w} is a kind of {top}.")
                a, b, c = names[0], names[1], names[2]
                add("reasoning", f"Every {a} is {_article(b)}{b}, and every {b} is {_article(c)}{c}. "
                                 f"Does it follow that every {a} is {_article(c)}{c}?",
                    f"Yes. Every {a} is {_article(b)}{b}, and every {b} is {_article(c)}{c}, so by transitivity every {a} "
                    f"is {_article(c)}{c}. This is a valid syllogism (Barbara): the conclusion follows from the two premises.")
        if s.examples:
            entry = f"{w} ({s.pos}): {d}; " + "; ".join(f"\"{e}\"" for e in s.examples)
            add("extraction", _pick(rng, ("Extract the example sentences from this dictionary entry.\n\n{e}",
                                          "From the dictionary entry below, list the usage examples only.\n\n{e}")).format(e=entry),
                "\n".join(f"- {e}" for e in s.examples))
        senses = by_word.get(w.lower(), [])
        if 2 <= len(senses) <= 8 and ex and idx % 2 == 0:
            listing = "\n".join(f"{n}. ({syn[x].pos}) {syn[x].definition}" for n, x in enumerate(senses, 1))
            pos = senses.index(k) + 1
            add("rag", _pick(rng, ("Dictionary entry for \"{w}\":\n{l}\n\nWhich sense is used in: \"{e}\"?",
                                   "Here are the senses of \"{w}\":\n{l}\n\nQuestion: in the sentence \"{e}\", which sense applies?")).format(w=w, l=listing, e=ex),
                f"Sense {pos}: {d}.")
        if idx % 3 == 0:
            picks = [keys[(idx + j * 7919) % len(keys)] for j in range(1, 4)]
            docs = [k] + [p for p in picks if syn[p].words[0] != w]
            rng.shuffle(docs)
            listing = "\n".join(f"- {syn[x].words[0]}: {syn[x].definition}" for x in docs)
            add("rag", _pick(rng, ("Glossary:\n{l}\n\nUsing the glossary, which word means \"{d}\"?",
                                   "{l}\n\nAccording to the list above, what is the term for: {d}?")).format(l=listing, d=d),
                f"The glossary defines \"{w}\" as \"{d}\", so the word is \"{w}\".")
        if all(len(v) >= want for c, v in out.items() if c in ("qa", "chat", "reasoning", "extraction", "rag")):
            break
    return out


# ----------------------------------------------------------------------------------------------
# fortunes: short quotations, jokes, riddles and poems

FORTUNE_FILES = ("computers", "education", "humorists", "literature", "people", "science", "wisdom",
                 "work", "riddles", "tao", "startrek", "platitudes", "linux", "goedel", "paradoxum",
                 "food", "pets", "kids", "love", "sports", "law", "medicine", "fortunes", "magic")
_TOPIC = {"computers": "computers", "education": "education", "science": "science", "work": "work",
          "linux": "Linux", "food": "food", "pets": "pets", "kids": "children", "love": "love",
          "sports": "sports", "law": "the law", "medicine": "medicine", "literature": "books and writing",
          "wisdom": "life", "people": "people", "platitudes": "life", "goedel": "logic", "paradoxum": "paradoxes"}


_PERSON = re.compile(r"(?:[A-Z][a-z'-]+|[A-Z]\.)(?: (?:[A-Z][a-z'-]+|[A-Z]\.|de|van|von|da)){0,3}")
_NOT_PERSON = {"unknown", "anonymous", "the", "and", "of", "to", "from", "in", "on", "for", "a", "an", "letters",
               "editor", "law", "laws", "rule", "rules", "principle", "proverb", "saying", "motto", "graffiti", "sign",
               "bumper", "sticker", "button", "song", "book", "poem", "ad", "advertisement", "fortune", "epitaph"}


def read_fortunes(path: Path) -> list[str]:
    text = path.read_text(encoding="utf-8", errors="replace")
    out = []
    for chunk in re.split(r"^%\s*$", text, flags=re.M):
        c = chunk.strip("\n").rstrip()
        if not c.strip() or len(c) > 700 or re.search(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\ufffd]|[ÃÂâ][\x80-\xbf]|Ã|Â", c):
            continue  # overstriking, control characters and mojibake
        letters = sum(ch.isalpha() for ch in c)
        if letters < 0.6 * len(c.replace(" ", "").replace("\n", "").replace("\t", "")):
            continue  # ascii art and tables
        out.append(c)
    return out


def _split_attribution(text: str) -> tuple[str, str]:
    m = re.search(r"\n\s*--\s*(.+)$", text, re.S)
    if not m:
        return text, ""
    who = re.sub(r"\s+", " ", m.group(1)).strip()
    return text[:m.start()].rstrip(), who


def _fortunes(paths: PackagePaths, rng: random.Random) -> dict[str, list[Example]]:
    root = paths.fortunes
    files = [root / f for f in FORTUNE_FILES if (root / f).is_file()]
    if not files:
        raise SourceMissing(str(root))
    out: dict[str, list[Example]] = {c: [] for c in CATEGORIES}
    src = "fortunes"

    def add(cat: str, prompt: str, resp: str) -> None:
        out[cat].append(Example(cat, prompt, resp, src))

    for path in files:
        topic = _TOPIC.get(path.name, "life")
        for f in read_fortunes(path):
            body, who = _split_attribution(f)
            body = re.sub(r"[ \t]+", " ", body).strip() if "\n\n" not in body else body.strip()
            if len(body) < 25:
                continue
            if path.name == "riddles":
                add("chat", _pick(rng, ("Tell me a riddle.", "Got a good riddle or joke for me?", "Ask me a funny riddle.")), body)
                continue
            if path.name == "tao":
                lines = body.split("\n")
                if len(lines) >= 4 and len(lines[0]) < 40:
                    add("writing", f"Write a short poem titled \"{lines[0].strip()}\" in the style of the Tao Te Ching.",
                        "\n".join(x.strip() for x in lines[1:]).strip())
                continue
            name = who.split(",")[0].strip().strip('"')
            if who and _PERSON.fullmatch(name) and not _NOT_PERSON & set(name.lower().split()):
                add("roleplay", _pick(rng, (f"Pretend you are {name}. Share one of your thoughts, in your own words.",
                                            f"Roleplay as {name} and say something characteristic.",
                                            f"You are {name}. Stay in character and tell me what's on your mind.")),
                    body)
            elif rng.random() < 0.5:
                add("roleplay", _pick(rng, ("You are a fortune cookie. What is my fortune?",
                                            "Act as the Unix `fortune` program and print a fortune.",
                                            "Play a wise old mentor and give me one piece of advice.")), body)
                continue
            if rng.random() < 0.5:
                add("writing", _pick(rng, (f"Write a witty one-liner about {topic}.", f"Write a short, funny quip about {topic}.",
                                           f"Write an aphorism about {topic}.")), body)
            else:
                add("chat", _pick(rng, (f"Tell me something funny about {topic}.", f"Do you know a good quote about {topic}?",
                                        f"Cheer me up with a joke about {topic}.")),
                    body + (f"\n-- {who}" if who else ""))
            if 2 <= len(sentences(body)) and "\n\n" not in body and 60 <= len(body) <= 500:
                add("writing", "Restore the capitalisation and punctuation of this text:\n\n" + _strip_punct(body).replace("\n", " "),
                    re.sub(r"\s*\n\s*", " ", body))
    return out


# ----------------------------------------------------------------------------------------------
# manpages-de with the English originals: aligned German <-> English passages

_GLYPH = {"em": "\u2014", "en": "\u2013", "lq": "\u201c", "rq": "\u201d", "oq": "\u2018", "cq": "\u2019",
          "aq": "'", "dq": '"', "bu": "\u2022", "co": "\u00a9", "mu": "\u00d7", "rs": "\\", "ha": "^",
          "ti": "~", "ga": "`", "at": "@", "hy": "-", "ua": "\u2191", "da": "\u2193", "->": "\u2192",
          "<-": "\u2190", ">=": "\u2265", "<=": "\u2264", "Fo": "\u00ab", "Fc": "\u00bb", "fo": "\u2039",
          "fc": "\u203a", "de": "\u00b0", "ss": "\u00df", "r!": "\u00a1", "tm": "\u2122", "rg": "\u00ae",
          "ct": "\u00a2", "pl": "+", "mi": "\u2212", "eq": "=", "sl": "/", "ba": "|", "br": "|", "lh": "\u261c",
          "rh": "\u261e", ":a": "\u00e4", ":o": "\u00f6", ":u": "\u00fc", ":A": "\u00c4", ":O": "\u00d6", ":U": "\u00dc"}
_FONT = {"B", "I", "BR", "IR", "RB", "RI", "BI", "IB", "SM", "SB", "R"}
_ROFF_ESC = re.compile(r"\\(?:f(?:\[[^\]]*\]|\([A-Za-z]{2}|.)|s[-+]?\d|\*(?:\(..|\[[^\]]*\]|.)|[hvwoNlLbxDXRSZ]'[^']*'"
                       r"|m(?:\[[^\]]*\]|\(..|.)|k.|n[+-]?(?:\(..|\[[^\]]*\]|.)|\((..)|\[([^\]]*)\]|(.))")


def roff_inline(line: str) -> str | None:
    def esc(m: re.Match) -> str:
        two, br, one = m.group(1), m.group(2), m.group(3)
        if two is not None:
            return _GLYPH.get(two, "\x00")
        if br is not None:
            return _GLYPH.get(br, "\x00")
        if one is None:
            return ""  # font, size, string, motion: dropped
        return {"-": "-", "e": "\\", "&": "", ",": "", "/": "", ":": "", "%": "", " ": " ", "~": " ", "0": " ",
                "|": "", "^": "", "c": "", "'": "\u00b4", "`": "`", ".": ".", "\\": "\\"}.get(one, "\x00")

    s = _ROFF_ESC.sub(esc, line)
    if "\x00" in s or "\ufffd" in s:
        return None
    return s


def _roff_args(s: str) -> list[str]:
    return [a if a is not None and a != "" else b for a, b in re.findall(r'"((?:[^"]|"")*)"|(\S+)', s)]


@dataclass
class _RoffBlock:
    section: int
    kind: str  # h | p | tp | ip
    tag: str
    text: str


def roff_blocks(text: str) -> list[_RoffBlock] | None:
    """Paragraphs of a man(7) page, with .TP/.IP tags; None for mdoc pages."""
    if re.search(r"^\.(Dd|Nm|Sh)\b", text, re.M):
        return None
    out: list[_RoffBlock] = []
    sec, kind, tag = 0, "p", ""
    cur: list[str] = []
    bad = False
    expect_tag = nofill = False
    skip_until = None

    def flush() -> None:
        nonlocal cur, bad
        if cur and not bad and not nofill:
            t = re.sub(r"\s+", " ", " ".join(cur)).strip()
            if t:
                out.append(_RoffBlock(sec, kind, tag, t))
        cur, bad = [], False

    for line in text.splitlines():
        if skip_until is not None:
            if skip_until in line if skip_until != ".." else line.startswith(".."):
                skip_until = None
            continue
        if line.startswith(('.\\"', "'\\\"", '\\"')) or line.strip() in (".", ""):
            continue
        if line[:1] in ".'":
            m = re.match(r"[.']\s*(\S+)\s*(.*)$", line)
            if not m:
                continue
            req, args = m.group(1), m.group(2)
            if req == "de":
                skip_until = ".."
                continue
            if req in ("ie", "if", "el"):
                if "\\{" in line and "\\}" not in line:
                    skip_until = "\\}"
                continue
            if req in ("SH", "SS"):
                flush()
                if req == "SH":
                    sec += 1
                h = roff_inline(" ".join(_roff_args(args)))
                if h:
                    out.append(_RoffBlock(sec, "h", "", h))
                kind, tag = "p", ""
                continue
            if req in ("PP", "P", "LP", "sp", "RS", "RE", "in"):
                flush()
                kind, tag = "p", ""
                continue
            if req in ("TP", "TQ"):
                flush()
                expect_tag = True
                continue
            if req == "IP":
                flush()
                a = _roff_args(args)
                kind, tag = "ip", (roff_inline(a[0]) or "") if a else ""
                continue
            if req in ("nf", "EX"):
                flush()
                nofill = True
                continue
            if req in ("fi", "EE"):
                cur = []
                nofill = False
                continue
            if req in _FONT:
                a = _roff_args(args)
                line = (" " if len(req) == 1 else "").join(a)
            elif req == "br":
                continue
            else:
                continue
        t = roff_inline(line)
        if expect_tag:
            expect_tag = False
            kind, tag = "tp", (t or "").strip()
            if t is None:
                bad = True
            continue
        if t is None:
            bad = True
        else:
            cur.append(t)
    flush()
    return out


_OPT = re.compile(r"(?<![\w-])--?[A-Za-z0-9][\w-]*")


def _opt_key(tag: str) -> tuple[str, ...]:
    return tuple(_OPT.findall(tag))


def _compatible(de: str, en: str) -> bool:
    if de == en or len(en) < 15 or len(de) < 15 or not 0.5 <= len(de) / len(en) <= 2.2:
        return False
    if sorted(_OPT.findall(de)) != sorted(_OPT.findall(en)):
        return False
    if sorted(re.findall(r"\d+", de)) != sorted(re.findall(r"\d+", en)):
        return False
    wd, we = set(re.findall(r"\w+", de.lower())), set(re.findall(r"\w+", en.lower()))
    return len(wd & we) / max(1, len(wd | we)) < 0.5  # translated, not left in English


def align_pages(de: list[_RoffBlock], en: list[_RoffBlock]) -> list[tuple[str, str]]:
    """German/English paragraph pairs of one page, in document order."""
    pairs: dict[int, tuple[str, str]] = {}
    # 1. same section structure: pair paragraph by paragraph
    if len(de) == len(en) and [(b.section, b.kind) for b in de] == [(b.section, b.kind) for b in en]:
        for i, (a, b) in enumerate(zip(de, en)):
            if a.kind != "h":
                pairs[i] = (a.text, b.text)
    else:
        # 2. option items with the same, unique option flags
        def index(blocks: list[_RoffBlock]) -> dict[tuple[str, ...], int]:
            seen: dict[tuple[str, ...], list[int]] = {}
            for i, b in enumerate(blocks):
                k = _opt_key(b.tag) if b.kind in ("tp", "ip") else ()
                if k:
                    seen.setdefault(k, []).append(i)
            return {k: v[0] for k, v in seen.items() if len(v) == 1}

        ie = index(en)
        for k, i in index(de).items():
            if k in ie:
                pairs[i] = (de[i].text, en[ie[k]].text)
        # 3. the NAME line
        if de and en and len(de) > 1 and len(en) > 1 and de[1].section == en[1].section == 1 and de[1].kind == en[1].kind == "p":
            pairs[1] = (de[1].text, en[1].text)
    return [pairs[i] for i in sorted(pairs) if _compatible(*pairs[i])]


def _dpkg_owners(info: Path | None) -> dict[str, str]:
    owners: dict[str, str] = {}
    if info is None or not info.is_dir():
        return owners
    for lst in sorted(info.glob("*.list")):
        pkg = lst.name[:-5].split(":")[0]
        for ln in lst.read_text(encoding="utf-8", errors="replace").splitlines():
            if ln.startswith("/usr/share/man/man"):
                owners[ln] = pkg
    return owners


def _read_man(path: Path) -> str:
    data = path.read_bytes()
    if path.suffix == ".gz":
        data = gzip.decompress(data)
    return data.decode("utf-8", errors="replace")


def _manpages(paths: PackagePaths, rng: random.Random, want: int, stats: dict[str, int]) -> dict[str, list[Example]]:
    de_root, en_root = paths.man_de, paths.man_en
    pages = sorted(p for p in de_root.glob("man*/*") if p.is_file()) if de_root.is_dir() else []
    if not pages:
        raise SourceMissing(str(de_root))
    owners = _dpkg_owners(paths.dpkg_info)
    rng.shuffle(pages)
    out: dict[str, list[Example]] = {c: [] for c in CATEGORIES}
    for p in pages:
        en_path = en_root / p.relative_to(de_root)
        if not en_path.is_file():
            continue
        owner = owners.get(str(en_path), "") if owners else "unknown"
        if not owner:
            continue  # only English pages a Debian package installed (its licence is on record)
        de_b, en_b = roff_blocks(_read_man(p)), roff_blocks(_read_man(en_path))
        if not de_b or not en_b:
            continue
        pairs = align_pages(de_b, en_b)
        if not pairs:
            continue
        command = re.sub(r"\.\w+(\.gz)?$", "", p.name)
        used = 0
        k = 0
        while k < len(pairs):
            de_t, en_t = pairs[k]
            k += 1
            while k < len(pairs) and len(de_t) + len(pairs[k][0]) < 600:
                de_t, en_t = f"{de_t}\n\n{pairs[k][0]}", f"{en_t}\n\n{pairs[k][1]}"
                k += 1
            if len(de_t) > MAX_PASSAGE or len(en_t) > MAX_RESPONSE:
                continue
            where = _pick(rng, ("", "", f" (from the manual page of `{command}`)"))
            out["translation"].append(Example("translation", _pick(rng, (
                "Translate the following German text into English{w}:\n\n{t}",
                "Please translate this into English{w}.\n\n{t}",
                "German to English{w}:\n{t}")).format(w=where, t=de_t), en_t, "manpages-de"))
            out["translation"].append(Example("translation", _pick(rng, (
                "Translate the following English text into German{w}:\n\n{t}",
                "Übersetze den folgenden Text ins Deutsche:\n\n{t}",
                "English to German{w}:\n{t}")).format(w=where, t=en_t), de_t, "manpages-de"))
            used += 1
        if used:
            stats[f"source/manpages-de/en-pages-from/{owner}"] = stats.get(f"source/manpages-de/en-pages-from/{owner}", 0) + 1
        if len(out["translation"]) >= want:
            break
    return out


# ----------------------------------------------------------------------------------------------
# The builder

SOURCE_NAMES = ("gsm8k", "humaneval", "folio", "python3.11-doc", "wordnet-base", "fortunes", "manpages-de")


def _interleave(pools: dict[str, list[Example]], limit: int, keep: Callable[[Example], bool],
                dropped: dict[str, int]) -> list[Example]:
    """Round-robin over sources (each already shuffled) so every source is represented."""
    its: dict[str, Iterator[Example]] = {s: iter(v) for s, v in pools.items() if v}
    out: list[Example] = []
    while its and len(out) < limit:
        for s in list(its):
            if len(out) >= limit:
                break
            for ex in its[s]:
                if keep(ex):
                    out.append(ex)
                    break
                dropped[s] = dropped.get(s, 0) + 1
            else:
                del its[s]
    return out


def build_corpus(data_dir: Path, limit_per_category: int, seed: int = 0,
                 paths: PackagePaths | None = None) -> tuple[list[Example], dict[str, int]]:
    """Up to ``limit_per_category`` examples per category, deterministic in ``seed``.

    Stats keys: ``category/<c>/examples``, ``category/<c>/chars`` (prompt + response),
    ``category/<c>/response_chars``, ``category/<c>/candidates`` (before the limit and the
    benchmark guard; lazy sources stop at 4x the limit), the same under ``source/<s>/``, ``source/<s>/missing``
    (1 when its package or file is absent), ``source/<s>/benchmark_dropped``, ``total/...``,
    ``benchmark_turns`` and ``source/manpages-de/en-pages-from/<package>`` (the Debian package
    of each English original used for translation pairs)."""
    data_dir = Path(data_dir)
    paths = paths or system_paths()
    guard = BenchmarkGuard(data_dir)
    stats: dict[str, int] = {"benchmark_turns": len(guard)}
    want = max(4 * limit_per_category, 64)  # candidates a lazy source needs to produce

    def rng_for(name: str) -> random.Random:
        return random.Random(f"{seed}:{name}")

    readers: dict[str, Callable[[], dict[str, list[Example]]]] = {
        "gsm8k": lambda: _gsm8k(data_dir, rng_for("gsm8k")),
        "humaneval": lambda: _humaneval(data_dir, rng_for("humaneval")),
        "folio": lambda: _folio(data_dir, rng_for("folio")),
        "python3.11-doc": lambda: _python_doc(paths, rng_for("python3.11-doc")),
        "wordnet-base": lambda: _wordnet(paths, rng_for("wordnet-base"), want),
        "fortunes": lambda: _fortunes(paths, rng_for("fortunes")),
        "manpages-de": lambda: _manpages(paths, rng_for("manpages-de"), want, stats),
    }
    pools: dict[str, dict[str, list[Example]]] = {c: {} for c in CATEGORIES}
    for name in SOURCE_NAMES:
        try:
            got = readers[name]()
        except (SourceMissing, FileNotFoundError, NotADirectoryError) as e:
            warnings.warn(f"training corpus: source {name} skipped, not found ({e}); "
                          "`make draft-data-deps` installs the Debian packages", stacklevel=2)
            stats[f"source/{name}/missing"] = 1
            continue
        for cat, exs in got.items():
            if exs:
                exs = list(exs)
                rng_for(f"{name}:{cat}").shuffle(exs)
                pools[cat][name] = exs
                stats[f"category/{cat}/candidates"] = stats.get(f"category/{cat}/candidates", 0) + len(exs)

    dropped: dict[str, int] = {}
    examples: list[Example] = []
    for cat in CATEGORIES:
        examples.extend(_interleave(pools[cat], limit_per_category,
                                    lambda ex: not (guard.hit(ex.prompt) or guard.hit(ex.response)), dropped))
    for name, n in dropped.items():
        stats[f"source/{name}/benchmark_dropped"] = n
    for ex in examples:
        for key in (f"category/{ex.category}", f"source/{ex.source}", "total"):
            stats[f"{key}/examples"] = stats.get(f"{key}/examples", 0) + 1
            stats[f"{key}/chars"] = stats.get(f"{key}/chars", 0) + len(ex.prompt) + len(ex.response)
            stats[f"{key}/response_chars"] = stats.get(f"{key}/response_chars", 0) + len(ex.response)
    for cat in CATEGORIES:
        stats.setdefault(f"category/{cat}/examples", 0)
    return examples, stats


def missing_sources(stats: dict[str, int]) -> list[str]:
    return [k.split("/")[1] for k, v in stats.items() if k.endswith("/missing") and v]


def _main(argv: Iterable[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="Build the draft-training corpus and print its stats.")
    ap.add_argument("--limit", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--data-dir", type=Path, default=None)
    ap.add_argument("--out", type=Path, default=None, help="write the examples as JSONL")
    a = ap.parse_args(list(argv) if argv is not None else None)
    exs, stats = build_corpus(a.data_dir or data_dir(), a.limit, a.seed)
    for k in sorted(stats):
        print(f"{k}\t{stats[k]}")
    if a.out:
        with open(a.out, "w", encoding="utf-8") as f:
            for e in exs:
                f.write(json.dumps(e.__dict__, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    _main()
