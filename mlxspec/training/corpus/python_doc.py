"""python3.11-doc: examples from the reStructuredText sources of the Python documentation.

API entries and glossary terms answer questions about themselves (qa, chat), are asked about
among their neighbours (rag) and listed (extraction); an example is shown with the paragraph
that introduces it (code); a section's prose is summarised by its lead, titled, explained in
a tutor's voice and rewritten (summarization, chat, roleplay, writing)."""

from __future__ import annotations

import random
import re
from pathlib import Path

from mlxspec.training.corpus.records import (
    MAX_PASSAGE,
    MAX_RESPONSE,
    Example,
    PackagePaths,
    SourceMissing,
    by_category,
)
from mlxspec.training.corpus.rst import RstBlock, rst_blocks
from mlxspec.training.corpus.text import article, clip, pick, sentences, strip_punct

SOURCE = "python3.11-doc"
_SKIP_DIRS = ("whatsnew", "c-api", "distutils", "install", "includes")


def python_doc_examples(paths: PackagePaths, rng: random.Random) -> dict[str, list[Example]]:
    root = paths.python_doc
    out = by_category()
    for path in _doc_files(root):
        for ex in _page_examples(path, root, rng):
            if ex.response and len(ex.response) <= MAX_RESPONSE:
                out[ex.category].append(ex)
    return out


def _doc_files(root: Path) -> list[Path]:
    if not root.is_dir():
        raise SourceMissing(str(root))
    files = sorted(p for p in root.rglob("*.txt")
                   if not p.relative_to(root).parts[0] in _SKIP_DIRS and p.name not in ("license.rst.txt", "copyright.rst.txt"))
    if not files:
        raise SourceMissing(f"no .rst.txt under {root}")
    return files


def _page_examples(path: Path, root: Path, rng: random.Random) -> list[Example]:
    """Every candidate of one page, in the order the seeded choices are drawn."""
    rel = path.relative_to(root).as_posix()
    module = re.sub(r"\.rst\.txt$", "", path.name) if rel.startswith("library/") else ""
    blocks = rst_blocks(path.read_text(encoding="utf-8", errors="replace"))
    apis = [b for b in blocks if b.kind == "api"]
    terms = [b for b in blocks if b.kind == "term"]
    return (_api_questions(apis, module, rng) + _term_questions(terms, rng) + _api_rag(apis, rng)
            + _extractions(apis, terms, rng) + _code_examples(blocks, module, rng)
            + [ex for ps in _sections(blocks).values() for ex in _section_examples(ps, rng)])


def _ex(category: str, prompt: str, response: str) -> Example:
    return Example(category, prompt, response, SOURCE)


def _api_questions(apis: list[RstBlock], module: str, rng: random.Random) -> list[Example]:
    out = []
    for b in apis:
        call = f"{b.name}()" if "(" in b.sig else b.name
        where = f" in Python's `{module}` module" if module else " in Python"
        desc = clip(" ".join(b.body[:2]), 900)
        out.append(_ex("qa", pick(rng, (f"What does `{call}` do{where}?", f"Explain `{b.sig}`{where}.",
                                         f"In Python, what is `{call}` used for?")), desc))
        if len(b.body) >= 1 and len(sentences(b.body[0])) >= 2:
            out.append(_ex("chat", pick(rng, (f"I'm reading about `{call}`{where}. Can you describe it briefly?",
                                              f"Quick question: how does `{call}` behave?")), desc))
    return out


def _term_questions(terms: list[RstBlock], rng: random.Random) -> list[Example]:
    return [_ex("qa", pick(rng, (f"In Python terminology, what is {article(b.name)}{b.name}?",
                                 f"What does the term \"{b.name}\" mean in Python?")), clip(" ".join(b.body[:2]), 900))
            for b in terms]


def _api_rag(apis: list[RstBlock], rng: random.Random) -> list[Example]:
    """One API entry asked about, shown among neighbours from the same page."""
    out: list[Example] = []
    if len(apis) < 2:
        return out
    for k, b in enumerate(apis):
        others = [a for a in apis if a.name != b.name]
        docs = [b] + [others[(k + d) % len(others)] for d in range(1, min(3, len(others) + 1))]
        docs = list({d.name: d for d in docs}.values())
        rng.shuffle(docs)
        pos = docs.index(b) + 1
        shown = "\n\n".join(f"[{q}] `{d.sig}`: {clip(' '.join(d.body[:2]), 400)}" for q, d in enumerate(docs, 1))
        first = sentences(b.body[0])[0]
        out.append(_ex("rag", pick(rng, ("{docs}\n\nUsing only the documents above: what does `{n}` do?",
                                         "Answer from the passages.\n\n{docs}\n\nQuestion: what is `{n}` for?",
                                         "Documentation excerpts:\n{docs}\n\nBased on these excerpts, describe `{n}`.")).format(docs=shown, n=b.name),
                       f"According to document [{pos}], `{b.sig}`: {first}"))
    return out


