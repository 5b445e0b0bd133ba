"""The draft-training corpus: every category from small fake package trees, the benchmark guard,
determinism, and missing packages skipped and reported. No Debian package is needed."""

from __future__ import annotations

import gzip
import json
import warnings
from pathlib import Path

import pytest

from mlxspec.training.corpus import (
    CATEGORIES,
    SOURCE_NAMES,
    BenchmarkGuard,
    PackagePaths,
    build_corpus,
    missing_sources,
    rst_blocks,
)
from mlxspec.training.distill import is_benchmark, normalise

PLANTED = ("A baker makes 14 loaves a day and sells each loaf for $3. "
           "How many dollars does the baker earn in a week?")
MT_PLANTED = "Computers are useless. They can only give you answers."

RST = """\
:mod:`frob` --- Frobnicating bar files
======================================

.. module:: frob
   :synopsis: Frobnicate bar files.

Reading and writing bar files
-----------------------------

The :mod:`frob` module reads and writes bar files of any size. A bar file holds a header and a
sequence of records. Each record is frobnicated on its own, so a damaged record does not spoil
the rest. Use :func:`open_bar` to open a file, and :func:`close_bar` when you are done. The
module is safe to use from several threads at once.

Here is how a bar file is read::

   import frob
   with frob.open_bar("data.bar") as f:
       for record in f:
           print(record)

.. function:: open_bar(path, mode='r')

   Open the bar file at *path* and return a :class:`BarFile`. The file is read lazily.

.. function:: close_bar(f)

   Close the bar file *f*. Closing a file twice is allowed and does nothing.

.. function:: frobnicate(record, level=1)

   Return a frobnicated copy of *record*. The original record is left unchanged.

.. class:: BarFile

   A handle on an open bar file. Iterating over it yields records in file order.
"""

GLOSSARY = """\
Glossary
========

.. glossary::

   bar file
      A file made of a header and a sequence of records.

   record
      One entry of a bar file, frobnicated on its own.

   frobnication
      The reversible transformation applied to every record.
"""

MAN_EN = r""".TH FOO 1 "2024" "foo 1.0" "User Commands"
.SH NAME
foo \- frobnicate the bar files
.SH DESCRIPTION
.PP
Frobnicate every bar file given on the command line and print a short summary of each.
.TP
\fB\-a\fR, \fB\-\-all\fR
process hidden files as well
.TP
\fB\-q\fR, \fB\-\-quiet\fR
print nothing except error messages
"""

MAN_DE = r""".TH FOO 1 "2024" "foo 1.0" "Dienstprogramme für Benutzer"
.SH BEZEICHNUNG
foo \- die Bar\-Dateien frobnizieren
.SH BESCHREIBUNG
.PP
Jede auf der Befehlszeile angegebene Bar\-Datei frobnizieren und zu jeder eine kurze Zusammenfassung ausgeben.
.TP
\fB\-a\fP, \fB\-\-all\fP
auch versteckte Dateien verarbeiten
.TP
\fB\-q\fP, \fB\-\-quiet\fP
außer Fehlermeldungen nichts ausgeben
"""


def synset(off: int, words: list[str], ptrs: list[tuple[str, int, str]], gloss: str, pos: str = "n") -> str:
    w = " ".join(f"{x.replace(' ', '_')} 0" for x in words)
    p = " ".join(f"{s} {o:08d} {ps} 0000" for s, o, ps in ptrs)
    return f"{off:08d} 03 {pos} {len(words):02x} {w} {len(ptrs):03d} {p} | {gloss}  \n"


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")


