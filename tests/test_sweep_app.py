"""``mlxspec sweep --tui`` (tui/sweep/: app, chart, sources): the chart on scripted numbers, held run by run so
the test sees it fill in; quitting mid-sweep; errors; then a tiny real sweep (marked ``model``)."""

import threading

import pytest
from pilot import run, wait_for

import mlxspec  # noqa: F401  (fast BLAS before mlx)
from mlxspec.errors import MlxspecError
from mlxspec.measure.sweep import SweepOptions
from mlxspec.tui.sweep.app import SweepApp, SweepChart
from mlxspec.tui.sweep.chart import Series, chart_text
from mlxspec.tui.sweep.sources import demo_runner, sweep_runner

SIZE = (150, 50)


def chart(app: SweepApp) -> list[str]:
    return app.query_one(SweepChart).render().plain.splitlines()


def row(app: SweepApp, name: str) -> str:
    return next(line for line in chart(app) if line.startswith(name + " ") or line.startswith(name + "\t"))


class Gate:
    """Holds the scripted sweep before each timed run until the test lets one through. Waits
    time out, so a failing test cannot leave the worker thread blocked forever."""

    def __init__(self) -> None:
        self.sem = threading.Semaphore(0)
        self.waiting = 0

    def __call__(self) -> None:
        self.waiting += 1
        self.sem.acquire(timeout=30)
        self.waiting -= 1

    def release(self, n: int = 1) -> None:
        for _ in range(n):
            self.sem.release()


def test_chart_text_bars_baseline_and_optimum():
    series = {0: Series(0), 1: Series(1), 2: Series(2)}
    series[0].add({"tps": 10.0, "accepted": [0, 0], "drafted": [0, 0], "done": 1, "of": 2})
    series[1].add({"tps": 15.0, "accepted": [1, 0, 1, 1], "drafted": [1, 1, 1, 1], "done": 1, "of": 2})
    lines = chart_text([1, 2, 3], series, 120).plain.splitlines()
    by = {line.split()[0]: line for line in lines[2:]}
    assert "10.0 tok/s" in by["target"]
    assert "15.0 tok/s 1.50x 1/2" in by["K=1"] and "75%" in by["K=1"] and "0.75/step" in by["K=1"]
    assert "waiting" in by["K=2"] and "waiting" in by["K=3"]  # K=2 has a Series but no run yet
    # the K=1 bar is the longest; the target-only line runs through it at 10/15 of its length
    bar_1 = by["K=1"][10:]
    assert bar_1.index("│") < bar_1.rindex("█")
    assert "★" not in "".join(lines)  # no optimum before the result
    assert not any(line.startswith("auto") for line in lines)  # no auto row unless asked or measured


def test_chart_text_auto_row_waits_then_shows_the_mean_k_it_chose():
    series = {0: Series(0)}
    series[0].add({"tps": 10.0, "accepted": [0, 0], "drafted": [0, 0], "done": 1, "of": 2})
    lines = chart_text([1], series, 140, auto=True).plain.splitlines()
    assert "waiting" in next(line for line in lines if line.startswith("auto "))
    series[None] = Series(None)
    # K chosen per step 0, 2, 3, 3: mean 2; 4 drafts kept of 8 allowed
    series[None].add({"tps": 12.0, "accepted": [0, 1, 3, 0], "drafted": [0, 2, 3, 3], "rooms": [0, 2, 3, 3],
                      "done": 1, "of": 2})
    assert series[None].mean_k == 2.0 and series[None].acceptance == 0.5
    lines = chart_text([1], series, 140).plain.splitlines()  # shown once measured, even unasked
    auto = next(line for line in lines if line.startswith("auto "))
    assert "12.0 tok/s 1.20x 1/2" in auto and "50%" in auto and "1.00/step" in auto and auto.endswith("K 2.0")
    assert "auto: K chosen per step" in lines[1]


def test_chart_fills_in_run_by_run_and_marks_the_optimum():
    gate = Gate()
    ks = [1, 2]

    async def go():
        app = SweepApp(demo_runner(ks, prompts=2, before_run=gate), ks, "scripted")
        async with app.run_test(size=SIZE) as pilot:
            await wait_for(pilot, lambda: gate.waiting == 1)  # warm-up and verify ticks done
            await pilot.pause()
            assert "waiting" in row(app, "target") and "waiting" in row(app, "K=1") and "waiting" in row(app, "auto")
            assert app.query_one("#phase").render().plain.startswith("verify cost")

            gate.release()  # prompt 0 runs target-only first
            await wait_for(pilot, lambda: 0 in app.series)
            await pilot.pause()
            assert "tok/s" in row(app, "target") and "waiting" in row(app, "K=1") and "waiting" in row(app, "K=2")

            gate.release()  # then K=1: a partial median, 1 of 2 runs
            await wait_for(pilot, lambda: 1 in app.series)
            await pilot.pause()
            assert "1/2" in row(app, "K=1") and "waiting" in row(app, "K=2")

            gate.release(6)  # the rest of prompt 0 (K=2, auto), then prompt 1's four runs
            await wait_for(pilot, lambda: app.finished)
            await pilot.pause()
            result = app.result
            best = max(result.rows, key=lambda r: r.tps).k
            assert result.optimum_measured.k == best
            assert "★" in row(app, f"K={best}") and "1/2" not in "\n".join(chart(app))
            assert f"{result.auto.tps:.1f} tok/s" in row(app, "auto") and f"K {result.auto.mean_k:.1f}" in row(app, "auto")
            assert set(app.series) == {0, 1, 2, None}
            text = "\n".join(chart(app))
            assert result.verdict[0].text in text  # the explanation under the chart
            assert app.query_one("#phase").render().plain.startswith(f"done: best K = {best}")
            bar = app.query_one("#bar")
            assert bar.progress == bar.total
            svg = app.export_screenshot().replace("&#160;", " ")
            assert "K sweep" in svg and "verification" in svg  # the table beneath
            await pilot.press("q")
            await wait_for(pilot, lambda: not app.is_running)

    run(go())


