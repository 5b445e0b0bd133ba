"""The chat screen's widgets. They render what the app hands them; none of them calls a model."""

from __future__ import annotations

from dataclasses import dataclass, replace

from rich.style import Style
from rich.text import Text
from textual import events
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.message import Message
from textual.widgets import Static, TextArea

from mlxspec.core.events import Status
from mlxspec.core.tree import children

from .messages import Piece, StepData, TurnResult
from .source import Settings
from .stats import Baseline, TurnStats
from .stream import StreamText

# One palette per background. Mid-saturation hues (GitHub's dark / light "fg" scales) so each
# stays readable on its own background; corrections are bold as well, so they do not depend on
# telling red from green; rejected drafts are struck through.
PALETTES: dict[bool, dict[Status, Style]] = {
    True: {  # dark
        Status.ACCEPTED: Style.parse("#3fb950"),
        Status.CORRECTED: Style.parse("bold #f0883e"),
        Status.BONUS: Style.parse("#58a6ff"),
        Status.PLAIN: Style.parse("#e6edf3"),
        Status.REJECTED: Style.parse("strike #f85149"),
    },
    False: {  # light
        Status.ACCEPTED: Style.parse("#1a7f37"),
        Status.CORRECTED: Style.parse("bold #bc4c00"),
        Status.BONUS: Style.parse("#0550ae"),
        Status.PLAIN: Style.parse("#1f2328"),
        Status.REJECTED: Style.parse("strike #cf222e"),
    },
}
LEGEND_ORDER = (Status.ACCEPTED, Status.CORRECTED, Status.BONUS, Status.PLAIN, Status.REJECTED)


def status_style(status: Status, dark: bool = True) -> Style:
    return PALETTES[dark][status]


def update_in_place(widget: Static, content: Text) -> None:
    """``Static.update`` without a layout pass unless the widget's height changes: a layout
    pass re-arranges and repaints the whole screen, several ms of the UI thread each time."""
    widget.update(content, layout=False)
    width, height = widget.content_size
    if not width or widget.visual.get_height(widget.styles, width) != height:
        widget.refresh(layout=True)


class Themed:
    """Mixin: re-render when the app switches between dark and light themes."""

    @property
    def dark(self) -> bool:
        return self.app.current_theme.dark

    def on_mount(self) -> None:
        self.app.theme_changed_signal.subscribe(self, lambda _theme: self.rerender())
        self.rerender()

    def rerender(self) -> None:
        raise NotImplementedError


# The Ctrl keys the chat's own bindings use: the question box leaves them to the app.
APP_KEYS = {"ctrl+k", "ctrl+j", "ctrl+o", "ctrl+b", "ctrl+t", "ctrl+d", "ctrl+r", "ctrl+g", "ctrl+n", "ctrl+s",
            "ctrl+q", "ctrl+c"}
# Keys that start a new line in the question (Enter sends it). Most terminals send Enter, Alt+Enter
# and Ctrl+Enter alike (Textual reads ESC CR as Enter), so Ctrl+L, which every one sends as its own
# byte; Shift+Enter and Alt+Enter where the terminal tells them apart (kitty's keyboard protocol).
NEWLINE_KEYS = ("ctrl+l", "shift+enter", "alt+enter")


def _kept(binding: Binding) -> Binding | None:
    """``binding`` without the keys the app takes, or None when none is left."""
    keys = [k for k in binding.key.split(",") if k not in APP_KEYS]
    return replace(binding, key=",".join(keys)) if keys else None


class Prompt(TextArea, inherit_bindings=False):
    """The question box: several lines, so a pasted paragraph arrives whole; Enter sends,
    Ctrl+L starts a new line; Up on the first line and Down on the last walk through the
    questions already sent. The Delete key deletes; the Ctrl keys the chat uses are the app's."""

    BINDINGS = [b for b in map(_kept, TextArea.BINDINGS) if b is not None]

    @dataclass
    class Submitted(Message):
        prompt: Prompt
        value: str

    def __init__(self, placeholder: str = "", id: str | None = None) -> None:
        super().__init__(id=id, placeholder=placeholder, soft_wrap=True, compact=True, highlight_cursor_line=False)
        self.sent: list[str] = []  # the questions sent, oldest first
        self._at = 0  # which of them is shown; len(sent): the one being written
        self._draft = ""  # what was being written when Up first left it

    @property
    def value(self) -> str:
        return self.text

    @value.setter
    def value(self, text: str) -> None:
        self.load_text(text)
        self.move_cursor(self.document.end)

    def remember(self, text: str) -> None:
        """A question sent: the last one Up brings back; the box is empty again."""
        if not self.sent or self.sent[-1] != text:
            self.sent.append(text)
        self._at, self._draft = len(self.sent), ""
        self.clear()

    async def _on_key(self, event: events.Key) -> None:
        if event.key == "enter" or event.key in NEWLINE_KEYS:
            event.stop()
            event.prevent_default()
            if event.key == "enter":
                self.post_message(self.Submitted(self, self.text))
            else:
                self.insert("\n")
            return
        await super()._on_key(event)

    def action_cursor_up(self, select: bool = False) -> None:
        if select or self.cursor_location[0] > 0 or not self._recall(-1):
            super().action_cursor_up(select)

    def action_cursor_down(self, select: bool = False) -> None:
        if select or self.cursor_location[0] < self.document.line_count - 1 or not self._recall(1):
            super().action_cursor_down(select)

    def _recall(self, step: int) -> bool:
        """Show the question ``step`` away in the history (past its end: what was being written)."""
        at = self._at + step
        if not 0 <= at <= len(self.sent):
            return False
        if self._at == len(self.sent):
            self._draft = self.text
        self._at = at
        self.value = self.sent[at] if at < len(self.sent) else self._draft
        return True


