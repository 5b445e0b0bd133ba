"""fortunes: short quotations, jokes, riddles and poems, as riddles and jokes on request (chat),
a person's or a fortune cookie's voice (roleplay), quips, poems and restored punctuation (writing)."""

from __future__ import annotations

import random
import re
from pathlib import Path

from mlxspec.training.corpus.records import Example, PackagePaths, SourceMissing, by_category
from mlxspec.training.corpus.text import pick, sentences, strip_punct

SOURCE = "fortunes"
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
    """The fortunes of one file, without ascii art, tables, control characters and mojibake."""
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


def fortune_examples(paths: PackagePaths, rng: random.Random) -> dict[str, list[Example]]:
    root = paths.fortunes
    files = [root / f for f in FORTUNE_FILES if (root / f).is_file()]
    if not files:
        raise SourceMissing(str(root))
    out = by_category()
    for path in files:
        for f in read_fortunes(path):
            body, who = _split_attribution(f)
            body = re.sub(r"[ \t]+", " ", body).strip() if "\n\n" not in body else body.strip()
            if len(body) < 25:
                continue
            if path.name == "riddles":
                exs = [_ex("chat", pick(rng, ("Tell me a riddle.", "Got a good riddle or joke for me?", "Ask me a funny riddle.")), body)]
            elif path.name == "tao":
                exs = _tao_poem(body)
            else:
                exs = _quote_examples(body, who, _TOPIC.get(path.name, "life"), rng)
            for ex in exs:
                out[ex.category].append(ex)
    return out


def _ex(category: str, prompt: str, response: str) -> Example:
    return Example(category, prompt, response, SOURCE)


def _tao_poem(body: str) -> list[Example]:
    lines = body.split("\n")
    if len(lines) >= 4 and len(lines[0]) < 40:
        return [_ex("writing", f"Write a short poem titled \"{lines[0].strip()}\" in the style of the Tao Te Ching.",
                    "\n".join(x.strip() for x in lines[1:]).strip())]
    return []


def _quote_examples(body: str, who: str, topic: str, rng: random.Random) -> list[Example]:
    """A quotation in its author's voice (or a fortune cookie's, and then nothing else), a quip
    or a quote about its file's topic, and its punctuation to restore."""
    out = []
    name = who.split(",")[0].strip().strip('"')
    if who and _PERSON.fullmatch(name) and not _NOT_PERSON & set(name.lower().split()):
        out.append(_ex("roleplay", pick(rng, (f"Pretend you are {name}. Share one of your thoughts, in your own words.",
                                              f"Roleplay as {name} and say something characteristic.",
                                              f"You are {name}. Stay in character and tell me what's on your mind.")),
                       body))
    elif rng.random() < 0.5:
        return [_ex("roleplay", pick(rng, ("You are a fortune cookie. What is my fortune?",
                                           "Act as the Unix `fortune` program and print a fortune.",
                                           "Play a wise old mentor and give me one piece of advice.")), body)]
    if rng.random() < 0.5:
        out.append(_ex("writing", pick(rng, (f"Write a witty one-liner about {topic}.", f"Write a short, funny quip about {topic}.",
                                             f"Write an aphorism about {topic}.")), body))
    else:
        out.append(_ex("chat", pick(rng, (f"Tell me something funny about {topic}.", f"Do you know a good quote about {topic}?",
                                          f"Cheer me up with a joke about {topic}.")),
                       body + (f"\n-- {who}" if who else "")))
    if 2 <= len(sentences(body)) and "\n\n" not in body and 60 <= len(body) <= 500:
        out.append(_ex("writing", "Restore the capitalisation and punctuation of this text:\n\n" + strip_punct(body).replace("\n", " "),
                       re.sub(r"\s*\n\s*", " ", body)))
    return out
