"""The corpus's records: an example, where the Debian packages put their text, the categories,
and the size limits every source keeps to."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

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


class SourceMissing(Exception):
    """A source's package or file is not on this machine: it is skipped and reported."""


def by_category() -> dict[str, list[Example]]:
    """An empty pool per category, the shape every source reader returns."""
    return {c: [] for c in CATEGORIES}
