"""A simple reading of reStructuredText (the Python documentation's sources): titles, plain
paragraphs, code, API entries and glossary terms, with inline markup as plain text."""

from __future__ import annotations

import re
from dataclasses import dataclass, field


@dataclass
class RstBlock:
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
_DIRECTIVE = re.compile(r"\.\. ([\w:-]+)::\s*(.*)$")
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


def rst_blocks(text: str) -> list[RstBlock]:
    """A simple reading of one .rst file: titles, paragraphs, code, API entries, glossary terms."""
    lines = text.expandtabs(8).splitlines()
    out: list[RstBlock] = []
    title = ""
    i = 0
    while i < len(lines):
        s = lines[i].strip()
        if not s:
            i += 1
        elif _is_title(lines, i):
            title = rst_inline(s) or s
            out.append(RstBlock("title", title, title))
            i += 2
        elif _UNDER.match(s):
            i += 1
        else:
            read = _directive if s.startswith(".. ") else _paragraph
            blocks, i = read(lines, i, title)
            out.extend(blocks)
    return out


def _indent(s: str) -> int:
    return len(s) - len(s.lstrip(" "))


def _is_title(lines: list[str], i: int) -> bool:
    """Line ``i`` is a section title: underlined by a run at least as long as itself."""
    s = lines[i].strip()
    return (i + 1 < len(lines) and _UNDER.match(lines[i + 1].strip()) is not None
            and len(lines[i + 1].strip()) >= len(s) and not _UNDER.match(s))


def _body_from(lines: list[str], i: int, ind: int) -> tuple[list[str], int]:
    """The block indented deeper than ``ind`` from line ``i``, dedented, and the line after it."""
    body = []
    while i < len(lines) and (not lines[i].strip() or _indent(lines[i]) > ind):
        body.append(lines[i])
        i += 1
    while body and not body[-1].strip():
        body.pop()
    if body:
        cut = min(_indent(b) for b in body if b.strip())
        body = [b[cut:] for b in body]
    return body, i


def _paras(body: list[str]) -> list[str]:
    """The leading description's paragraphs, each joined into one line."""
    out, cur = [], []
    for b in body + [""]:
        if b.strip() and not b.startswith(" ") and not b.lstrip().startswith((".. ", ":")):
            cur.append(b.strip())
        else:
            if cur:
                out.append(" ".join(cur))
            cur = []
            if b.strip():  # an indented or directive line ends the leading description
                break
    return out


def _described(body: list[str]) -> list[str]:
    return [p for p in (rst_inline(x) for x in _paras(body)) if p]


def _directive(lines: list[str], i: int, title: str) -> tuple[list[RstBlock], int]:
    """The API entry, code block or glossary terms of the directive at line ``i`` (other
    directives give nothing), and the line after the directive's body."""
    out: list[RstBlock] = []
    m = _DIRECTIVE.match(lines[i].strip())
    body, j = _body_from(lines, i + 1, _indent(lines[i]))
    name = m.group(1).split(":")[-1] if m else ""
    if name in _API and m:
        sig = m.group(2).strip()
        nm = re.match(r"([\w.]+)", sig)
        desc = _described([b for b in body if not b.startswith(":")])
        if nm and desc:
            out.append(RstBlock("api", desc[0], title, nm.group(1), sig, desc))
    elif name in _CODE and body:
        out.append(RstBlock("code", "\n".join(b for b in body if not b.startswith(":")).strip(), title))
    elif name == "glossary":
        out = _glossary(body, title)
    return out, j


def _glossary(body: list[str], title: str) -> list[RstBlock]:
    """The terms of a glossary directive's body, each with its description."""
    out = []
    k = 0
    while k < len(body):
        if not body[k].strip() or body[k].startswith(" "):
            k += 1
            continue
        term = body[k].strip()
        sub, k = [], k + 1
        while k < len(body) and (not body[k].strip() or body[k].startswith(" ")):
            sub.append(body[k])
            k += 1
        cut = min((len(x) - len(x.lstrip()) for x in sub if x.strip()), default=0)
        desc = _described([x[cut:] for x in sub])
        if desc:
            out.append(RstBlock("term", desc[0], title, term, "", desc))
    return out


def _paragraph(lines: list[str], i: int, title: str) -> tuple[list[RstBlock], int]:
    """The paragraph at line ``i`` (lines at its indent up to a blank line): code when it is a
    doctest, plain text at the top level, followed by its literal block when it ends in ``::``;
    tables, line blocks and lists are left out. Also the line after what was read."""
    out: list[RstBlock] = []
    ind = _indent(lines[i])
    j = i
    while j < len(lines) and lines[j].strip() and _indent(lines[j]) == ind:
        j += 1
    cur = [line.strip() for line in lines[i:j]]
    if cur[0].startswith(">>>"):
        return [RstBlock("code", "\n".join(line[ind:] for line in lines[i:j]).rstrip(), title)], j
    if (cur[0].startswith(("+-", "==", "|")) or re.match(r"^[-*#]\s|^\d+\.\s|^#\.\s", cur[0])
            or any(re.search(r"\S {3,}\S|^=+ +=", c) for c in cur)):
        return out, j
    raw = "\n".join(cur)
    literal = raw.endswith("::")
    if literal:
        raw = raw[:-2].rstrip() + (":" if not raw[:-2].endswith(" ") and raw[:-2].strip() else "")
    text = rst_inline(raw) if raw.strip() else None
    if text and ind == 0:
        out.append(RstBlock("para", text, title, raw=raw))
    if not literal:
        return out, j
    while j < len(lines) and not lines[j].strip():
        j += 1
    # from the block itself, not the blank line before it: with no blank line that line is the
    # paragraph's last, which would end the block at once and read the paragraph again forever
    body, j = _body_from(lines, j, ind) if j < len(lines) and _indent(lines[j]) > ind else ([], j)
    if body:
        out.append(RstBlock("code", "\n".join(body).strip(), title))
    return out, j
