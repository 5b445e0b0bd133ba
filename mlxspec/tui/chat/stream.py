"""A widget for text that only grows at its end: the answer being streamed."""

from __future__ import annotations

from bisect import bisect_right

from rich.text import Text
from textual.content import Content
from textual.geometry import Region, Size
from textual.strip import Strip
from textual.widget import Widget


class StreamText(Widget):
    """Text that grows at its end, drawn with Textual's line API.

    A ``Static`` re-wraps and re-renders all of its text on every update, so a streamed
    answer would cost more per step the longer it gets. Here an append re-wraps only the last
    paragraph (the text after the last line break), repaints only its lines and re-renders
    only those of them whose text changed."""

    DEFAULT_CSS = "StreamText { width: 1fr; height: auto; }"

    def __init__(self) -> None:
        super().__init__()
        self._paragraphs: list[Content] = [Content("")]
        self._width = 0
        self._lines: list[list[tuple[Content, Strip | None]]] = []  # per paragraph, wrapped
        self._flat: list[Strip | None] = []
        self._first_line: list[int] = []  # index in _flat of each paragraph's first line

    def set_text(self, text: Text) -> None:
        self._paragraphs = Content.from_rich_text(text).split("\n", allow_blank=True) or [Content("")]
        self._width = 0  # re-wrap everything
        self.refresh(layout=True)

    def append(self, text: Text) -> None:
        if not text:
            return
        parts = Content.from_rich_text(text).split("\n", allow_blank=True)
        last = len(self._paragraphs) - 1
        self._paragraphs[last] = self._paragraphs[last] + parts[0]
        self._paragraphs.extend(parts[1:])
        if not self._width:
            self.refresh(layout=True)
            return
        old_count = len(self._flat)
        first = self._first_line[last]
        self._wrap_from(last)
        if len(self._flat) != old_count:
            self.refresh(layout=True)
        else:
            self.refresh(Region(0, first, self._width, len(self._flat) - first))

    def _wrap(self, paragraph: Content, old: list[tuple[Content, Strip | None]]) -> list[tuple[Content, Strip | None]]:
        lines = paragraph.wrap(self._width) or [Content("")]
        kept = {(c.plain, tuple(c.spans)): strip for c, strip in old}
        return [(line, kept.get((line.plain, tuple(line.spans)))) for line in lines]

    def _wrap_from(self, index: int) -> None:
        """Re-wrap paragraphs ``index``.. at the current width (strips made lazily)."""
        old = self._lines[index:] if index < len(self._lines) else []
        del self._lines[index:]
        for i, paragraph in enumerate(self._paragraphs[index:]):
            self._lines.append(self._wrap(paragraph, old[i] if i < len(old) else []))
        self._first_line = []
        self._flat = []
        for lines in self._lines:
            self._first_line.append(len(self._flat))
            self._flat.extend(strip for _, strip in lines)

    def _ensure_width(self, width: int) -> None:
        if width and width != self._width:
            self._width = width
            self._lines = []
            self._wrap_from(0)

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        self._ensure_width(width)
        return len(self._flat)

    def render_line(self, y: int) -> Strip:
        width = self.size.width
        self._ensure_width(width)
        style = self.visual_style
        if not 0 <= y < len(self._flat):
            return Strip.blank(width, style.rich_style)
        strip = self._flat[y]
        if strip is None or strip.cell_length != width:
            paragraph = bisect_right(self._first_line, y) - 1
            row = y - self._first_line[paragraph]
            line, _ = self._lines[paragraph][row]
            strip = Strip(line.render_segments(style), line.cell_length).extend_cell_length(width, style.rich_style)
            self._lines[paragraph][row] = (line, strip)
            self._flat[y] = strip
        return strip

    def on_resize(self) -> None:
        self.refresh(layout=True)