@pytest.fixture()
def fake(tmp_path: Path) -> tuple[Path, PackagePaths]:
    data = tmp_path / "data"
    data.mkdir()
    write_jsonl(data / "gsm8k_test.jsonl", [
        {"question": PLANTED, "answer": "14 * 3 = <<14*3=42>>42 per day.\n42 * 7 = <<42*7=294>>294\n#### 294"},
        {"question": "Tom has 3 apples and buys 4 more. How many apples does he have?",
         "answer": "Tom has 3 + 4 = <<3+4=7>>7 apples.\n#### 7"},
        {"question": "A pen costs $2. How much do 5 pens cost?", "answer": "5 * 2 = <<5*2=10>>10\n#### 10"},
    ])
    with gzip.open(data / "humaneval.jsonl.gz", "wt", encoding="utf-8") as f:
        f.write(json.dumps({"task_id": "HumanEval/0", "prompt": 'def add(a, b):\n    """Return a + b."""\n',
                            "canonical_solution": "    return a + b\n", "test": "", "entry_point": "add"}) + "\n")
    write_jsonl(data / "folio_validation.jsonl", [
        {"premises": ["All dogs are mammals.", "Rex is a dog."], "premises-FOL": ["∀x (Dog(x) → Mammal(x))", "Dog(rex)"],
         "conclusion": "Rex is a mammal.", "conclusion-FOL": "Mammal(rex)", "label": "True"},
    ])
    write_jsonl(data / "spec_bench_questions.jsonl", [
        {"question_id": 401, "category": "math_reasoning", "turns": [PLANTED]},
        {"question_id": 161, "category": "translation", "turns": ["Translate German to English: Guten Morgen."]},
    ])
    write_jsonl(data / "mt_bench_questions.jsonl", [
        {"question_id": 81, "category": "writing", "turns": [MT_PLANTED, "Rewrite it."]},
    ])

    doc = tmp_path / "pydoc"
    (doc / "library").mkdir(parents=True)
    (doc / "library" / "frob.rst.txt").write_text(RST, encoding="utf-8")
    (doc / "glossary.rst.txt").write_text(GLOSSARY, encoding="utf-8")

    wn = tmp_path / "wordnet"
    wn.mkdir()
    (wn / "data.noun").write_text(
        "  1 This software and database is being provided to you, the LICENSEE\n"
        + synset(1, ["animal", "beast"], [], 'a living organism that feeds on organic matter; "animals move about"')
        + synset(2, ["mammal"], [("@", 1, "n")], "a warm-blooded vertebrate that nourishes its young with milk")
        + synset(3, ["carnivore"], [("@", 2, "n")], 'a terrestrial mammal that eats meat; "a carnivore hunts"')
        + synset(4, ["canine", "canid"], [("@", 3, "n")], "a carnivore of the dog family")
        + synset(5, ["dog", "domestic dog", "Canis familiaris"], [("@", 4, "n")],
                 'a domesticated canine kept as a pet; "the dog barked all night"'),
        encoding="utf-8")
    (wn / "data.adj").write_text(
        synset(10, ["hot"], [("!", 11, "a")], 'used of physical heat; "a hot stove"', "a")
        + synset(11, ["cold"], [("!", 10, "a")], 'having a low temperature; "a cold wind"', "a"), encoding="utf-8")

    fo = tmp_path / "fortunes"
    fo.mkdir()
    (fo / "computers").write_text(
        f"{MT_PLANTED}\n\t\t-- Pablo Picasso\n%\n"
        "There are two ways to write error-free programs. Only the third one works.\n%\n"
        "The computer is a moron. It does exactly what you tell it, nothing more.\n\t\t-- Peter Drucker\n%\n",
        encoding="utf-8")
    (fo / "riddles").write_text("Q: What has keys but cannot open locks?\nA: A piano.\n%\n", encoding="utf-8")

    man_de, man_en = tmp_path / "man" / "de", tmp_path / "man"
    (man_de / "man1").mkdir(parents=True)
    (man_en / "man1").mkdir(parents=True, exist_ok=True)
    (man_de / "man1" / "foo.1").write_text(MAN_DE, encoding="utf-8")
    (man_en / "man1" / "foo.1").write_text(MAN_EN, encoding="utf-8")
    return data, PackagePaths(python_doc=doc, wordnet=wn, fortunes=fo, man_de=man_de, man_en=man_en, dpkg_info=None)