def test_demo_result_is_a_sweep_summary_coloured_by_kind():
    """The scripted demo goes through the sweep's own summary: six prompts clearly faster
    than target-only pay; the chart colours each verdict line by its kind, not its words."""
    from mlxspec.measure.verdict import Kind, style

    result = demo_runner([1, 2, 4], prompts=6)(lambda *a: None, lambda run: None)
    assert result.verdict[0].kind is Kind.FASTER and result.pays
    assert result.optimum_measured.interval.lo > 1.0
    text = chart_text([1, 2, 4], {}, 140, result)
    spans = {text.plain[s.start:s.end].strip(): str(s.style) for s in text.spans}
    for v in result.verdict:
        if style(v.kind):
            assert spans.get(v.text) == style(v.kind)
    few = demo_runner([1, 2], prompts=2)(lambda *a: None, lambda run: None)
    assert few.verdict[0].kind is Kind.SAME and "too few" in few.verdict[0].text


def test_demo_auto_row_is_marked_against_the_best_k():
    """The demo's auto row: its verdict line under the headline, its mark in the chart; without
    auto, neither."""
    from mlxspec.measure.verdict import Kind

    result = demo_runner([1, 2, 4], prompts=6)(lambda *a: None, lambda run: None)
    assert result.auto is not None and result.auto_vs_best.kind is Kind.SAME and result.auto.indistinguishable
    line = next(v for v in result.verdict if v.text.startswith("auto "))
    assert line.kind is Kind.SAME and f"tied with the best fixed K = {result.optimum_measured.k}" in line.text
    lines = chart_text([1, 2, 4], {}, 140, result).plain.splitlines()
    assert any(x.startswith("auto ≈") and x.rstrip().endswith(f"K {result.auto.mean_k:.1f}") for x in lines)
    plain = demo_runner([1, 2, 4], prompts=6, auto=False)(lambda *a: None, lambda run: None)
    assert plain.auto is None and not any(v.text.startswith("auto ") for v in plain.verdict)
    assert not any(x.startswith("auto") for x in chart_text([1, 2, 4], {}, 140, plain).plain.splitlines())


def test_quit_mid_sweep_stops_after_the_current_run():
    gate = Gate()

    async def go():
        app = SweepApp(demo_runner([1, 2], prompts=2, before_run=gate), [1, 2], "scripted")
        async with app.run_test(size=SIZE) as pilot:
            await wait_for(pilot, lambda: gate.waiting == 1)
            await pilot.press("q")
            assert app.stopping and app.is_running and "stopping" in app.sub_title
            gate.release()  # the run in progress ends; the worker leaves at its next callback
            await wait_for(pilot, lambda: not app.is_running)
        return app

    app = run(go())
    assert app.finished and app.result is None and app.error is None


def test_a_failing_sweep_is_shown_and_the_app_stays():
    def runner(progress, on_run):
        progress(1, 10, "loading")
        raise MlxspecError("a sweep needs a drafter (got 'none')")

    async def go():
        app = SweepApp(runner, [1], "failing")
        async with app.run_test(size=SIZE) as pilot:
            await wait_for(pilot, lambda: app.finished)
            await pilot.pause()
            assert "error: a sweep needs a drafter" in app.query_one("#table").render().plain
            assert app.is_running
            await pilot.press("q")
            await wait_for(pilot, lambda: not app.is_running)
        return app

    assert run(go()).error == "a sweep needs a drafter (got 'none')"


@pytest.mark.model
def test_tiny_real_sweep_in_the_app(lm, tmp_path):
    """The path ``mlxspec sweep --tui`` takes (``sweep_runner`` -> ``run_sweep`` in the worker),
    on K 1,2, one prompt, 8 tokens."""
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("Repeat after me: the quick brown fox jumps over the lazy dog.\n")
    ks = [1, 2]

    async def go():
        options = SweepOptions(ks, model=lm, draft="ngram:3", prompts_file=prompts, max_tokens=8, warmup=0,
                               repeats=1, verify_reps=2)
        app = SweepApp(sweep_runner(options), ks, "tiny")
        async with app.run_test(size=SIZE) as pilot:
            await wait_for(pilot, lambda: app.finished, timeout=120)
            await pilot.pause()
            assert app.error is None
            result = app.result
            assert set(app.series) == {0, 1, 2, None} and all(s.done == s.of == 1 for s in app.series.values())
            assert result.auto is not None and f"{result.auto.tps:.1f} tok/s" in row(app, "auto")
            best = max(result.rows, key=lambda r: r.tps).k
            assert result.optimum_measured.k == best and "★" in row(app, f"K={best}")
            assert f"{result.baseline.tps:.1f} tok/s" in row(app, "target")
            await pilot.press("q")
            await wait_for(pilot, lambda: not app.is_running)
        app.wait_for_worker_exit()

    run(go())
