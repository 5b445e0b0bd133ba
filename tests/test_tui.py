"""The chat UI (tui/): deterministic checks on a scripted event source, then a few short turns
on the real default model (marked ``model``). Textual's ``run_test`` drives the app headless."""

import asyncio
import html
import json
import math
import re
import time
from dataclasses import replace

import pytest
from helpers import one_line_error
from pilot import run, wait_for
from rich.style import Style
from rich.text import Text

import mlxspec  # noqa: F401  (fast BLAS before mlx)
from mlxspec.core.events import Status, Step, Token
from mlxspec.core.sampling import SamplingParams
from mlxspec.tui.chat.app import STARTUP_SOURCE, TIMED_SOURCE, ChatApp
from mlxspec.tui.chat.fake import SCRIPT, TREE_SCRIPT, FakeSource
from mlxspec.tui.chat.messages import Piece, StepData, TurnResult
from mlxspec.tui.chat.source import K_MAX, ModelSource, Settings
from mlxspec.tui.chat.stats import Baseline, TurnStats
from mlxspec.tui.chat.widgets import Answer, ErrorMessage, Note, Prompt, TreePanel, status_style

SIZE = (120, 40)


# ----------------------------------------------------------------------------- helpers
async def ready(pilot, app: ChatApp) -> None:
    await wait_for(pilot, lambda: app.info is not None, timeout=120)


async def ask(pilot, app: ChatApp, text: str) -> None:
    app.query_one(Prompt).value = text
    await pilot.press("enter")


async def turn_done(pilot, app: ChatApp, timeout: float = 120.0) -> None:
    await wait_for(pilot, lambda: app.running is None, timeout)
    await pilot.pause()


def spans(answer: Answer) -> list[tuple[str, Style]]:
    text = answer.text
    return [(text.plain[s.start : s.end], s.style) for s in text.spans]


def expected_spans(pieces, show_rejected: bool = False, dark: bool = True) -> list[tuple[str, Style]]:
    return [(p.text if p.emitted else p.text.replace("\n", "↵"), status_style(p.status, dark))
            for p in pieces if p.text and (p.emitted or show_rejected)]


def screen_lines(app: ChatApp) -> list[str]:
    """The screen as text lines, read back from Textual's own SVG screenshot (each cell placed
    by its x coordinate: the SVG leaves out runs of plain spaces)."""
    svg = app.export_screenshot()
    cells = [(float(x), float(y), float(w), html.unescape(body).replace("\xa0", " "))
             for x, y, w, body in re.findall(
                 r'<text[^>]* x="([\d.]+)" y="([\d.]+)" textLength="([\d.]+)"[^>]*>([^<]*)</text>', svg)
             if body]
    cw = min(w / len(t) for _, _, w, t in cells)
    x0 = min(x for x, _, _, _ in cells)
    rows: dict[float, dict[int, str]] = {}
    for x, y, _, text in cells:
        row = rows.setdefault(y, {})
        for i, ch in enumerate(text):
            row[round((x - x0) / cw) + i] = ch
    return ["".join(row.get(c, " ") for c in range(max(row) + 1)).rstrip() for _, row in sorted(rows.items())]


def screen_text(app: ChatApp) -> str:
    return "\n".join(screen_lines(app))


SCRIPT_PIECES = [Piece(text, status) for _, _, pieces in SCRIPT for text, status in pieces]
CHAT_DEFAULT = SamplingParams(1.0, min_p=0.1)  # the chat's sampling for the default model (registry: chat_sampling)
CHAT_DEFAULT_LABEL = "T=1 min-p=0.1"


def fake_app(**kw) -> tuple[ChatApp, FakeSource]:
    settings = kw.pop("settings", Settings(draft="ngram:3"))
    note = kw.pop("sampling_note", "")
    src = FakeSource(**kw)
    return ChatApp(src, settings, clock=src.clock, sampling_note=note), src


# ----------------------------------------------------------------------------- statistics
def _step(k: int, accepted: int, t: float, emitted: int | None = None, draft_ms=2.0, verify_ms=100.0) -> StepData:
    n = accepted + 1 if emitted is None else emitted
    pieces = tuple([Piece("a", Status.ACCEPTED)] * accepted + [Piece("r", Status.REJECTED)] * (k - accepted)
                   + [Piece("c", Status.CORRECTED if accepted < k else Status.BONUS)] * (n - accepted))
    step = Step([Token(i, p.status) for i, p in enumerate(pieces)], k, accepted, draft_ms, verify_ms, room=k)
    return StepData(pieces, step, t)


def test_turn_stats():
    s = TurnStats(started=0.0)
    assert s.tps_now() is None and s.tps_turn() is None and s.acceptance_rate() is None
    for i, (k, acc) in enumerate([(4, 4), (4, 0), (2, 1), (4, 2)]):
        s.add(_step(k, acc, t=1.0 + i * 0.5))
    assert s.tokens == 5 + 1 + 2 + 3
    assert s.acceptance_rate() == pytest.approx(7 / 14)
    assert s.accepted_per_step() == pytest.approx(7 / 4)
    assert s.tokens_per_step() == pytest.approx(11 / 4)
    # position 1: reached by all 4 steps, kept by 3; position 3: reached by 3, kept by 1
    assert s.position_rates() == [(1, 0.75), (2, 0.5), (3, 1 / 3), (4, 1 / 3)]
    assert s.length_histogram() == [(0, 1), (1, 1), (2, 1), (3, 0), (4, 1)]
    assert s.tps_turn() == pytest.approx((11 - 5) / 1.5)  # tokens after the first step / time since
    assert s.tps_now(window=2) == pytest.approx((2 + 3) / 1.0)
    assert s.speedup(Baseline(250.0, "x")) == pytest.approx(s.tps_turn() / 4.0)
    s.result = TurnResult("eos", "", decode_tps=3.0)
    assert s.tps_turn() == 3.0  # the engine's own figure once the turn is done
    assert s.target_only_ms() is None  # not a target-only turn
    assert s.one_token_ms() is None  # no undrafted step after the first


def test_a_cascade_turn_shows_each_part_and_its_acceptance():
    from mlxspec.tui.chat.widgets import render_stats

    s = TurnStats(started=0.0)
    for i, (k, acc, who) in enumerate([(4, 4, "ngram:3"), (2, 0, "smollm2-135m-eagle"), (0, 0, None),
                                       (4, 2, "ngram:3")]):
        d = _step(k, acc, t=float(i))
        s.add(replace(d, step=replace(d.step, drafter=who)))
    assert s.by_drafter() == [("ngram:3", 0.5, 0.75), ("smollm2-135m-eagle", 0.25, 0.0)]
    settings = Settings(draft="ngram:3+smollm2-135m-eagle")
    text = render_stats(s, settings, Baseline()).plain
    assert "Drafted by (steps, kept)" in text
    assert re.search(r"ngram:3 +50% +75%", text) and re.search(r"smollm2-135m-… +25% +0%", text)
    fresh = render_stats(None, settings, Baseline()).plain  # before any turn: the same rows, empty
    assert len(fresh.splitlines()) >= 3 and re.search(r"ngram:3 +–", fresh)
    assert "Drafted by" not in render_stats(s, Settings(draft="ngram:3"), Baseline()).plain