def build(fake, limit: int = 50, seed: int = 0):
    data, paths = fake
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing is missing unless a test says so
        return build_corpus(data, limit, seed=seed, paths=paths)


def test_every_category_and_source_is_present_when_sources_exist(fake):
    examples, stats = build(fake)
    for cat in CATEGORIES:
        assert stats[f"category/{cat}/examples"] > 0, cat
        assert any(e.category == cat for e in examples), cat
    assert {e.source for e in examples} == set(SOURCE_NAMES)
    assert not missing_sources(stats)
    assert all(e.prompt.strip() and e.response.strip() and e.category in CATEGORIES for e in examples)
    assert stats["total/examples"] == len(examples)
    assert stats["total/chars"] == sum(len(e.prompt) + len(e.response) for e in examples)
    for src in SOURCE_NAMES:
        assert stats[f"source/{src}/examples"] == sum(e.source == src for e in examples)


def test_responses_are_the_source_text_not_invented(fake):
    examples, _ = build(fake)
    by = lambda cat: [e for e in examples if e.category == cat]  # noqa: E731
    # translation pairs are the aligned paragraphs of the two manual pages, both directions
    assert any("auch versteckte Dateien verarbeiten" in e.prompt and "process hidden files as well" in e.response
               for e in by("translation"))
    assert any("process hidden files as well" in e.prompt and "auch versteckte Dateien verarbeiten" in e.response
               for e in by("translation"))
    # maths keeps the worked solution, without calculator annotations
    assert any(e.response.startswith("Tom has 3 + 4 = 7 apples.") and e.response.endswith("The answer is 7.")
               for e in by("math"))
    # a question about a documented function is answered by its documentation
    assert any("close_bar" in e.prompt and e.response.startswith("Close the bar file f.") for e in by("qa"))
    # a summary is the passage's lead, word for word
    for e in by("summarization"):
        if e.prompt.startswith(("Summarize", "Give a short", "TL;DR")):
            assert e.response in e.prompt
    # reasoning over the is-a hierarchy follows WordNet's hypernyms
    assert any("a dog is a kind of canine" in e.response for e in by("reasoning"))
    assert any(e.source == "folio" and "the conclusion follows from the premises" in e.response for e in by("reasoning"))


def test_benchmark_guard_drops_planted_spec_bench_and_mt_bench_texts(fake):
    examples, stats = build(fake)
    bad = [normalise(PLANTED), normalise(MT_PLANTED)]
    for e in examples:
        for t in (normalise(e.prompt), normalise(e.response)):
            assert not any(b in t for b in bad), e
    assert stats["source/gsm8k/benchmark_dropped"] >= 1
    assert stats["source/fortunes/benchmark_dropped"] >= 1
    assert stats["benchmark_turns"] == 4
    assert any("Tom has 3 apples" in e.prompt for e in examples)  # the rest of GSM8K stays


def test_guard_prefilter_agrees_with_is_benchmark(fake, tmp_path):
    data, _ = fake
    long_turn = ("Summarize the following article in three sentences: the council met on Monday to discuss "
                 "the new bridge, which will cost more than expected and open two years late.")
    write_jsonl(data / "spec_bench_questions.jsonl", [
        {"question_id": 1, "turns": [PLANTED]}, {"question_id": 2, "turns": [long_turn]},
        {"question_id": 3, "turns": ["x" * 45]}, {"question_id": 4, "turns": ["Short one."]},
    ])
    guard = BenchmarkGuard(data)
    words = long_turn.split()
    probes = [PLANTED, PLANTED.upper(), f"Please solve:\n{PLANTED}\nThanks.", long_turn[17:90], long_turn[3:60],
              "short one.", "Short one, longer text that is not a benchmark question at all.",
              "y" + "x" * 45 + "y", "x" * 30, "Write a haiku about the sea, please, in exactly three lines.",
              " ".join(words[2:9]), " ".join(words[5:]) + " And more words after it."]
    for p in probes:
        assert guard.hit(p) == is_benchmark(p, guard.bench, guard.bench_set), p
    assert guard.hit(long_turn[17:90]) and not guard.hit("Write a haiku about the sea, please, in exactly three lines.")


