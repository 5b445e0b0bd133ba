"""manpages-de with the English originals: German and English paragraphs of the same manual
page, aligned, as translation pairs in both directions. Only English pages a Debian package
installed are used, so each one's licence is on record (the stats name the packages)."""

from __future__ import annotations

import gzip
import random
import re
from collections.abc import Iterator
from pathlib import Path

from mlxspec.training.corpus.records import (
    MAX_PASSAGE,
    MAX_RESPONSE,
    Example,
    PackagePaths,
    SourceMissing,
    by_category,
)
from mlxspec.training.corpus.roff import RoffBlock, roff_blocks
from mlxspec.training.corpus.text import pick

SOURCE = "manpages-de"

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


def align_pages(de: list[RoffBlock], en: list[RoffBlock]) -> list[tuple[str, str]]:
    """German/English paragraph pairs of one page, in document order."""
    pairs: dict[int, tuple[str, str]] = {}
    # 1. same section structure: pair paragraph by paragraph
    if len(de) == len(en) and [(b.section, b.kind) for b in de] == [(b.section, b.kind) for b in en]:
        for i, (a, b) in enumerate(zip(de, en)):
            if a.kind != "h":
                pairs[i] = (a.text, b.text)
    else:
        # 2. option items with the same, unique option flags
        ie = _option_index(en)
        for k, i in _option_index(de).items():
            if k in ie:
                pairs[i] = (de[i].text, en[ie[k]].text)
        # 3. the NAME line
        if de and en and len(de) > 1 and len(en) > 1 and de[1].section == en[1].section == 1 and de[1].kind == en[1].kind == "p":
            pairs[1] = (de[1].text, en[1].text)
    return [pairs[i] for i in sorted(pairs) if _compatible(*pairs[i])]


def _option_index(blocks: list[RoffBlock]) -> dict[tuple[str, ...], int]:
    """Option flags -> the one tagged item documenting them (flags documented twice are left out)."""
    seen: dict[tuple[str, ...], list[int]] = {}
    for i, b in enumerate(blocks):
        k = _opt_key(b.tag) if b.kind in ("tp", "ip") else ()
        if k:
            seen.setdefault(k, []).append(i)
    return {k: v[0] for k, v in seen.items() if len(v) == 1}


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


def manpage_examples(paths: PackagePaths, rng: random.Random, want: int,
                     stats: dict[str, int]) -> dict[str, list[Example]]:
    """Pages in seeded order until ``want`` translation examples; counts in ``stats`` the pages
    used per package owning the English original."""
    de_root, en_root = paths.man_de, paths.man_en
    pages = sorted(p for p in de_root.glob("man*/*") if p.is_file()) if de_root.is_dir() else []
    if not pages:
        raise SourceMissing(str(de_root))
    owners = _dpkg_owners(paths.dpkg_info)
    rng.shuffle(pages)
    out = by_category()
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
        command = re.sub(r"\.\w+(\.gz)?$", "", p.name)
        used = 0
        for de_t, en_t in _passages(align_pages(de_b, en_b)):
            out["translation"] += _translations(de_t, en_t, command, rng)
            used += 1
        if used:
            key = f"source/{SOURCE}/en-pages-from/{owner}"
            stats[key] = stats.get(key, 0) + 1
        if len(out["translation"]) >= want:
            break
    return out


def _passages(pairs: list[tuple[str, str]]) -> Iterator[tuple[str, str]]:
    """Consecutive pairs joined while the German stays short, and only those that fit a prompt."""
    k = 0
    while k < len(pairs):
        de_t, en_t = pairs[k]
        k += 1
        while k < len(pairs) and len(de_t) + len(pairs[k][0]) < 600:
            de_t, en_t = f"{de_t}\n\n{pairs[k][0]}", f"{en_t}\n\n{pairs[k][1]}"
            k += 1
        if len(de_t) <= MAX_PASSAGE and len(en_t) <= MAX_RESPONSE:
            yield de_t, en_t


def _translations(de_t: str, en_t: str, command: str, rng: random.Random) -> list[Example]:
    where = pick(rng, ("", "", f" (from the manual page of `{command}`)"))
    return [Example("translation", pick(rng, (
                "Translate the following German text into English{w}:\n\n{t}",
                "Please translate this into English{w}.\n\n{t}",
                "German to English{w}:\n{t}")).format(w=where, t=de_t), en_t, SOURCE),
            Example("translation", pick(rng, (
                "Translate the following English text into German{w}:\n\n{t}",
                "Übersetze den folgenden Text ins Deutsche:\n\n{t}",
                "English to German{w}:\n{t}")).format(w=where, t=en_t), de_t, SOURCE)]