def test_target_only_turn_gives_a_baseline_in_the_measure_of_a_turns_speed():
    """Wall time per token after the first step, as ``tps_turn`` measures a speculative turn:
    one slow step in four counts (its median, 0.1 s, would call target-only 2.3x as fast)."""
    s = TurnStats(started=0.0)
    for t in (0.0, 0.1, 0.2, 0.7):  # steps of 0.1, 0.1 and 0.5 s after the first
        s.add(_step(0, 0, t=t, verify_ms=100.0))
    assert s.target_only and s.target_only_ms() == pytest.approx(700.0 / 3)
    s.result = TurnResult("length", "", decode_tps=5.0)
    assert s.target_only_ms() == pytest.approx(200.0)  # the engine's own figure once the turn is done
    assert s.acceptance_rate() is None and s.position_rates() == [] and s.length_histogram() == []


def test_stream_text_appends_draw_what_a_full_redraw_draws():
    from textual.app import App

    from mlxspec.tui.chat.stream import StreamText

    chunks = ["Hello", " world", ", this is", " a long", "er\n\nparagraph", " with", " wrapping", " text that",
              " keeps", " going.\n", "x" * 30, " end", "\n"]

    class Two(App):
        def compose(self):
            yield StreamText()
            yield StreamText()

    async def go():
        app = Two()
        async with app.run_test(size=(24, 30)) as pilot:
            streamed, whole = app.query(StreamText)
            for chunk in chunks:
                streamed.append(Text(chunk, style="red"))
                await pilot.pause()
            whole.set_text(Text("".join(chunks), style="red"))
            await pilot.pause()
            drawn = [[w.render_line(y).text.rstrip() for y in range(w.size.height)] for w in (streamed, whole)]
            assert drawn[0] == drawn[1]
            assert drawn[0][:4] == ["Hello world, this is a", "longer", "", "paragraph with wrapping"]
            assert "x" * 24 in drawn[0] and drawn[0][-1] == ""

    run(go())


# ----------------------------------------------------------------------------- scripted source
def test_chat_screen_with_scripted_events():
    """Snapshot-style: a scripted turn, then the transcript's spans, the panel and the screen."""

    async def go():
        app, src = fake_app()
        async with app.run_test(size=SIZE) as pilot:
            await ready(pilot, app)
            await ask(pilot, app, "What is speculative decoding?")
            await turn_done(pilot, app)

            answer = app.query_one(Answer)
            assert answer.pieces == SCRIPT_PIECES  # one piece per engine token, in order
            assert len(app.stats.steps) == len(SCRIPT)  # one message per verification step
            assert spans(answer) == expected_spans(SCRIPT_PIECES)  # rejected drafts hidden by default
            out = "".join(p.text for p in SCRIPT_PIECES if p.emitted)
            assert answer.text.plain == out
            assert app.history == [{"role": "user", "content": "What is speculative decoding?"},
                                   {"role": "assistant", "content": out}]
            assert src.requests[0][0] == app.history[:1]

            # The statistics follow from the script: 22 tokens over 8 steps, 14 of 20 drafts kept.
            s = app.stats
            assert (s.tokens, len(s.steps), s.accepted, s.drafted) == (22, 8, 14, 20)
            assert s.length_histogram() == [(0, 1), (1, 1), (2, 0), (3, 3), (4, 1)]

            screen = screen_text(app)
            lines = screen_lines(app)
            assert "mlxspec chat" in lines[0] and "fake-target float32 + ngram:3 K=4" in lines[0]
            assert "fake backend" in lines[0]
            for needle in ["What is speculative decoding?", "Speculative decoding lets a small draft propose",
                           "ngram:3 K=4 · T=0", "22 tokens", "stop: eos",
                           "accepted  corrected  bonus  plain  rejected (hidden: ^r)",
                           "speculation    on", "K              4", "acceptance     70%",
                           "accepted/step  1.75", "tokens/step    2.75", "tok/s turn     20.9",
                           "speedup        2.30x", "vs target-only 9.1 tok/s", f"({STARTUP_SOURCE})",
                           "draft ms/step  1.8", "verify ms/step 136.2",
                           "Accepted by draft position", "Accepted length per step",
                           "^k K+", "^j K-", "^b spec", "^t temp", "^d draft", "^r rejected",
                           "esc stop", "^n new", "^s save", "^q quit"]:
                assert needle in screen, needle
            assert " guess" not in screen  # a rejected draft, hidden
            # Position bars: 83% 67% 67% 50%.
            assert re.search(r"1 [█░]+\s+83%", screen) and re.search(r"4 [█░]+\s+50%", screen)
            # Each status's colour is on the screen.
            svg = app.export_screenshot()
            for status in Status:
                assert status_style(status, True).color.name in svg, status

    run(go())


def test_rejected_drafts_toggle_struck_through():
    async def go():
        app, _ = fake_app()
        async with app.run_test(size=SIZE) as pilot:
            await ready(pilot, app)
            await ask(pilot, app, "hi")
            await turn_done(pilot, app)
            answer = app.query_one(Answer)
            await pilot.press("ctrl+r")
            assert app.show_rejected
            got = spans(answer)
            assert got == expected_spans(SCRIPT_PIECES, show_rejected=True)
            rejected = [(t, st) for t, st in got if st.strike]
            assert [t for t, _ in rejected] == [p.text.replace("\n", "↵") for p in SCRIPT_PIECES
                                               if p.status is Status.REJECTED]
            assert "are↵ dropped" in answer.text.plain  # a refused line break stays inline
            assert "rejected (shown)" in screen_text(app) and " guess" in screen_text(app)
            await pilot.press("ctrl+r")
            assert spans(answer) == expected_spans(SCRIPT_PIECES)

    run(go())


def test_light_theme_switches_palette():
    async def go():
        app, _ = fake_app()
        async with app.run_test(size=SIZE) as pilot:
            await ready(pilot, app)
            await ask(pilot, app, "hi")
            await turn_done(pilot, app)
            app.theme = "textual-light"
            await pilot.pause()
            assert spans(app.query_one(Answer)) == expected_spans(SCRIPT_PIECES, dark=False)

    run(go())