def test_same_seed_same_corpus_other_seed_differs(fake):
    a, sa = build(fake, limit=5, seed=1)
    b, sb = build(fake, limit=5, seed=1)
    c, _ = build(fake, limit=5, seed=2)
    assert a == b and sa == sb
    assert a != c


def test_limit_caps_each_category_and_mixes_sources(fake):
    examples, stats = build(fake, limit=2)
    for cat in CATEGORIES:
        assert 1 <= stats[f"category/{cat}/examples"] <= 2
    # reasoning has two sources (FOLIO, WordNet): a limit of 2 takes one of each
    assert {e.source for e in examples if e.category == "reasoning"} == {"folio", "wordnet-base"}


def test_missing_packages_are_skipped_and_reported(fake, tmp_path):
    data, paths = fake
    nowhere = tmp_path / "not-installed"
    gone = PackagePaths(python_doc=nowhere / "doc", wordnet=nowhere / "wn", fortunes=nowhere / "fo",
                        man_de=nowhere / "man" / "de", man_en=nowhere / "man", dpkg_info=None)
    with pytest.warns(UserWarning, match="skipped") as rec:
        examples, stats = build_corpus(data, 20, paths=gone)
    assert len(rec) == 4
    assert sorted(missing_sources(stats)) == sorted(["python3.11-doc", "wordnet-base", "fortunes", "manpages-de"])
    assert {e.source for e in examples} == {"gsm8k", "humaneval", "folio"}
    assert {e.category for e in examples} == {"math", "code", "reasoning"}
    assert stats["category/translation/examples"] == 0
    # and a missing shared data file is skipped the same way
    (data / "humaneval.jsonl.gz").unlink()
    with pytest.warns(UserWarning, match="humaneval"):
        _, stats = build_corpus(data, 20, paths=paths)
    assert missing_sources(stats) == ["humaneval"]


DEBIAN_SOURCES = {"python3.11-doc": ("python_doc",), "wordnet-base": ("wordnet",), "fortunes": ("fortunes",),
                  "manpages-de": ("man_de", "man_en")}


@pytest.mark.parametrize("present", sorted(DEBIAN_SOURCES))
def test_each_debian_source_alone(fake, tmp_path, present):
    data, paths = fake
    nowhere = tmp_path / "not-installed"
    alone = PackagePaths(**{f: getattr(paths, f) if f in DEBIAN_SOURCES[present] else nowhere / f
                            for fields in DEBIAN_SOURCES.values() for f in fields}, dpkg_info=None)
    with pytest.warns(UserWarning, match="skipped"):
        examples, stats = build_corpus(data, 20, paths=alone)
    assert sorted(missing_sources(stats)) == sorted(set(DEBIAN_SOURCES) - {present})
    assert {e.source for e in examples} == {"gsm8k", "humaneval", "folio", present}


def test_the_default_corpus_in_tests_is_a_new_machines(fake):
    """conftest hides the optional packages, so no test depends on what this machine installed."""
    from mlxspec.training import corpus

    data, _ = fake
    with pytest.warns(UserWarning, match="skipped"):
        examples, stats = build_corpus(data, 20)
    assert sorted(missing_sources(stats)) == sorted(DEBIAN_SOURCES)
    assert {e.source for e in examples} == {"gsm8k", "humaneval", "folio"}
    assert not corpus.system_paths().python_doc.exists()


def test_a_literal_block_right_after_its_paragraph_is_read_once():
    """No blank line between ``Text::`` and its block used to send rst_blocks round forever."""
    blocks = rst_blocks("Some text here::\n    code line\n\nAfter.")
    assert [(b.kind, b.text) for b in blocks] == [("para", "Some text here:"), ("code", "code line"), ("para", "After.")]