def _extractions(apis: list[RstBlock], terms: list[RstBlock], rng: random.Random) -> list[Example]:
    """The API names or glossary terms of a passage of three entries."""
    out = []
    for k in range(0, len(apis) - 2, 3):
        group = apis[k:k + 3]
        shown = "\n\n".join(f"{g.sig}\n    {clip(g.body[0], 300)}" for g in group)
        out.append(_ex("extraction", pick(rng, ("List the names of the functions, classes or attributes documented in this text:\n\n{t}",
                                                "Extract every documented name from the following reference text, one per line.\n\n{t}")).format(t=shown),
                       "\n".join(f"- {g.name}" for g in group)))
    for k in range(0, len(terms) - 2, 3):
        group = terms[k:k + 3]
        shown = "\n\n".join(f"{g.name}\n    {clip(g.body[0], 300)}" for g in group)
        out.append(_ex("extraction", pick(rng, ("Extract the defined terms from this glossary excerpt.\n\n{t}",
                                                "Which terms does this glossary excerpt define?\n\n{t}")).format(t=shown),
                       "\n".join(f"- {g.name}" for g in group)))
    return out


def _code_examples(blocks: list[RstBlock], module: str, rng: random.Random) -> list[Example]:
    """An example of code under a section title, with the paragraph that introduces it."""
    out = []
    for k, b in enumerate(blocks):
        if b.kind != "code" or not (40 <= len(b.text) <= 1000) or not b.title:
            continue
        lead = blocks[k - 1] if k and blocks[k - 1].kind == "para" else None
        lang = "pycon" if b.text.startswith(">>>") else "python"
        if lang == "python" and not re.search(r"\b(def|import|print|for|class|return|=)\b|=", b.text):
            continue
        resp = (f"{lead.text}\n\n" if lead and len(lead.text) < 600 else "") + f"```{lang}\n{b.text}\n```"
        topic = b.title.rstrip(".:")
        out.append(_ex("code", pick(rng, (f"Show me a short Python example about: {topic}.",
                                          f"Give a Python code example illustrating \"{topic}\"" + (f" (from the `{module}` docs)." if module else "."),
                                          f"How would I write code for this in Python: {topic}?")), resp))
    return out


def _sections(blocks: list[RstBlock]) -> dict[str, list[RstBlock]]:
    """The prose paragraphs under each title (not those introducing a list or continuing one)."""
    sections: dict[str, list[RstBlock]] = {}
    for b in blocks:
        if b.kind == "para" and b.title and not b.text.endswith(":") and not b.text[:1].islower():
            sections.setdefault(b.title, []).append(b)
    return sections


def _section_examples(ps: list[RstBlock], rng: random.Random) -> list[Example]:
    text = " ".join(p.text for p in ps)
    passage = clip(text, MAX_PASSAGE)
    psents = sentences(passage)
    topic = ps[0].title.rstrip(".:")
    out = _summaries(passage, psents, topic, rng) if len(psents) >= 4 else []
    if 2 <= len(sentences(text)) and 150 <= len(passage):
        out.append(_ex("chat", pick(rng, (f"Can you explain \"{topic}\" in Python?", f"Tell me about {topic} (Python).",
                                          f"I'm learning Python. What should I know about {topic.lower()}?")), passage))
        out.append(_ex("roleplay", pick(rng, (f"You are a patient Python tutor. A student asks you about \"{topic}\". Answer them.",
                                              f"Act as the Python documentation and explain {topic}.",
                                              f"Pretend you are a senior developer mentoring a new colleague on {topic.lower()}. What do you tell them?")),
                       passage))
    if 2 <= len(psents) <= 8 and 120 <= len(passage) <= 700:
        out += _rewrite(ps[0], passage, psents, rng)
    return out


def _summaries(passage: str, psents: list[str], topic: str, rng: random.Random) -> list[Example]:
    """The passage's lead as its summary, its title as its heading, and one of its sentences as
    the answer to a question about what it mentions."""
    out = [_ex("summarization", pick(rng, ("Summarize the following passage in two sentences.\n\n{p}",
                                           "Give a short summary of this text:\n\n{p}",
                                           "TL;DR of the passage below, please.\n\n{p}")).format(p=passage), " ".join(psents[:2])),
           _ex("summarization", pick(rng, ("Suggest a title for this passage.\n\n{p}",
                                           "What is a good heading for the following section?\n\n{p}")).format(p=passage),
               f"A fitting title is \"{topic}\".")]
    target = psents[rng.randrange(1, len(psents))]
    words = re.findall(r"`[^`]+`", target)
    if words:
        out.append(_ex("rag", pick(rng, ("Read the passage and answer the question.\n\n{p}\n\nQuestion: what does the passage say about {w}?",
                                         "{p}\n\nBased on the text above, what is said about {w}?")).format(p=passage, w=words[0]),
                       f"The passage says: {target}"))
    return out


def _rewrite(first: RstBlock, passage: str, psents: list[str], rng: random.Random) -> list[Example]:
    """One rewriting task: as a bulleted list, with punctuation restored, or markup removed."""
    kind = rng.randrange(3)
    if kind == 0:
        return [_ex("writing", "Rewrite this passage as a bulleted list, one sentence per bullet.\n\n" + passage,
                    "\n".join(f"- {x}" for x in psents))]
    if kind == 1:
        return [_ex("writing", "Restore the capitalisation and punctuation of this text:\n\n" + strip_punct(passage), passage)]
    if first.raw != first.text and len(first.raw) <= 700:
        return [_ex("writing", "Rewrite this reStructuredText as plain prose without markup.\n\n" + first.raw, first.text)]
    return []