def test_keys_change_settings_for_the_next_turn():
    async def go():
        app, src = fake_app(settings=Settings(draft="ngram:3", k=4))
        async with app.run_test(size=SIZE) as pilot:
            await ready(pilot, app)
            await pilot.press("ctrl+k", "ctrl+k")
            assert app.settings.k == 6
            await pilot.press("ctrl+j")
            assert app.settings.k == 5
            assert "K=5" in app.sub_title and "K              5" in screen_text(app)
            app.settings = replace(app.settings, k=1)
            await pilot.press("ctrl+j")
            assert app.settings.k == 1  # clamped
            app.settings = replace(app.settings, k=K_MAX)
            await pilot.press("ctrl+k")
            assert app.settings.k == K_MAX
            app.settings = replace(app.settings, k=3)

            await pilot.press("ctrl+b")
            assert not app.settings.speculate and app.settings.drafter == "none"
            assert "no draft" in app.sub_title and "speculation    off" in screen_text(app)
            await pilot.press("ctrl+b")
            assert app.settings.speculate and app.settings.drafter == "ngram:3"

            await pilot.press("ctrl+t")
            assert app.settings.temp == 0.3
            await pilot.press("ctrl+d")
            assert app.settings.draft == "suffix"
            await pilot.press("ctrl+d", "ctrl+d")
            assert app.settings.draft == "none" and app.settings.drafter == "none"
            assert "speculation    off" in screen_text(app)  # drafter none is target-only, whatever ^b says
            await pilot.press("ctrl+d")
            assert app.settings.draft == "ngram:3" and app.settings.speculate

            await ask(pilot, app, "hi")
            await turn_done(pilot, app)
            sent = src.requests[-1][1]
            assert (sent.draft, sent.k, sent.temp, sent.speculate) == ("ngram:3", 3, 0.3, True)
            assert app.query_one(Answer).border_title == "ngram:3 K=3 · T=0.3"
            # The keys work while the prompt has focus and text in it; the text stays.
            app.query_one(Prompt).value = "draft"
            await pilot.press("ctrl+k", "ctrl+d")
            assert app.query_one(Prompt).value == "draft" and app.settings.k == 4

    run(go())


def test_stop_keeps_the_partial_answer_then_chat_goes_on():
    async def go():
        app, src = fake_app(delay=0.15)
        async with app.run_test(size=SIZE) as pilot:
            await ready(pilot, app)
            await ask(pilot, app, "first")
            await wait_for(pilot, lambda: app.stats is not None and len(app.stats.steps) >= 2)
            await pilot.press("escape")
            await turn_done(pilot, app)
            answer = app.query_one(Answer)
            n = len(answer.pieces)
            assert 0 < n < len(SCRIPT_PIECES)
            assert answer.pieces == SCRIPT_PIECES[:n]
            assert app.stats.result.stop_reason == "stopped" and "stop: stopped" in screen_text(app)
            assert app.history[-1] == {"role": "assistant", "content": answer.output}
            assert answer.output and answer.text.plain == answer.output

            src.delay = 0.0
            await ask(pilot, app, "second")
            await turn_done(pilot, app)
            assert src.requests[-1][0] == app.history[:3]  # the partial answer is history
            assert len(app.query(Answer)) == 2

            await pilot.press("ctrl+n")
            await pilot.pause()
            assert app.history == [] and len(app.query(Answer)) == 0 and "New chat." in screen_text(app)

    run(go())


PARAGRAPH = ("Summarize this for me.\n\nThe print room moves upstairs in May.\nPrinting goes through the "
             "library meanwhile.\nThe network team adds two data points.\nCosts stay within the budget.")


def test_a_pasted_paragraph_reaches_the_model_whole_recalls_and_saves(tmp_path, monkeypatch):
    """Bracketed paste keeps every line; ^l adds one; Up and Down walk the questions
    sent; ^s writes the conversation as Markdown and JSON with each token's status; Esc closes
    the key list."""
    from textual import events
    from textual.widgets import HelpPanel

    monkeypatch.setenv("MLXSPEC_HOME", str(tmp_path))

    async def go():
        app, src = fake_app()
        async with app.run_test(size=SIZE) as pilot:
            await ready(pilot, app)
            prompt = app.query_one(Prompt)
            app.post_message(events.Paste(PARAGRAPH))  # as the terminal's bracketed paste arrives
            await pilot.pause()
            assert prompt.value == PARAGRAPH and PARAGRAPH.count("\n") == 5
            await pilot.press("enter")
            await turn_done(pilot, app)
            assert src.requests[-1][0][-1] == {"role": "user", "content": PARAGRAPH}  # whole, not its first line
            assert prompt.value == ""

            await pilot.press("a", "ctrl+l", "b")
            assert prompt.value == "a\nb"
            await pilot.press("up")  # on the second line: the cursor moves up
            assert prompt.value == "a\nb"
            await pilot.press("up")  # on the first: the last question sent
            assert prompt.value == PARAGRAPH
            await pilot.press("down", "down", "down", "down", "down", "down")  # past its last line: the draft again
            assert prompt.value == "a\nb"

            await pilot.press("ctrl+s")
            await pilot.pause()
            [md] = list((tmp_path / "chats").glob("chat-*.md"))
            record = json.loads(md.with_suffix(".json").read_text())
            [turn] = record["turns"]
            assert turn["user"] == PARAGRAPH and turn["assistant"] == app.query_one(Answer).output
            assert [t["status"] for t in turn["tokens"]] == [p.status.value for p in SCRIPT_PIECES]
            assert "rejected" in {t["status"] for t in turn["tokens"]} and turn["summary"].startswith("22 tokens")
            assert PARAGRAPH in md.read_text() and app.query_one(Answer).output in md.read_text()

            app.action_show_help_panel()
            await pilot.pause()
            assert app.screen.query(HelpPanel)
            await pilot.press("escape")
            await pilot.pause()
            assert not app.screen.query(HelpPanel)

    run(go())


def test_ui_thread_cost_per_step_is_measured():
    """The UI thread's CPU per verification step (drawing the answer, the panel at most every
    STATS_INTERVAL) can be measured around a turn. How much it is depends on the machine and its
    load, so it is no test's bound: ``python -m mlxspec.tui.chat.overhead`` measures it (with
    tokens/s in the app vs headless), BENCHMARKS.md section 6 records it. About 11-15 ms here
    (2 shared cores), the turn's start included, most of it the layout pass each new line of the
    answer costs. (The 3-6 ms once measured were of a UI that drew a turn's steps only when it
    ended: a 0 s Textual timer never fires, see ``RENDER_DELAY``.)"""

    async def go():
        app, src = fake_app(script=SCRIPT * 6, delay=0.05)
        async with app.run_test(size=SIZE) as pilot:
            await ready(pilot, app)
            cpu = time.thread_time()
            await ask(pilot, app, "a long one")
            while app.running is not None:  # plain sleeps: the pilot's own waiting costs CPU too
                await asyncio.sleep(0.05)
            return (time.thread_time() - cpu) / len(app.stats.steps)

    per_step = run(go())
    print(f"UI thread CPU per step: {per_step * 1e3:.1f} ms")
    assert isinstance(per_step, float) and math.isfinite(per_step) and per_step > 0


def test_model_load_error_is_shown_and_the_app_survives():
    async def go():
        app, _ = fake_app(fail_load="model 'nope' not found: not a registry name")
        async with app.run_test(size=SIZE) as pilot:
            await wait_for(pilot, lambda: len(app.query(ErrorMessage)) > 0)
            await pilot.pause()
            assert "Could not load the model: model 'nope' not found" in screen_text(app)
            await ask(pilot, app, "hello?")
            await pilot.press("ctrl+k")
            assert app.settings.k == 5 and app.is_running and app.history == []

    run(go())


