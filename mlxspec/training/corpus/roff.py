"""man(7) pages read as paragraphs: section headings, plain paragraphs and the tagged items of
.TP and .IP, with escapes resolved; mdoc pages, macro definitions and unfilled text are left out."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

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
    """One line of roff text with its escapes resolved; None where a glyph is unknown."""
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
class RoffBlock:
    section: int
    kind: str  # h | p | tp | ip
    tag: str
    text: str


def roff_blocks(text: str) -> list[RoffBlock] | None:
    """Paragraphs of a man(7) page, with .TP/.IP tags; None for mdoc pages."""
    if re.search(r"^\.(Dd|Nm|Sh)\b", text, re.M):
        return None
    page = _Page()
    for line in text.splitlines():
        if page.skips(line):
            continue
        if line[:1] in ".'":
            line = page.request(line)
            if line is None:
                continue
        page.text(line)
    page.flush()
    return page.out


_BREAKS = ("PP", "P", "LP", "sp", "RS", "RE", "in")  # requests that end a paragraph and its tag


@dataclass
class _Page:
    """The reading of one page so far: the blocks, the paragraph being filled and the modes the
    requests set."""

    out: list[RoffBlock] = field(default_factory=list)
    sec: int = 0
    kind: str = "p"
    tag: str = ""
    cur: list[str] = field(default_factory=list)
    bad: bool = False  # the paragraph holds an escape we cannot render: dropped
    expect_tag: bool = False  # the next text line is a .TP tag
    nofill: bool = False  # inside .nf/.EX: examples and tables are left out
    skip_until: str | None = None  # inside a macro definition or a conditional block

    def flush(self) -> None:
        if self.cur and not self.bad and not self.nofill:
            t = re.sub(r"\s+", " ", " ".join(self.cur)).strip()
            if t:
                self.out.append(RoffBlock(self.sec, self.kind, self.tag, t))
        self.cur, self.bad = [], False

    def skips(self, line: str) -> bool:
        """Whether ``line`` is a comment, empty, or inside a block being skipped."""
        if self.skip_until is not None:
            if self.skip_until in line if self.skip_until != ".." else line.startswith(".."):
                self.skip_until = None
            return True
        return line.startswith(('.\\"', "'\\\"", '\\"')) or line.strip() in (".", "")

    def request(self, line: str) -> str | None:
        """Applies the control line ``line``; the text it carries (a font request's), else None."""
        m = re.match(r"[.']\s*(\S+)\s*(.*)$", line)
        if not m:
            return None
        req, args = m.group(1), m.group(2)
        if req in _FONT:
            return (" " if len(req) == 1 else "").join(_roff_args(args))
        if req == "de":
            self.skip_until = ".."
        elif req in ("ie", "if", "el"):
            if "\\{" in line and "\\}" not in line:
                self.skip_until = "\\}"
        elif req in ("SH", "SS"):
            self.heading(req, args)
        elif req in _BREAKS:
            self.flush()
            self.kind, self.tag = "p", ""
        elif req in ("TP", "TQ"):
            self.flush()
            self.expect_tag = True
        elif req == "IP":
            self.flush()
            a = _roff_args(args)
            self.kind, self.tag = "ip", (roff_inline(a[0]) or "") if a else ""
        elif req in ("nf", "EX"):
            self.flush()
            self.nofill = True
        elif req in ("fi", "EE"):
            self.cur = []
            self.nofill = False
        return None

    def heading(self, req: str, args: str) -> None:
        self.flush()
        if req == "SH":
            self.sec += 1
        h = roff_inline(" ".join(_roff_args(args)))
        if h:
            self.out.append(RoffBlock(self.sec, "h", "", h))
        self.kind, self.tag = "p", ""

    def text(self, line: str) -> None:
        t = roff_inline(line)
        if self.expect_tag:
            self.expect_tag = False
            self.kind, self.tag = "tp", (t or "").strip()
            if t is None:
                self.bad = True
        elif t is None:
            self.bad = True
        else:
            self.cur.append(t)
