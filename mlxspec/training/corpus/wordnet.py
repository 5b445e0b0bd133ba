"""wordnet-base: definitions, usage examples, synonyms, antonyms and the is-a hierarchy, as
questions about words (qa, chat), kind-of reasoning, entry extraction and sense lookup (rag)."""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from pathlib import Path

from mlxspec.training.corpus.records import Example, PackagePaths, SourceMissing, by_category
from mlxspec.training.corpus.text import article, pick

SOURCE = "wordnet-base"
_POS = {"noun": "noun", "verb": "verb", "adj": "adjective", "adv": "adverb"}
_CAPPED = ("qa", "chat", "reasoning", "extraction", "rag")  # the categories WordNet fills


@dataclass
class Synset:
    pos: str
    words: list[str]
    definition: str
    examples: list[str]
    hypernyms: list[str]
    antonyms: list[str]


def read_wordnet(root: Path) -> dict[str, Synset]:
    """Every synset of the data.* files under ``root``, by offset and part-of-speech letter."""
    out: dict[str, Synset] = {}
    found = False
    for pos in _POS:
        path = root / f"data.{pos}"
        if not path.is_file():
            continue
        found = True
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                if not line.startswith("  ") and "|" in line and (got := _synset(line, pos)):
                    out[got[0]] = got[1]
    if not found:
        raise SourceMissing(f"no data.noun/verb/adj/adv under {root}")
    return out


def _synset(line: str, pos: str) -> tuple[str, Synset] | None:
    """One line of a data file; None when it is malformed or has no definition."""
    head, gloss = line.split("|", 1)
    t = head.split()
    try:
        off, ss_type, nw = t[0], t[2], int(t[3], 16)
        words = [re.sub(r"\(\w+\)$", "", t[4 + 2 * k]).replace("_", " ") for k in range(nw)]
        p = 4 + 2 * nw
        hyper, anto = [], []
        for k in range(int(t[p])):
            sym, tgt, tpos, st = t[p + 1 + 4 * k: p + 5 + 4 * k]
            key = f"{tgt}{'a' if tpos == 's' else tpos}"
            if sym in ("@", "@i"):
                hyper.append(key)
            elif sym == "!":
                anto.append(key)
    except (IndexError, ValueError):
        return None
    parts = [x.strip() for x in gloss.strip().split(";")]
    examples = [x.strip().strip('"') for x in parts if x.startswith('"') and x.endswith('"')]
    definition = "; ".join(x for x in parts if not x.startswith('"')).strip()
    if not definition:
        return None
    key = f"{off}{'a' if ss_type == 's' else ss_type}"
    return key, Synset(_POS[pos], words, definition, [e for e in examples if len(e) > 8], hyper, anto)


def _chain(syn: dict[str, Synset], key: str, depth: int) -> list[Synset]:
    chain = [syn[key]]
    while len(chain) <= depth and chain[-1].hypernyms and chain[-1].hypernyms[0] in syn:
        nxt = syn[chain[-1].hypernyms[0]]
        if nxt in chain:
            break
        chain.append(nxt)
    return chain


@dataclass(frozen=True)
class _Lexicon:
    syn: dict[str, Synset]
    keys: list[str]  # in the seeded order synsets are visited
    by_word: dict[str, list[str]]  # a synset's first word -> the synsets it heads, in offset order


def wordnet_examples(paths: PackagePaths, rng: random.Random, want: int) -> dict[str, list[Example]]:
    """Synsets in seeded order until each filled category has ``want`` examples."""
    syn = read_wordnet(paths.wordnet)
    keys = sorted(syn)
    rng.shuffle(keys)
    by_word: dict[str, list[str]] = {}
    for k in sorted(syn):
        for w in syn[k].words[:1]:
            by_word.setdefault(w.lower(), []).append(k)
    lex = _Lexicon(syn, keys, by_word)
    out = by_category()
    for idx, k in enumerate(keys):
        w = syn[k].words[0]
        if not re.fullmatch(r"[A-Za-z][A-Za-z' -]*", w) or w[0].isupper():
            continue  # skip proper names and odd entries
        for ex in _synset_examples(lex, idx, rng):
            if len(out[ex.category]) < want:
                out[ex.category].append(ex)
        if all(len(v) >= want for c, v in out.items() if c in _CAPPED):
            break
    return out


def _ex(category: str, prompt: str, response: str) -> Example:
    return Example(category, prompt, response, SOURCE)