def test_turn_error_is_shown_and_the_app_survives():
    async def go():
        app, src = fake_app(fail_turn="prompt is 9000 tokens; the model's context is 8192")
        async with app.run_test(size=SIZE) as pilot:
            await ready(pilot, app)
            await ask(pilot, app, "a very long question")
            await turn_done(pilot, app)
            assert "error: prompt is 9000 tokens; the model's context is 8192" in screen_text(app)
            assert app.history == [] and len(app.query(Answer)) == 0
            src.fail_turn = None
            await ask(pilot, app, "a short one")
            await turn_done(pilot, app)
            assert app.stats.result.stop_reason == "eos" and len(app.history) == 2

    run(go())


def test_unexpected_worker_error_is_shown():
    class Broken(FakeSource):
        def events(self, messages, settings, keep=True):
            raise RuntimeError("boom")

    async def go():
        src = Broken()
        app = ChatApp(src, clock=src.clock)
        async with app.run_test(size=SIZE) as pilot:
            await ready(pilot, app)
            await ask(pilot, app, "hi")
            await turn_done(pilot, app)
            assert "error: RuntimeError: boom" in screen_text(app) and app.is_running

    run(go())


@pytest.mark.parametrize("kwargs, message", [
    ({"k": 0}, "--k must be in 1..64"),
    ({"temp": -1.0}, "temperature must be a finite number >= 0"),
    ({"top_p": 0.0}, "top-p must be in"),
    ({"max_tokens": 0}, "--max-tokens must be > 0"),
    ({"dtype": "int3"}, "unknown dtype 'int3'"),
])
def test_run_chat_rejects_bad_options_before_starting(kwargs, message):
    from mlxspec.errors import MlxspecError
    from mlxspec.tui.chat.app import run_chat

    with pytest.raises(MlxspecError, match=message):
        run_chat(**kwargs)