class UserMessage(Static):
    pass


class Note(Static):
    pass


class ErrorMessage(Static):
    pass


class Answer(Themed, Vertical):
    """The assistant's reply: one span per token, styled by its status."""

    def __init__(self, label: str, show_rejected: bool = False) -> None:
        super().__init__()
        self.border_title = label
        self.pieces: list[Piece] = []
        self.show_rejected = show_rejected
        self.body = StreamText()

    def compose(self) -> ComposeResult:
        yield self.body

    @property
    def output(self) -> str:
        """The reply as the conversation history keeps it (rejected drafts left out)."""
        return "".join(p.text for p in self.pieces if p.emitted)

    @property
    def text(self) -> Text:
        """The whole reply as shown: one span per visible token."""
        return self._render_pieces(self.pieces)

    def _render_pieces(self, pieces: list[Piece] | tuple[Piece, ...]) -> Text:
        text, dark = Text(), self.dark
        for piece in pieces:
            if not piece.text:
                continue
            if piece.emitted:
                text.append(piece.text, status_style(piece.status, dark))
            elif self.show_rejected:  # inline: a refused line break must not break the line
                text.append(piece.text.replace("\n", "↵"), status_style(piece.status, dark))
        return text

    def add(self, steps: list[StepData]) -> None:
        new = [piece for step in steps for piece in step.pieces]
        self.pieces.extend(new)
        self.body.append(self._render_pieces(new))

    def finish(self, tail: str, summary: str) -> None:
        if tail:  # bytes the streaming decoder held back: part of the last emitted token
            last = next((p for p in reversed(self.pieces) if p.emitted), Piece("", Status.PLAIN))
            self.pieces.append(Piece(tail, last.status))
            self.rerender()
        self.border_subtitle = summary

    def set_show_rejected(self, show: bool) -> None:
        self.show_rejected = show
        self.rerender()

    def rerender(self) -> None:
        self.body.set_text(self.text)


class Transcript(VerticalScroll):
    """The conversation, newest at the bottom; stays scrolled to the end unless the user
    scrolls up."""

    def on_mount(self) -> None:
        self.anchor()

    def add_user(self, text: str) -> None:
        self.mount(UserMessage(Text(text)))

    def add_answer(self, label: str, show_rejected: bool) -> Answer:
        answer = Answer(label, show_rejected)
        self.mount(answer)
        return answer

    def add_note(self, text: str) -> Note:
        note = Note(Text(text))
        self.mount(note)
        return note

    def add_error(self, text: str) -> None:
        self.mount(ErrorMessage(Text(text)))

    def clear(self) -> None:
        self.remove_children()

    def set_show_rejected(self, show: bool) -> None:
        for answer in self.query(Answer):
            answer.set_show_rejected(show)


