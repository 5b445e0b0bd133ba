"""Small text helpers the sources share: sentences, clipping to whole sentences, a seeded pick."""

from __future__ import annotations

import random
import re

_SENT = re.compile(r"(?<=[.!?])\s+(?=[A-Z`\"'(\[])")


def sentences(text: str) -> list[str]:
    return [s.strip() for s in _SENT.split(text.strip()) if s.strip()]


def clip(text: str, limit: int) -> str:
    """The longest run of whole sentences (at least one) within ``limit`` characters."""
    if len(text) <= limit:
        return text
    out = ""
    for s in sentences(text):
        if out and len(out) + 1 + len(s) > limit:
            break
        out = f"{out} {s}".strip()
    return out


def pick(rng: random.Random, options: list[str] | tuple[str, ...]) -> str:
    return options[rng.randrange(len(options))]


def strip_punct(text: str) -> str:
    return re.sub(r"[^\w\s'-]", "", text).lower()


def article(word: str) -> str:
    return "an " if word[:1].lower() in "aeiou" else "a "