def _synset_examples(lex: _Lexicon, idx: int, rng: random.Random) -> list[Example]:
    k = lex.keys[idx]
    s = lex.syn[k]
    w, d = s.words[0], s.definition
    use = next((e for e in s.examples if w.lower() in e.lower()), None)  # an example using the word itself
    out = _word_questions(lex, s, use, rng)
    if s.pos == "noun":
        out += _is_a(lex.syn, k, rng)
    if s.examples:
        entry = f"{w} ({s.pos}): {d}; " + "; ".join(f"\"{e}\"" for e in s.examples)
        out.append(_ex("extraction", pick(rng, ("Extract the example sentences from this dictionary entry.\n\n{e}",
                                                "From the dictionary entry below, list the usage examples only.\n\n{e}")).format(e=entry),
                       "\n".join(f"- {e}" for e in s.examples)))
    senses = lex.by_word.get(w.lower(), [])
    if 2 <= len(senses) <= 8 and use and idx % 2 == 0:
        listing = "\n".join(f"{n}. ({lex.syn[x].pos}) {lex.syn[x].definition}" for n, x in enumerate(senses, 1))
        pos = senses.index(k) + 1
        out.append(_ex("rag", pick(rng, ("Dictionary entry for \"{w}\":\n{l}\n\nWhich sense is used in: \"{e}\"?",
                                         "Here are the senses of \"{w}\":\n{l}\n\nQuestion: in the sentence \"{e}\", which sense applies?")).format(w=w, l=listing, e=use),
                       f"Sense {pos}: {d}."))
    if idx % 3 == 0:
        out.append(_glossary_lookup(lex, idx, rng))
    return out


def _word_questions(lex: _Lexicon, s: Synset, use: str | None, rng: random.Random) -> list[Example]:
    """The word's meaning, a sentence using it, its synonyms and its opposite."""
    w, d = s.words[0], s.definition
    resp = f"As {article(s.pos)}{s.pos}, \"{w}\" means: {d}." + (f" For example: \"{use}\"." if use else "")
    out = [_ex("qa", pick(rng, (f"What does the word \"{w}\" mean?", f"Define \"{w}\".", f"What is the meaning of {w}?",
                                f"What's the definition of the {s.pos} \"{w}\"?")), resp)]
    if use:
        out.append(_ex("chat", pick(rng, (f"Use the word \"{w}\" in a sentence.", f"Give me an example sentence with \"{w}\".")),
                       f"Here is one, using \"{w}\" in the sense \"{d}\": \"{use[0].upper() + use[1:]}\""))
    if len(s.words) >= 3:
        others = ", ".join(f"\"{x}\"" for x in s.words[1:6])
        out.append(_ex("chat", pick(rng, (f"Give me some synonyms for \"{w}\".", f"What are other words for \"{w}\"?",
                                          f"Suggest alternatives to the word \"{w}\".")),
                       f"In the sense \"{d}\", words with the same meaning as \"{w}\" are {others}."))
    if s.antonyms and s.antonyms[0] in lex.syn:
        a = lex.syn[s.antonyms[0]]
        out.append(_ex("chat", pick(rng, (f"What is the opposite of \"{w}\"?", f"Give me an antonym of \"{w}\".")),
                       f"The opposite of \"{w}\" ({d}) is \"{a.words[0]}\" ({a.definition})."))
    return out


def _is_a(syn: dict[str, Synset], key: str, rng: random.Random) -> list[Example]:
    """Kind-of reasoning along the noun's first hypernyms, and the syllogism of its first three."""
    names = [c.words[0] for c in _chain(syn, key, 6)]
    if len(names) < 4 or len(set(names)) != len(names):
        return []
    w, top = names[0], names[-1]
    steps = ", ".join(f"{article(a)}{a} is a kind of {b}" for a, b in zip(names, names[1:]))
    a, b, c = names[0], names[1], names[2]
    return [_ex("reasoning", pick(rng, (f"Is {article(w)}{w} a kind of {top}? Explain your reasoning.",
                                        f"Reason step by step: is every {w} {article(top)}{top}?")),
                f"Yes. Step by step: {steps}. Since each step is a kind-of relation, {article(w)}{w} is a kind of {top}."),
            _ex("reasoning", f"Every {a} is {article(b)}{b}, and every {b} is {article(c)}{c}. "
                             f"Does it follow that every {a} is {article(c)}{c}?",
                f"Yes. Every {a} is {article(b)}{b}, and every {b} is {article(c)}{c}, so by transitivity every {a} "
                f"is {article(c)}{c}. This is a valid syllogism (Barbara): the conclusion follows from the two premises.")]


def _glossary_lookup(lex: _Lexicon, idx: int, rng: random.Random) -> Example:
    """The word for a definition, found in a small glossary of it and three other synsets."""
    k = lex.keys[idx]
    w, d = lex.syn[k].words[0], lex.syn[k].definition
    picks = [lex.keys[(idx + j * 7919) % len(lex.keys)] for j in range(1, 4)]
    docs = [k] + [p for p in picks if lex.syn[p].words[0] != w]
    rng.shuffle(docs)
    listing = "\n".join(f"- {lex.syn[x].words[0]}: {lex.syn[x].definition}" for x in docs)
    return _ex("rag", pick(rng, ("Glossary:\n{l}\n\nUsing the glossary, which word means \"{d}\"?",
                                 "{l}\n\nAccording to the list above, what is the term for: {d}?")).format(l=listing, d=d),
               f"The glossary defines \"{w}\" as \"{d}\", so the word is \"{w}\".")