class Legend(Themed, Static):
    """Which colour means what, and whether rejected drafts are shown."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.show_rejected = False

    def set_show_rejected(self, show: bool) -> None:
        self.show_rejected = show
        self.rerender()

    def rerender(self) -> None:
        t = Text()
        for status in LEGEND_ORDER:
            t.append(status.value, status_style(status, self.dark))
            if status is Status.REJECTED:
                t.append(" (shown)" if self.show_rejected else " (hidden: ^r)", "dim")
            t.append("  ")
        self.update(t)


def _bar(fraction: float, width: int, style: Style) -> Text:
    full = round(max(0.0, min(1.0, fraction)) * width)
    return Text.assemble(("█" * full, style), ("░" * (width - full), "dim"))


def _num(x: float | None, fmt: str, unit: str = "") -> str:
    return "–" if x is None else f"{x:{fmt}}{unit}"


def render_stats(stats: TurnStats | None, settings: Settings, baseline: Baseline,
                 busy: bool = False, dark: bool = True, bar_width: int = 14) -> Text:
    """The side panel's text: settings, speed, acceptance, timings, per-position bars and the
    accepted-length histogram."""
    t = Text()
    _settings_rows(t, settings)
    _speed_rows(t, stats, baseline, busy)
    _speculation_rows(t, stats)
    _cascade_rows(t, stats, settings)
    _acceptance_bars(t, stats, status_style(Status.ACCEPTED, dark), bar_width)
    t.rstrip()
    return t


def _head(t: Text, title: str) -> None:
    t.append(f"{title}\n", "bold underline")


def _row(t: Text, name: str, value: str) -> None:
    t.append(f"{name:<15}", "dim")
    t.append(f"{value}\n")


def _settings_rows(t: Text, settings: Settings) -> None:
    _head(t, "Settings (next turn)")
    _row(t, "speculation", "off" if settings.drafter == "none" else "on")  # drafter none: target-only
    _row(t, "drafter", settings.draft + ("" if settings.speculate else " (unused)"))
    if settings.tree is None:
        _row(t, "K", str(settings.k))
    else:
        _row(t, "tree", f"{settings.tree} ({settings.tree.nodes} nodes)")
    _row(t, "temperature", f"{settings.temp:g}" + "".join(f"  {name} {value:g}" for name, value in settings.params.filters))


def _speed_rows(t: Text, s: TurnStats | None, baseline: Baseline, busy: bool) -> None:
    _head(t, "\nSpeed" + (" (generating)" if busy else " (last turn)" if s else ""))
    _row(t, "tok/s now", _num(s and s.tps_now(), ".1f"))
    _row(t, "tok/s turn", _num(s and s.tps_turn(), ".1f"))
    if s and s.target_only:  # no speedup to speak of: nothing was drafted (by choice, or by auto K)
        _row(t, "speedup", "– (target-only turn)" if s.k == 0 else "– (nothing drafted)")
    else:
        _row(t, "speedup", _num(s and s.speedup(baseline), ".2f", "x"))
    t.append(f"  vs target-only {_num(baseline.tps, '.1f')} tok/s\n  ({baseline.source})\n", "dim")


def _speculation_rows(t: Text, s: TurnStats | None) -> None:
    _head(t, "\nSpeculation")
    _row(t, "steps", str(len(s.steps)) if s else "–")
    tree = bool(s and s.tree)
    k_now = s and s.k_now()
    _row(t, "nodes/step" if tree else "K in use", "–" if k_now is None else f"{k_now}  (mean {s.mean_k():.1f})")
    _row(t, "accepted/step", "–" if not (s and s.drafted) else _num(s.accepted_per_step(), ".2f"))
    _row(t, "tokens/step", _num(s and s.tokens_per_step(), ".2f"))
    rate = s and s.acceptance_rate()
    _row(t, "nodes kept" if tree else "acceptance", "–" if rate is None else f"{rate:.0%}")
    _row(t, "draft ms/step", _num(s and s.mean_draft_ms(), ".1f"))
    _row(t, "verify ms/step", _num(s and s.mean_verify_ms(), ".1f"))


def _cascade_rows(t: Text, s: TurnStats | None, settings: Settings) -> None:
    """A cascade's parts (``A+B``): each one's share of the steps and of its drafts accepted,
    one row per part whether or not it drafted yet, so the panel keeps its height."""
    parts = settings.draft.split("+")
    if len(parts) < 2:
        return
    _head(t, "\nDrafted by (steps, kept)")
    seen = {name: (share, kept) for name, share, kept in s.by_drafter()} if s else {}
    for name in parts:
        share, kept = seen.get(name, (None, None))
        label = name if len(name) <= 14 else name[:13] + "…"
        _row(t, label, "–" if share is None else f"{share:4.0%}  " + ("–" if kept is None else f"{kept:4.0%}"))


def _acceptance_bars(t: Text, s: TurnStats | None, hue: Style, bar_width: int) -> None:
    # One row per position / length up to the turn's K from its first step on, so that the
    # panel keeps its height through a turn (a height change costs a whole-screen layout).
    positions = s.position_rates() if s else []
    if positions:
        _head(t, "\nAccepted by tree depth" if s.tree else "\nAccepted by draft position")
        for i, r in positions:
            t.append(f"{i:>3} ", "dim")
            t.append_text(_bar(r or 0.0, bar_width, hue))
            t.append("    –\n" if r is None else f" {r:4.0%}\n")
    hist = s.length_histogram() if s else []
    if hist:
        _head(t, "\nAccepted length per step")
        top = max(n for _, n in hist) or 1
        for length, n in hist:
            t.append(f"{length:>3} ", "dim")
            t.append_text(_bar(n / top, bar_width, hue))
            t.append(f" {n}\n")


class StatsPanel(Themed, VerticalScroll):
    """The live side panel; the app calls ``show`` (at most every STATS_INTERVAL while a turn
    runs)."""

    def __init__(self, settings: Settings, **kwargs) -> None:
        super().__init__(**kwargs)
        self.settings, self.baseline = settings, Baseline()
        self.stats: TurnStats | None = None
        self.busy = False
        self.body = Static(id="stats-body")

    def compose(self) -> ComposeResult:
        yield self.body

    def show(self, stats: TurnStats | None, settings: Settings, baseline: Baseline, busy: bool) -> None:
        self.stats, self.settings, self.baseline, self.busy = stats, settings, baseline, busy
        self.rerender()

    def rerender(self) -> None:
        update_in_place(self.body, render_stats(self.stats, self.settings, self.baseline, self.busy, self.dark))


def _visible(text: str, limit: int = 18) -> str:
    """A token's text with its white space made visible, cut to ``limit`` characters."""
    shown = text.replace(" ", "·").replace("\n", "↵").replace("\t", "⇥").replace("\r", "␍") or "∅"
    return shown if len(shown) <= limit else shown[: limit - 1] + "…"