def test_python_m_tui_takes_the_cli_option_names(monkeypatch, capsys):
    import mlxspec.tui.__main__ as entry

    calls = []
    monkeypatch.setattr(entry, "run_chat", lambda *a: calls.append(a))
    assert entry.main(["-m", "some.gguf", "-d", "ngram:2", "-k", "3", "-t", "0.5", "-n", "9"]) == 0
    assert calls == [("some.gguf", "ngram:2", 3, 0.5, None, 9, "auto")]  # top-p: the model's recommended
    monkeypatch.undo()  # the real run_chat refuses bad options before the UI starts
    assert entry.main(["--k", "0"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == ["error: --k must be in 1..64, got 0"]


def test_the_chats_defaults_are_the_models_recommended_settings(monkeypatch):
    """At T=0 the default model loops on everyday questions (issue 25, item 7): the chat starts
    at the settings chosen for it (``benchmarks/notes/2026-12-01-chat-defaults.md``), says so
    when ready, and a setting given on the command line wins over its default."""
    from mlxspec.core.sampling import SamplingParams
    from mlxspec.tui.chat import app as chat_app

    made = []
    monkeypatch.setattr(chat_app.ChatApp, "run", lambda self: made.append(self))
    monkeypatch.setattr(chat_app.ChatApp, "wait_for_worker_exit", lambda self: None)
    chat_app.run_chat(draft="none")
    assert made[-1].settings.params == SamplingParams(1.0, 1.0, 0, 0.1) == CHAT_DEFAULT
    assert made[-1].sampling_note.startswith(f"Sampling {CHAT_DEFAULT_LABEL} (the model's recommended: ")
    chat_app.run_chat(draft="none", temp=0.0)
    assert made[-1].settings.params == SamplingParams(0.0, 1.0, 0, 0.1)
    assert "(the rest the model's recommended" in made[-1].sampling_note

    async def go():  # and the Ready line and the panel show them
        app, _ = fake_app(settings=made[0].settings, sampling_note=made[0].sampling_note)
        async with app.run_test(size=SIZE) as pilot:
            await ready(pilot, app)
            await pilot.pause()
            left = " ".join(" ".join(line.partition("▏")[0] for line in screen_lines(app)).split())
            assert "Sampling T=1 min-p=0.1 (the model's recommended" in left
            assert panel_rows(app)["temperature"] == "1  min-p 0.1"

    run(go())


# ----------------------------------------------------------------------------- tree speculation
def tree_settings(spec: str = "3x2", nodes: int | None = 8) -> Settings:
    from mlxspec.core.tree import parse_tree

    return Settings(draft="ngram:3", tree=parse_tree(spec, nodes))


def tree_lines(panel: TreePanel) -> list[tuple[str, list[tuple[str, Style | str]]]]:
    """The panel's tree as (line, [(styled text, style), ...]) with the guides' dim spans left out."""
    from mlxspec.tui.chat.widgets import render_tree

    text = render_tree(panel.step, panel.root, panel.number)
    out = []
    for line in text.split("\n"):
        styled = [(line.plain[sp.start:sp.end], sp.style) for sp in line.spans
                  if line.plain[sp.start:sp.end].strip(" │├└─●")]
        out.append((line.plain, styled))
    return out


def test_tree_step_shows_in_the_panel_with_the_accepted_path():
    """The last scripted tree step (8 nodes: " own" accepted below " its", its children refused,
    the target's correction ".") as an indented tree: the path in the accepted colour, the
    other branches dimmed."""

    async def go():
        app, src = fake_app(script=TREE_SCRIPT, settings=tree_settings())
        async with app.run_test(size=SIZE) as pilot:
            await ready(pilot, app)
            panel = app.query_one(TreePanel)
            assert panel.display and panel.note == "No tree yet: each step drafts a 3x2 tree of up to 8 nodes."
            assert "No tree yet" in screen_text(app)
            await ask(pilot, app, "What is tree speculation?")
            await turn_done(pilot, app)
            sent = src.requests[-1][1]
            assert str(sent.tree) == "3x2" and sent.tree.nodes == 8 and sent.turn_k == 3
            assert panel.step is app.stats.steps[-1] and panel.number == len(TREE_SCRIPT) == 10
            assert panel.root == " its"  # the token the tree grew from: the step before ended on it

            accepted = status_style(Status.ACCEPTED)
            corrected = status_style(Status.CORRECTED)
            lines = tree_lines(panel)
            assert [plain for plain, _ in lines] == [
                "Last step's tree (step 10)",
                "8 nodes, 1 accepted",
                "● ·its",
                "├─ ·choosing",
                "│  ├─ ·or",
                "│  │  ├─ ·and",
                "│  │  └─ ,",
                "│  └─ .",
                "└─ ·own",
                "   ├─ ·words",
                "   ├─ ·choice",
                "   └─ . ◂ target (corrected)",
            ]
            styles = {plain.strip(" │├└─"): styled for plain, styled in lines[3:]}
            assert styles["·own"] == [("·own", accepted)]
            for dimmed in ["·choosing", "·or", "·and", ",", ".", "·words", "·choice"]:
                assert styles[dimmed] == [(dimmed, "dim")], dimmed
            assert styles[". ◂ target (corrected)"] == [(".", corrected), (" ◂ target (corrected)", "dim")]
            # The drafter's favourite below " own" (" words", struck through in the text) is dimmed.
            assert ("words", Status.REJECTED) in [(p.text.strip(), p.status) for p in panel.step.pieces]

            screen = screen_text(app)
            for needle in ["Last step's tree (step 10)", "└─ ·own", "   └─ . ◂ target (corrected)", "^g tree",
                           "ngram:3 tree=3x2 · T=0", "tree           3x2 (8 nodes)", "nodes/step     8",
                           "Accepted by tree depth", "nodes kept     29%"]:
                assert needle in screen, needle
            assert "fake-target float32 + ngram:3 tree=3x2" in app.sub_title
            # The panel draws in the text's own colours: accepted (green) and corrected (orange).
            svg = app.export_screenshot()
            assert accepted.color.name in svg and corrected.color.name in svg

            # By depth, from the script: depth 1 kept in 9 of 10 steps, depth 3 in 6.
            assert app.stats.position_rates() == [(1, 0.9), (2, 0.8), (3, 0.6)]
            assert app.stats.length_histogram() == [(0, 1), (1, 1), (2, 2), (3, 6)]

    run(go())


def test_tree_panel_follows_the_steps_and_the_key_toggles_it():
    async def go():
        app, _ = fake_app(script=TREE_SCRIPT * 3, settings=tree_settings(), delay=0.1)
        async with app.run_test(size=SIZE) as pilot:
            await ready(pilot, app)
            panel = app.query_one(TreePanel)
            await ask(pilot, app, "hi")
            await wait_for(pilot, lambda: panel.step is not None and len(app.stats.steps) >= 2)
            # Mid-turn: the latest step drawn, never one ahead of the statistics.
            assert panel.step is app.stats.steps[panel.number - 1]
            assert panel.number >= 1
            first = tree_lines(panel) if panel.number == 1 else None
            if first is not None:  # the reply's first step grew from the prompt, nothing accepted
                assert first[2][0] == "● (prompt)" and "Tree ◂ target (corrected)" in first[-1][0]

            await pilot.press("ctrl+g")  # hide
            assert not app.show_tree and not panel.display
            seen = panel.number
            await wait_for(pilot, lambda: panel.number > seen or app.running is None)
            assert panel.number > seen  # hidden, it still keeps the latest step (drawn when shown)
            assert "Last step's tree" not in screen_text(app)
            await turn_done(pilot, app)
            await pilot.press("ctrl+g")  # show again: the last step of the turn
            await pilot.pause()
            assert panel.display and panel.number == 3 * len(TREE_SCRIPT)
            assert "Last step's tree (step 30)" in screen_text(app)

            # ^k / ^j change the tree's depth (same branching and cap); auto K does not apply.
            await pilot.press("ctrl+k")
            assert (str(app.settings.tree), app.settings.tree.max_nodes) == ("4x2", 8)
            await pilot.press("ctrl+j", "ctrl+j", "ctrl+j", "ctrl+j")
            assert str(app.settings.tree) == "1x2"
            await pilot.press("ctrl+o")
            assert app.settings.k != "auto" and str(app.settings.tree) == "1x2"

            await pilot.press("ctrl+n")  # a new chat forgets the last tree
            await pilot.pause()
            assert panel.step is None and "No tree yet" in screen_text(app)

    run(go())


def test_render_tree_from_the_prompt_to_the_end_of_the_reply_light_theme():
    """A first step (grown from the prompt) where the target refused every node, and a last one
    cut by a stop token (no target token: an end mark); white space shown, long tokens cut."""
    from mlxspec.core.events import Tree
    from mlxspec.tui.chat.widgets import render_tree

    tree = Tree((1, 2, 3), (-1, -1, 0), ())
    pieces = (Piece(" a", Status.REJECTED), Piece(" b", Status.REJECTED), Piece("Hi\n", Status.CORRECTED))
    step = StepData(pieces, Step([], 3, 0, 1.0, 1.0, room=2, tree=tree), 0.0, (" a", "\tlong" * 5, " b"))
    text = render_tree(step, None, 1, dark=False)
    assert text.plain.splitlines() == ["Last step's tree (step 1)", "3 nodes, 0 accepted", "● (prompt)",
                                       "├─ ·a", "│  └─ ·b", "├─ ⇥long⇥long⇥long⇥l…", "└─ Hi↵ ◂ target (corrected)"]
    assert ("Hi↵", status_style(Status.CORRECTED, dark=False)) in [
        (text.plain[sp.start:sp.end], sp.style) for sp in text.spans]

    ended = StepData((Piece(" a", Status.ACCEPTED),), Step([], 3, 1, 1.0, 1.0, room=2,
                                                           tree=Tree((1, 2, 3), (-1, -1, 0), (0,))), 0.0, (" a", " c", " b"))
    lines = render_tree(ended, "x", 7).plain.splitlines()
    assert lines[2:] == ["● x", "├─ ·a", "│  ├─ ·b", "│  └─ ∎ ◂ the reply ends", "└─ ·c"]


def test_uncapped_tree_depth_key_refuses_a_tree_too_wide():
    async def go():
        app, _ = fake_app(script=TREE_SCRIPT, settings=tree_settings("5x2", None))
        async with app.run_test(size=SIZE) as pilot:
            await ready(pilot, app)
            await pilot.press("ctrl+k")  # 6x2 would be 126 nodes, more than a verify pass takes
            assert str(app.settings.tree) == "5x2" and app.settings.tree.nodes == 62
            await pilot.press("ctrl+j")
            assert str(app.settings.tree) == "4x2" and app.settings.tree.nodes == 30

    run(go())


def test_chain_run_shows_no_tree_panel():
    async def go():
        app, _ = fake_app()
        async with app.run_test(size=SIZE) as pilot:
            await ready(pilot, app)
            panel = app.query_one(TreePanel)
            assert not panel.display
            await ask(pilot, app, "hi")
            await turn_done(pilot, app)
            assert panel.step is None and "Last step's tree" not in screen_text(app)
            assert "K              4" in screen_text(app) and "Accepted by draft position" in screen_text(app)
            await pilot.press("ctrl+g")  # trees on for the next turn: the panel says what will come
            await pilot.pause()
            assert panel.display and panel.step is None
            assert panel.note == "No tree yet: each step drafts a 3x2 tree of up to 8 nodes." and \
                "No tree yet" in screen_text(app)

    run(go())


def test_model_source_passes_the_tree_to_the_engine(monkeypatch):
    """``ModelSource.events`` hands the engine the shape, with its depth as K (no auto-K
    policy); a chain turn gets none."""
    from types import SimpleNamespace

    from mlxspec import session as session_module
    from mlxspec.session import Session

    calls = []

    def fake_generate(*args, tree=None, **kw):
        calls.append((args[7], args[8], tree))
        yield from ()

    monkeypatch.setattr(session_module, "generate", fake_generate)
    monkeypatch.setattr(session_module, "encode_prompt", lambda tok, messages, raw=False: [1, 2, 3])
    monkeypatch.setattr(session_module, "stop_token_ids", lambda tok: {0})
    monkeypatch.setattr("mlxspec.tui.chat.source._settle", lambda: None)
    lm = SimpleNamespace(name="fake", tokenizer=None, model=None, context_length=64)
    src = ModelSource(loaded=lm)
    src.session = Session(lm, log=None)
    drafter = src.session.drafter_for("ngram:3")
    settings = tree_settings()
    list(src.events([{"role": "user", "content": "hi"}], settings))
    list(src.events([], replace(settings, tree=None, k=5)))
    list(src.events([], replace(settings, speculate=False)))
    assert calls == [(drafter, 3, settings.tree), (drafter, 5, None), (None, 4, None)]


def test_run_chat_takes_a_tree_and_refuses_it_without_a_drafter(monkeypatch):
    from mlxspec.core.tree import parse_tree
    from mlxspec.errors import MlxspecError
    from mlxspec.tui.chat import app as chat_app

    with pytest.raises(MlxspecError, match="--tree needs a drafter"):
        chat_app.run_chat(draft="none", tree=parse_tree("3x2"))
    made = []
    monkeypatch.setattr(chat_app.ChatApp, "run", lambda self: made.append(self))
    monkeypatch.setattr(chat_app.ChatApp, "wait_for_worker_exit", lambda self: None)
    chat_app.run_chat(draft="ngram:3", tree=parse_tree("3x2", 8))
    (app,) = made
    assert str(app.settings.tree) == "3x2" and app.show_tree and not app.source.auto_k
    assert app.settings.label == "ngram:3 tree=3x2 · " + CHAT_DEFAULT_LABEL


@pytest.mark.parametrize("args, message", [
    (["--tree", "3x2", "--draft", "none"], "--tree needs a drafter, but --draft is none"),
    (["--tree", "3y2"], r"bad --tree '3y2': expected DxB"),
    (["--tree", "3x2", "-k", "3"], "give --k or --tree, not both"),
    (["--tree-nodes", "8"], "--tree-nodes caps a --tree"),
    (["--tree", "7x2"], "more than 64 nodes"),
    (["--tree", "3x2", "--tree-nodes", "99"], r"--tree-nodes must be in 1\.\.64"),
])
def test_chat_cli_refuses_bad_tree_options_in_one_line(monkeypatch, args, message):
    from typer.testing import CliRunner

    import mlxspec.tui.chat.app
    from mlxspec.cli import app

    monkeypatch.setattr(mlxspec.tui.chat.app, "run_chat", lambda *a, **kw: pytest.fail("the UI started"))
    one_line_error(CliRunner().invoke(app, ["chat", *args]), message)


def test_chat_cli_passes_the_tree(monkeypatch):
    from typer.testing import CliRunner

    import mlxspec.tui.chat.app
    from mlxspec.cli import app

    calls = []
    monkeypatch.setattr(mlxspec.tui.chat.app, "run_chat", lambda *a, **kw: calls.append((a, kw)))
    r = CliRunner().invoke(app, ["chat", "-d", "ngram:3", "--tree", "3x2", "--tree-nodes", "8"])
    assert r.exit_code == 0, r.output
    ((args, kw),) = calls
    assert args[1:3] == ("ngram:3", "auto") and (str(kw["tree"]), kw["tree"].nodes) == ("3x2", 8)


def test_python_m_tui_takes_the_tree_options(monkeypatch, capsys):
    import mlxspec.tui.__main__ as entry

    calls = []
    monkeypatch.setattr(entry, "run_chat", lambda *a, **kw: calls.append((a, kw)))
    assert entry.main(["-d", "ngram:2", "--tree", "2x3"]) == 0
    assert calls[0][0][1:3] == ("ngram:2", "auto") and str(calls[0][1]["tree"]) == "2x3"
    shown = []
    monkeypatch.setattr(entry.ChatApp, "run", lambda self: shown.append(self))
    assert entry.main(["--demo", "--tree", "3x2", "--tree-nodes", "8"]) == 0  # the demo scripts tree steps
    assert shown[0].show_tree and shown[0].source.script is TREE_SCRIPT and str(shown[0].settings.tree) == "3x2"
    assert entry.main(["--tree", "3y2"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("error: bad --tree '3y2': expected DxB, depth D and branching B (e.g. 3x2)")


# ----------------------------------------------------------------------------- real model
class Recording:
    """Wraps a source and keeps every engine event it produced."""

    def __init__(self, inner):
        self.inner, self.events_seen = inner, []

    def load(self):
        return self.inner.load()

    def decoder(self):
        return self.inner.decoder()

    def events(self, messages, settings, keep=True):
        for ev in self.inner.events(messages, settings, keep):
            self.events_seen.append(ev)
            yield ev


@pytest.mark.model
def test_chat_turn_on_the_real_model(lm):
    from mlxspec.core.engine import generate
    from mlxspec.core.sampling import SamplingParams
    from mlxspec.targets.tokenizer import encode_prompt

    prompt = "Repeat exactly: the cat sat on the mat, the cat sat on the mat."
    settings = Settings(draft="ngram:3", k=4, max_tokens=12)

    async def go():
        src = Recording(ModelSource(loaded=lm, baseline_tokens=4))
        app = ChatApp(src, settings)
        async with app.run_test(size=SIZE) as pilot:
            await ready(pilot, app)
            assert app.info.baseline_ms > 0 and app.baseline.source == STARTUP_SOURCE
            assert app.info.target in app.sub_title and app.info.backend in app.sub_title
            await ask(pilot, app, prompt)
            await turn_done(pilot, app)
            answer = app.query_one(Answer)
            turn_steps, kept = len(src.events_seen), [list(e.tokens) for e in src.inner.kept.entries]
            await pilot.press("ctrl+f")  # the question again, target-only: the baseline, the cache untouched
            await turn_done(pilot, app)
            assert app.baseline.source == TIMED_SOURCE and [list(e.tokens) for e in src.inner.kept.entries] == kept and kept
            assert len(app.query(Answer)) == 1 and len(src.events_seen) > turn_steps
            src.events_seen[turn_steps:] = []
            return app, src, answer, spans(answer)

    app, src, answer, shown = run(go())
    app.wait_for_worker_exit()  # MLX ran on that thread: let it finish before the process may end
    steps = [e for e in src.events_seen if isinstance(e, Step)]
    tokens = [t for s in steps for t in s.tokens]
    assert len(app.stats.steps) == len(steps)  # one message per step
    assert [p.status for p in answer.pieces] == [t.status for t in tokens]
    tok = lm.tokenizer
    emitted = [t.id for t in tokens if t.emitted]
    assert len(emitted) == 12 or app.stats.result.stop_reason == "eos"
    assert answer.output == tok.decode(emitted)
    for piece, t in zip(answer.pieces, tokens):
        if t.status is Status.REJECTED:
            assert piece.text == tok.decode([t.id])
    assert shown == expected_spans(answer.pieces)
    assert {p.status for p in answer.pieces} & {Status.ACCEPTED, Status.CORRECTED, Status.BONUS}
    # The same tokens as the engine run headless.
    ids = encode_prompt(tok, [{"role": "user", "content": prompt}])
    from mlxspec.targets.drafts import make_drafter

    direct = [t for e in generate(lm.model, ids, SamplingParams(), 12, set(tok.eos_token_ids), lm.context_length,
                                  1, make_drafter("ngram:3", lm), 4) if isinstance(e, Step) for t in e.tokens]
    assert [(t.id, t.status) for t in direct] == [(t.id, t.status) for t in tokens]


@pytest.mark.model
def test_tree_turn_on_the_real_model(lm):
    """``--tree 3x2 --tree-nodes 8`` in chat: every step's tree reaches the engine's events, the
    panel shows the last one with its nodes decoded by the tokenizer, and the tokens are the
    headless engine's."""
    from mlxspec.core.engine import generate
    from mlxspec.core.sampling import SamplingParams
    from mlxspec.targets.drafts import make_drafter
    from mlxspec.targets.tokenizer import encode_prompt

    prompt = "Repeat exactly: the cat sat on the mat, the cat sat on the mat."
    settings = replace(tree_settings("3x2", 8), max_tokens=12)

    async def go():
        src = Recording(ModelSource(loaded=lm, baseline_tokens=0))
        app = ChatApp(src, settings)
        async with app.run_test(size=SIZE) as pilot:
            await ready(pilot, app)
            await ask(pilot, app, prompt)
            await turn_done(pilot, app)
            return app, src, app.query_one(TreePanel), screen_text(app)

    app, src, panel, screen = run(go())
    app.wait_for_worker_exit()
    steps = [e for e in src.events_seen if isinstance(e, Step)]
    trees = [i for i, s in enumerate(steps) if s.tree is not None]  # none where ngram finds nothing
    assert trees and all(len(steps[i].tree.tokens) <= 8 for i in trees)
    assert panel.step.step is steps[trees[-1]] and panel.number == trees[-1] + 1
    tok = lm.tokenizer
    assert panel.step.nodes == tuple(tok.decode([t]) for t in steps[trees[-1]].tree.tokens)
    assert "Last step's tree" in screen and "tree=3x2" in app.sub_title
    ids = encode_prompt(tok, [{"role": "user", "content": prompt}])
    direct = [t for e in generate(lm.model, ids, SamplingParams(), 12, set(tok.eos_token_ids), lm.context_length,
                                  1, make_drafter("ngram:3", lm), 3, tree=settings.tree)
              if isinstance(e, Step) for t in e.tokens]
    assert [(t.id, t.status) for t in direct] == [(t.id, t.status) for s in steps for t in s.tokens]


@pytest.mark.model
def test_keys_on_the_real_model_and_stop_keeps_partial_answer(lm):
    """K and speculation keys change the next real turn; keys are handled while a step runs (each
    press's latency is recorded; how long it is depends on the machine's load, so no test bounds
    it); Esc stops mid-generation and keeps what was generated."""

    async def go():
        # Paced at 20 ms a step: unpaced, a quiet machine finished the story (EOS) before the five
        # presses were handled, and a loaded one once did with a 200-token limit.
        source = ModelSource(loaded=lm, baseline_tokens=0)
        unpaced = source.events

        def paced(*args, **kwargs):
            for event in unpaced(*args, **kwargs):
                time.sleep(0.02)
                yield event

        source.events = paced
        app = ChatApp(source, Settings(draft="ngram:3", k=4, max_tokens=400))
        latencies = []
        original = app.action_change_k

        def timed_change_k(delta: int) -> None:
            latencies.append(time.perf_counter() - pressed)
            original(delta)

        app.action_change_k = timed_change_k
        async with app.run_test(size=SIZE) as pilot:
            await ready(pilot, app)
            await ask(pilot, app, "Write a long story about a dragon who learns to bake bread.")
            await wait_for(pilot, lambda: app.stats is not None and len(app.stats.steps) >= 2, 60)
            for key in ("ctrl+k", "ctrl+k", "ctrl+j", "ctrl+k", "ctrl+k"):  # while a step runs in the worker
                pressed = time.perf_counter()
                await pilot.press(key)
                await pilot.pause(0.05)
            assert app.settings.k == 7 and app.running is not None
            pressed_stop = time.perf_counter()
            await pilot.press("escape")
            await turn_done(pilot, app, 30)
            stop_s = time.perf_counter() - pressed_stop
            answer = app.query_one(Answer)
            assert app.stats.result.stop_reason == "stopped"
            assert 0 < app.stats.tokens < 400 and answer.output and answer.text.plain == answer.output
            assert app.history[-1] == {"role": "assistant", "content": answer.output}

            # Speculation off: the next turn is target-only decoding (plain tokens, k=0 steps).
            await pilot.press("ctrl+b")
            app.settings = replace(app.settings, max_tokens=6)
            await ask(pilot, app, "And a title for it?")
            await turn_done(pilot, app)
            plain = app.query(Answer).last()
            assert plain.border_title.startswith("target only")
            assert plain.pieces and all(p.status is Status.PLAIN for p in plain.pieces)
            assert all(s.k == 0 for s in app.stats.steps)
            assert app.baseline.source == "measured: last target-only turn"
            return app, latencies, stop_s

    app, latencies, stop_s = run(go())
    app.wait_for_worker_exit()
    print(f"key latency while generating: {[round(x * 1e3, 1) for x in latencies]} ms; stop took {stop_s:.2f} s")
    # Each of the five presses reached its action, and its latency was taken: a wall-clock bound
    # here failed on loaded CI machines (one press waited 0.39 s behind the OS scheduler).
    assert len(latencies) == 5 and all(math.isfinite(x) and x > 0 for x in latencies)
    assert math.isfinite(stop_s) and stop_s > 0


@pytest.mark.model
def test_model_source_keeps_the_cache_across_turns_with_a_system_prompt(lm):
    from mlxspec.core.engine import generate
    from mlxspec.core.sampling import SamplingParams
    from mlxspec.targets.drafts import make_drafter
    from mlxspec.targets.tokenizer import encode_prompt

    src = ModelSource(loaded=lm, baseline_tokens=0)
    settings = Settings(draft="ngram:3", k=3, max_tokens=6, system="Answer in one short sentence.")
    messages = [{"role": "user", "content": "Name a colour."}]
    system = [{"role": "system", "content": settings.system}]
    tok = lm.tokenizer
    for follow_up in ("And another one?", None):
        got = [t.id for e in src.events(messages, settings) if isinstance(e, Step) for t in e.tokens if t.emitted]
        ids = encode_prompt(tok, system + messages)
        assert src.kept.entries[-1].tokens[: len(ids)] == ids  # the whole turn is in the kept cache
        fresh = [t.id for e in generate(lm.model, ids, SamplingParams(), 6, set(tok.eos_token_ids),
                                        lm.context_length, 0, make_drafter("ngram:3", lm), 3)
                 if isinstance(e, Step) for t in e.tokens if t.emitted]
        assert got == fresh
        if follow_up:
            messages += [{"role": "assistant", "content": tok.decode(got)}, {"role": "user", "content": follow_up}]


@pytest.mark.model
def test_the_drafter_key_cycles_through_the_shipped_drafts_too():
    from mlxspec.tui.chat.app import shipped_drafts

    assert shipped_drafts("default") == ("smollm2-135m-draft", "smollm2-135m-eagle", "ngram:3+smollm2-135m-eagle",
                                         "smollm2-135m-eagle3", "ngram:3+smollm2-135m-eagle3")
    assert shipped_drafts("no-such-model") == ()  # its load error is shown in the UI


def test_the_loading_line_goes_once_the_model_is_ready():
    async def go():
        app, _ = fake_app()
        async with app.run_test(size=SIZE) as pilot:
            await ready(pilot, app)
            await pilot.pause()
            text = screen_text(app)
            assert "Ready:" in text and "Loading" not in text

    run(go())


# ----------------------------------------------------------------------------- keys and the panel's truth
PLAIN_SCRIPT = [(0.5, 100.0, [(w, Status.PLAIN)]) for w in ("The", " sky", " is", " blue", ".")]


def panel_rows(app: ChatApp) -> dict[str, str]:
    """The side panel's "name   value" rows (its right-hand column of the screen)."""
    rows = {}
    for line in screen_lines(app):
        cell = line.rpartition("▏")[2].strip()
        name, _, value = cell.partition("  ")
        if value.strip():
            rows.setdefault(name.strip(), value.strip())
    return rows


def test_a_turn_that_drafted_nothing_shows_no_acceptance_or_speedup():
    """--k auto may draft nothing in a whole turn: the panel says "–" for what it cannot know
    (the server reports acceptance null), never 0% or a speedup measured on no drafts."""
    async def go():
        app, _ = fake_app(script=PLAIN_SCRIPT, settings=Settings(draft="ngram:3", k="auto"))
        async with app.run_test(size=SIZE) as pilot:
            await ready(pilot, app)
            await ask(pilot, app, "hi")
            await turn_done(pilot, app)
            rows = panel_rows(app)
            assert rows["acceptance"] == "–" and rows["accepted/step"] == "–"
            assert rows["speedup"] == "– (nothing drafted)"
            assert "%" not in rows["acceptance"] and "x" not in rows["speedup"]

    run(go())


def test_undrafted_steps_of_a_speculative_turn_become_the_baseline():
    """The start-up baseline ran without the UI drawing beside it; a speculative turn's own
    one-token passes (its undrafted steps, five or more) are target-only decoding under the
    turn's conditions, so they replace it. Fewer are not enough."""
    plain = [(1.0, 90.0, [(" more", Status.PLAIN)])]

    async def go(extra: int):
        app, _ = fake_app(script=SCRIPT + plain * extra, settings=Settings(draft="ngram:3", k="auto"))
        async with app.run_test(size=SIZE) as pilot:
            await ready(pilot, app)
            assert app.baseline.source == STARTUP_SOURCE and app.baseline.ms_per_token == 110.0
            await ask(pilot, app, "hi")
            await turn_done(pilot, app)
            return app.baseline, panel_rows(app), screen_text(app)

    baseline, rows, screen = run(go(5))  # SCRIPT's second plain step (110 ms) and five of 90 ms
    assert baseline == Baseline(90.0, "measured: this chat's K=0 steps")
    assert "vs target-only 11.1 tok/s" in screen and "(measured: this chat's K=0 steps)" in screen
    assert rows["speedup"].endswith("x")
    baseline, _, _ = run(go(3))
    assert baseline.source == STARTUP_SOURCE

    async def live():  # while the turn runs, the panel's speedup already uses its passes
        app, _ = fake_app(script=SCRIPT + plain * 20, settings=Settings(draft="ngram:3", k="auto"), delay=0.05)
        async with app.run_test(size=SIZE) as pilot:
            await ready(pilot, app)
            await ask(pilot, app, "hi")
            await wait_for(pilot, lambda: app.stats is not None and len(app.stats.steps) >= len(SCRIPT) + 6, 30)
            assert app.running is not None and app.baseline.source == STARTUP_SOURCE
            assert app.live_baseline() == Baseline(90.0, "measured: this chat's K=0 steps")
            await turn_done(pilot, app)

    run(live())


def test_ctrl_k_from_auto_steps_from_the_k_auto_was_using():
    async def go():
        app, _ = fake_app(settings=Settings(draft="ngram:3", k="auto"))
        async with app.run_test(size=SIZE) as pilot:
            await ready(pilot, app)
            await ask(pilot, app, "hi")
            await turn_done(pilot, app)
            used = round(app.stats.mean_k())
            assert used != 4  # the script's mean K, so the old jump (last fixed K + 1 = 5) would differ
            await pilot.press("ctrl+k")
            assert app.settings.k == used + 1
            await pilot.press("ctrl+o")  # back to auto, then down from what it used
            assert app.settings.k == "auto"
            await pilot.press("ctrl+j")
            assert app.settings.k == max(1, used - 1)

    run(go())


def test_ctrl_g_turns_trees_on_and_off():
    async def go():
        app, src = fake_app(script=TREE_SCRIPT, settings=Settings(draft="ngram:3", k=4))
        async with app.run_test(size=SIZE) as pilot:
            await ready(pilot, app)
            assert app.settings.tree is None and not app.show_tree
            await pilot.press("ctrl+g")  # on: the default shape, the panel showing it
            assert (str(app.settings.tree), app.settings.tree.nodes) == ("3x2", 8) and app.show_tree
            assert "tree=3x2" in app.sub_title and "3x2 (8 nodes)" in panel_rows(app)["tree"]
            await pilot.press("ctrl+k")  # a deeper tree, remembered when trees go off and on again
            await ask(pilot, app, "hi")
            await turn_done(pilot, app)
            assert str(src.requests[-1][1].tree) == "4x2"
            await pilot.press("ctrl+g")
            assert app.settings.tree is None and not app.show_tree and panel_rows(app)["K"] == "4"
            await pilot.press("ctrl+g")
            assert str(app.settings.tree) == "4x2" and app.show_tree
            await pilot.press("ctrl+g", "ctrl+b")  # speculation off: no drafter to grow a tree
            await pilot.press("ctrl+g")
            assert app.settings.tree is None and not app.show_tree

    run(go())


def test_ctrl_f_times_the_last_question_target_only_as_the_speedups_baseline():
    """^f decodes the last question again with speculation off, the same settings and seed,
    shown nowhere and leaving the conversation's cache as the turn left it; its speed becomes
    the baseline, and the transcript says what the turn ran against it."""

    async def go():
        app, src = fake_app(settings=Settings(draft="ngram:3", k=3).with_temp(1.0))
        async with app.run_test(size=SIZE) as pilot:
            await ready(pilot, app)
            await pilot.press("ctrl+f")  # nothing asked yet
            assert app.running is None and len(src.requests) == 0
            await ask(pilot, app, "hi")
            await turn_done(pilot, app)
            answers = len(app.query(Answer))
            await pilot.press("ctrl+f")
            await turn_done(pilot, app)
            notes = [str(n.render()) for n in app.query(Note)]
            return app, src, (answers, len(app.query(Answer))), screen_text(app), notes

    app, src, (before, after), screen, notes = run(go())
    (asked, turn), (again, timed) = src.requests
    assert again == asked and src.kept == [True, False]
    assert turn.speculate and not timed.speculate and timed.drafter == "none"
    assert replace(timed, speculate=True) == turn  # the same sampling, seed and limits
    assert before == after == 1 and len(app.turns) == 1 and app.history[-1]["role"] == "assistant"
    assert app.baseline.source == TIMED_SOURCE and app.baseline.ms_per_token > 0
    tps = 1000.0 / app.baseline.ms_per_token
    assert notes[-1].endswith(f"the same settings and seed: {tps:.1f} tok/s; the turn ran 1.00x it.")
    assert f"({TIMED_SOURCE})" in screen