def render_tree(data: StepData, root: str | None, number: int | None = None, dark: bool = True) -> Text:
    """One tree step as an indented tree below the last committed token (``root``: its text,
    None at the start of a reply): the accepted path in the accepted tokens' colour, the other
    branches dimmed, and the target's own token under the last accepted node, in the colour the
    text gives it (a correction or a bonus), or an end mark where the reply ended instead (a
    stop token, the token limit)."""
    tree = data.step.tree
    assert tree is not None and data.nodes is not None
    kids = children(tree.parents)
    on_path = set(tree.path)
    last = tree.path[-1] if tree.path else -1
    own = next((p for p in reversed(data.pieces) if p.status in (Status.CORRECTED, Status.BONUS)), None)
    hue = status_style(Status.ACCEPTED, dark)

    t = Text(no_wrap=True, overflow="ellipsis")
    t.append("Last step's tree" + (f" (step {number})" if number else "") + "\n", "bold underline")
    t.append(f"{len(tree.tokens)} nodes, {len(tree.path)} accepted\n", "dim")
    t.append("● ", "dim")
    t.append(_visible(root) if root is not None else "(prompt)", "dim italic")

    def branch(node: int, prefix: str) -> None:
        below: list[int | None] = list(kids.get(node, []))
        if node == last:
            below.append(None)  # the target's token
        for j, child in enumerate(below):
            end = j == len(below) - 1
            t.append("\n" + prefix + ("└─ " if end else "├─ "), "dim")
            if child is None and own is None:
                t.append("∎ ◂ the reply ends", "dim")
            elif child is None:
                t.append(_visible(own.text), status_style(own.status, dark))
                t.append(f" ◂ target ({own.status.value})", "dim")
            if child is None:
                continue
            t.append(_visible(data.nodes[child]), hue if child in on_path else "dim")
            branch(child, prefix + ("   " if end else "│  "))

    branch(-1, "")
    return t


class TreePanel(Themed, VerticalScroll):
    """The last tree step of the turn on screen (``render_tree``), or a note saying why there
    is none. The app hands it a step at most once per drawn batch of steps; while hidden it
    only keeps the latest. Its text never gets shorter (blank lines pad it to the tallest so
    far): trees differ in size from step to step, and a change of height would cost a layout
    pass of the whole screen."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.body = Static(id="tree-body")
        self.step: StepData | None = None
        self.root: str | None = None
        self.number: int | None = None
        self.note = "No tree yet: the last step's draft tree shows here."
        self.lines = 0  # the tallest text so far

    def compose(self) -> ComposeResult:
        yield self.body

    def show_step(self, step: StepData, root: str | None, number: int | None = None) -> None:
        self.step, self.root, self.number, self.note = step, root, number, ""
        if self.display:
            self.rerender()

    def show_note(self, note: str) -> None:
        self.step, self.note = None, note
        if self.display:
            self.rerender()

    def rerender(self) -> None:
        content = (render_tree(self.step, self.root, self.number, self.dark) if self.step is not None
                   else Text(self.note, "dim"))
        width = self.body.content_size.width or self.content_size.width
        height = len(content.wrap(self.app.console, width)) if width else content.plain.count("\n") + 1
        if height < self.lines:
            content.append("\n" * (self.lines - height))
        self.lines = max(self.lines, height)
        update_in_place(self.body, content)


def summary_line(stats: TurnStats, result: TurnResult) -> str:
    """Shown under an answer when its turn ends."""
    parts = [f"{stats.tokens} tokens", f"{_num(stats.tps_turn(), '.1f')} tok/s"]
    if stats.drafted:
        parts.append(f"{_num(stats.accepted_per_step(), '.2f')} accepted/step")
    parts.append(f"stop: {result.stop_reason}")
    return " · ".join(parts)
