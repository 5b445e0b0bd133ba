"""Tests for mlxspec.measure.sweep: K parsing, the cost model, the verdict logic (noise included),
and a tiny real sweep."""

from __future__ import annotations

import csv
import io
import json
import math
from dataclasses import asdict

import pytest
from rich.console import Console

import mlxspec  # noqa: F401  (must come before mlx: loads the fast BLAS)
from mlxspec.core.tree import parse_tree_list
from mlxspec.core.events import Done, Status, Step, Token
from mlxspec.errors import MlxspecError
from mlxspec.measure import runs, sweep
from mlxspec.core.runs import Run
from mlxspec.measure.verdict import Comparison, Interval, Kind

# ----------------------------------------------------------------------------- parse_ks


@pytest.mark.parametrize("text, expected", [
    ("1..8", [1, 2, 3, 4, 5, 6, 7, 8]),
    ("1,2,4,8", [1, 2, 4, 8]),
    ("1..3,8", [1, 2, 3, 8]),
    (" 2 .. 4 , 6 ", [2, 3, 4, 6]),
    ("8,4,4,1", [1, 4, 8]),  # sorted, duplicates dropped
    ("3..3", [3]),
    ("5", [5]),
    ("64", [64]),
    ("1..2,2..3", [1, 2, 3]),
])
def test_parse_ks_accepts_ranges_lists_and_mixtures(text, expected):
    assert sweep.parse_ks(text) == expected


@pytest.mark.parametrize("text, message", [
    ("", "no K values"),
    ("   ", "no K values"),
    ("0", "K must be in 1..64, got 0"),
    ("-1", "K must be in 1..64, got -1"),
    ("1,-2", "got -2"),
    ("65", "K must be in 1..64, got 65"),
    ("1..65", "got 65"),
    ("0..3", "got 0"),
    ("8..1", "runs backwards (write 1..8)"),
    ("a", "bad K value 'a'"),
    ("1..", "bad K value '1..'"),
    ("..3", "bad K value '..3'"),
    ("1...3", "bad K value"),
    ("1.5", "bad K value '1.5'"),
    ("1,,2", "empty item"),
    ("1,", "empty item"),
    ("1;2", "bad K value '1;2'"),
    ("1-8", "bad K value '1-8'"),
])
def test_parse_ks_rejects_bad_input_with_a_clear_message(text, message):
    with pytest.raises(MlxspecError) as e:
        sweep.parse_ks(text)
    assert message in str(e.value)


# ----------------------------------------------------------------------------- the cost model


def test_expected_tokens_is_one_plus_sum_of_prefix_products():
    assert sweep.expected_tokens([0.8, 0.5], 2) == pytest.approx(1 + 0.8 + 0.4)
    assert sweep.expected_tokens([0.8, 0.5], 1) == pytest.approx(1.8)
    assert sweep.expected_tokens([1.0, 1.0, 1.0], 3) == pytest.approx(4.0)
    assert sweep.expected_tokens([0.0, 1.0], 2) == pytest.approx(1.0)
    assert sweep.expected_tokens([0.5, None], 2) == pytest.approx(1.5)  # never reached: never accepted
    assert sweep.expected_tokens([0.5], 3) == pytest.approx(1.5)  # missing positions likewise


def test_step_time_and_predicted_tps():
    assert sweep.step_ms(2, 1.0, 12.0) == pytest.approx(14.0)
    # E = 2.2 tokens in T = 2*1 + 12 = 14 ms
    assert sweep.predicted_tps([0.8, 0.5], 2, 1.0, 12.0) == pytest.approx(2200 / 14)
    rows = sweep.cost_model([1, 2], [[0.8], [0.8, 0.5]], [1.0, 1.0], [11.0, 12.0], target_ms=10.0)
    assert asdict(rows[0]) == pytest.approx({"k": 1, "expected_tokens": 1.8, "step_ms": 12.0, "tps": 150.0, "speedup": 1.5})
    assert rows[1].expected_tokens == pytest.approx(2.2)
    assert rows[1].step_ms == pytest.approx(14.0)
    assert rows[1].tps == pytest.approx(2200 / 14)
    assert rows[1].speedup == pytest.approx(2.2 * 10 / 14)


def test_verify_slope_flat_and_serial():
    assert sweep.verify_slope([1, 2, 4], [1.0, 1.0, 1.0]) == pytest.approx(0.0)
    assert sweep.verify_slope([1, 2, 4], [2.0, 3.0, 5.0]) == pytest.approx(1.0)  # cost = K+1 tokens
    assert sweep.verify_slope([2, 4], [1.2, 1.4]) == pytest.approx(0.1)
    assert sweep.verify_kind(0.05) == "batch-parallel"
    assert sweep.verify_kind(0.3) == "partly serial"
    assert sweep.verify_kind(0.95) == "serial"


def test_argbest_picks_the_first_maximum():
    assert sweep.argbest([1.0, 3.0, 2.0]) == 1
    assert sweep.argbest([2.0, 2.0]) == 0
    assert sweep.argbest([None, 1.0]) == 1
    assert sweep.argbest([]) is None


def test_position_acceptance_uses_the_room_the_engine_reported():
    acc_, rej, cor, bon = Status.ACCEPTED, Status.REJECTED, Status.CORRECTED, Status.BONUS
    # steps (accepted, drafted, room): (2,2,2) (0,2,2) (1,1,2: drafter came up short) (1,1,1: no room)
    events = [
        Step([Token(1, acc_), Token(2, acc_), Token(3, bon)], k=2, accepted=2, draft_ms=1, verify_ms=5, room=2),
        Step([Token(4, rej), Token(5, rej), Token(6, cor)], k=2, accepted=0, draft_ms=1, verify_ms=5, room=2),
        Step([Token(7, acc_), Token(8, bon)], k=1, accepted=1, draft_ms=1, verify_ms=5, room=2),
        Step([Token(9, acc_), Token(10, bon)], k=1, accepted=1, draft_ms=1, verify_ms=5, room=1),
        Done(prompt_tokens=5, generated_tokens=7, prefill_s=0.1, decode_s=0.3, stop_reason="length", steps=4),
    ]
    run = runs.collect_run(events)
    assert run.rooms == [2, 2, 2, 1]
    acc, cov = sweep.position_acceptance(run.accepted, run.drafted, run.rooms, 2)
    assert acc == pytest.approx([3 / 4, 1 / 2])
    assert cov == pytest.approx([1.0, 1 / 2])
    row = sweep.k_row(2, [sweep.SweepRun(2, 1, "a", 0, run, 1.2)], [12.0], 10.0, greedy=True)
    assert row.acceptance == pytest.approx([3 / 4, 1 / 2]) and row.draft_coverage == pytest.approx([1.0, 1 / 2])
    assert row.mean_accepted == pytest.approx(1.0)  # over the steps with full room: (2 + 0 + 1) / 3
    acc, cov = sweep.position_acceptance([], [], [], 2)
    assert acc == [None, None] and cov == [None, None]


# ----------------------------------------------------------------------------- verdict logic

KS = [1, 2, 3]


def flat(p):
    return [[p] * k for k in KS]


def causes(d):
    return [c.cause for c in d.causes]


def clear(*speedups):
    """Paired speedups measured with a narrow interval (six pairs, +-0.02): clearly decided."""
    return [Comparison(x, Interval(x - 0.02, x + 0.02, pairs=6), 6) for x in speedups]


def texts(d):
    return [v.text for v in d.verdict]


def test_draft_too_slow_to_pay():
    # draft 9 ms per token against a 10 ms target token; verification flat
    d = sweep.diagnose(sweep.Measured(
        KS, tps=[85.0, 70.0, 60.0], speedup=clear(0.85, 0.70, 0.60), acceptance=flat(0.7),
        draft_ms_per_token=[9.0] * 3, verify_ms=[10.5, 11.0, 11.5], target_ms=10.0, baseline_tps=100.0))
    assert not d.pays
    assert (d.optimum_measured.k, d.optimum_measured.tps, d.optimum_measured.speedup) == (1, 85.0, 0.85)
    assert d.verify_kind == "batch-parallel"
    assert causes(d) == ["draft_too_slow"]
    assert "draft costs 0.9x the target — too slow to pay" in d.causes[0].message
    assert d.verdict[0].kind is Kind.SLOWER
    assert texts(d)[0].startswith("speculation does not pay here: the best K = 1 reaches only 0.85x")
    assert any(v.kind is Kind.CAUSE and v.text.startswith("why: draft costs 0.9x the target") for v in d.verdict)


def test_serial_verification():
    # a pass over K+1 tokens costs K+1 token passes: the backend verifies one token at a time
    d = sweep.diagnose(sweep.Measured(
        KS, tps=[90.0, 80.0, 70.0], speedup=clear(0.9, 0.8, 0.7), acceptance=flat(0.8),
        draft_ms_per_token=[0.1] * 3, verify_ms=[20.0, 30.0, 40.0], target_ms=10.0))
    assert d.verify_slope == pytest.approx(1.0)
    assert d.verify_kind == "serial"
    assert causes(d) == ["serial_verify"]
    assert "verify cost grows ~linearly with K — this backend verifies serially" in d.causes[0].message
    assert "4.0x one token" in d.causes[0].message


def test_acceptance_too_low():
    d = sweep.diagnose(sweep.Measured(
        KS, tps=[97.0, 95.0, 93.0], speedup=clear(0.97, 0.95, 0.93), acceptance=flat(0.05),
        draft_ms_per_token=[0.1] * 3, verify_ms=[10.5, 11.0, 11.5], target_ms=10.0))
    assert causes(d) == ["low_acceptance"]
    msg = d.causes[0].message
    assert msg.startswith("acceptance too low: 5% of first drafts accepted, 0.05 tokens won per step at K=1")
    assert "proposed nothing" not in msg
    # a prompt-lookup drafter that finds no match proposes nothing: said so
    d = sweep.diagnose(sweep.Measured(
        KS, tps=[97.0, 95.0, 93.0], speedup=clear(0.97, 0.95, 0.93), acceptance=flat(0.05),
        draft_ms_per_token=[0.1] * 3, verify_ms=[10.5, 11.0, 11.5], target_ms=10.0,
        coverage=flat(0.25)))
    assert d.causes[0].message.endswith("the drafter proposed nothing in 75% of steps")


def test_overhead_when_the_model_predicts_a_gain_the_run_misses():
    d = sweep.diagnose(sweep.Measured(
        KS, tps=[90.0, 85.0, 80.0], speedup=clear(0.9, 0.85, 0.8), acceptance=flat(0.8),
        draft_ms_per_token=[0.1] * 3, verify_ms=[10.5, 11.0, 11.5], target_ms=10.0))
    assert causes(d) == ["overhead"]
    assert d.optimum_predicted.speedup > 1


def test_pays_names_both_optima_and_keeps_cost_causes_as_notes():
    acc = flat(0.8)
    d = sweep.diagnose(sweep.Measured(
        KS, tps=[130.0, 150.0, 140.0], speedup=clear(1.3, 1.5, 1.4), acceptance=acc,
        draft_ms_per_token=[0.1] * 3, verify_ms=[10.5, 11.0, 11.5], target_ms=10.0, baseline_tps=100.0))
    assert d.pays and causes(d) == []
    assert d.optimum_measured.k == 2
    # E(3) / T(3) = 2.952 / 11.8 ms beats K=2 (2.44 / 11.2) and K=1 (1.8 / 10.6)
    assert d.optimum_predicted.k == 3
    assert d.optimum_predicted.tps == pytest.approx(1e3 * 2.952 / 11.8)
    assert d.verdict[0].kind is Kind.FASTER
    assert texts(d)[0].startswith("best K = 2: 1.50x target-only (150.0 vs 100.0 tok/s) — speculation pays here "
                                  "(95% interval 1.48x-1.52x over 6 paired runs)")
    assert texts(d)[1].startswith("cost model (measured acceptance and costs) predicts best K = 3")
    assert "measured best K = 2" in texts(d)[1] and d.verdict[1].kind is Kind.INFO

    serial = sweep.diagnose(sweep.Measured(
        KS, tps=[130.0, 120.0, 110.0], speedup=clear(1.3, 1.2, 1.1), acceptance=flat(0.95),
        draft_ms_per_token=[0.1] * 3, verify_ms=[13.0, 16.0, 19.0], target_ms=10.0))
    # ratios 1.3, 1.6, 1.9: slope (0.3 + 1.2 + 2.7) / 14 = 0.3 extra token-times per draft
    assert serial.verify_slope == pytest.approx(0.3)
    assert serial.pays and causes(serial) == ["partly_serial_verify"]
    assert any(v.kind is Kind.NOTE and v.text.startswith("note: verify cost grows") for v in serial.verdict)


# ----------------------------------------------------------------------------- noise: paired verdicts


def _run(tps, k, tokens=40):
    """A scripted run at ``tps`` tokens/s: K drafts a step, one accepted each time."""
    steps = tokens // 2 if k else tokens
    total = tokens / tps
    return Run(list(range(tokens)), 20, 0.1 * total, 0.9 * total, 2 if k else 1, "length", [1 if k else 0] * steps,
               [k] * steps, [k] * steps, [0.2 * k] * steps, [11.0 + k] * steps)


def _run_auto(tps, tokens=42):
    """A scripted ``--k auto`` run: K chosen per step cycling 0, 1, 2, 3 (mean 1.5 over the 24
    steps of 42 tokens), one draft accepted whenever any was drafted."""
    rooms = [i % 4 for i in range(tokens)]
    acc = []
    while sum(acc) + len(acc) < tokens:
        acc.append(1 if rooms[len(acc)] else 0)
    n, total = len(acc), tokens / tps
    return Run(list(range(tokens)), 20, 0.1 * total, 0.9 * total, 1, "length", acc, rooms[:n], rooms[:n],
               [0.2 * r for r in rooms[:n]], [11.0 + r for r in rooms[:n]])


def _summary(speedups: dict[int, list[float]], auto: list[float] | None = None,
             trees: dict[str, list[float]] | None = None):
    """The sweep's summary of scripted runs: per prompt i the target runs at a prompt-dependent
    speed, K at ``speedups[K][i]`` times it (the paired ratio the verdict rests on), and auto,
    if given, at ``auto[i]`` times it."""
    ks = sorted(speedups)
    n = len(speedups[ks[0]])
    base = [10.0 * (1 + 0.3 * (i % 3)) for i in range(n)]
    runs_by = {0: [sweep.SweepRun(0, i, "c", 0, _run(base[i], 0)) for i in range(n)]}
    for k in ks:
        runs_by[k] = [sweep.SweepRun(k, i, "c", 0, _run(base[i] * sp, k), sp) for i, sp in enumerate(speedups[k])]
    if auto is not None:
        runs_by[None] = [sweep.SweepRun(None, i, "c", 0, _run_auto(base[i] * sp), sp) for i, sp in enumerate(auto)]
    for shape, sps in (trees or {}).items():
        m = sweep.tree_method(shape)
        runs_by[m] = [sweep.SweepRun(m, i, "c", 0, _run(base[i] * sp, 3), sp) for i, sp in enumerate(sps)]
    vt = {1: [10.0] * 3, **{k + 1: [11.0 + k] * 3 for k in ks}}
    settings = sweep.SweepSettings(ks, "scripted", 0.0, 1.0, ["c"], 1, None, 40, 0, 0, 1, 0, 3,
                                   auto_max_k=8 if auto is not None else None, trees=list(trees or {}))
    header = runs.RunHeader("now", runs.Machine("p", "x", 2), "cpu", None, "0", None, "m", "float32")
    return sweep.summarise(ks, runs_by, vt, 20, header, settings, None, [{"id": i} for i in range(n)])


OVERLAPPING = [0.8, 1.25, 0.9, 1.15, 1.05, 0.95]


@pytest.mark.parametrize("speedups, kind, words, pays", [
    (OVERLAPPING, Kind.SAME, "no measurable difference from target-only", False),
    ([1.4, 1.5, 1.45, 1.38, 1.52, 1.47], Kind.FASTER, "speculation pays here", True),
    ([0.7, 0.75, 0.72, 0.68, 0.74, 0.71], Kind.SLOWER, "speculation does not pay here", False),
])
def test_sweep_verdict_rests_on_the_paired_interval(speedups, kind, words, pays):
    result = _summary({1: speedups})
    head = result.verdict[0]
    assert head.kind is kind and words in head.text and result.pays is pays
    assert str(head.interval) in head.text and head.interval.pairs == 6
    assert head.interval.excludes(1.0) is (kind is not Kind.SAME)
    data = json.loads(json.dumps(result.to_json()))
    assert data["schema"] == 2 and data["verdict"][0]["kind"] == kind.value
    assert data["verdict"][0]["interval"] == data["optimum_measured"]["interval"] == data["rows"][0]["interval"]
    assert data["rows"][0]["verdict"] == kind.value


def test_sweep_names_the_ks_indistinguishable_from_the_best():
    # K=2 and K=3 within noise of each other, K=1 clearly slower than both
    result = _summary({1: [1.10, 1.12, 1.09, 1.11, 1.10, 1.12],
                       2: [1.50, 1.42, 1.55, 1.47, 1.38, 1.52],
                       3: [1.45, 1.50, 1.48, 1.52, 1.44, 1.49]})
    best = result.optimum_measured
    assert best.k in (2, 3) and best.indistinguishable == [5 - best.k]
    note = next(v for v in result.verdict if "indistinguishable" in v.text)
    assert note.kind is Kind.NOTE and f"K={5 - best.k} is indistinguishable from the best K = {best.k}" in note.text
    assert [(r.k, r.is_optimum, r.indistinguishable) for r in result.rows] == [
        (1, False, False), (2, best.k == 2, best.k == 3), (3, best.k == 3, best.k == 2)]
    out = io.StringIO()
    sweep.print_sweep(result, Console(file=out, width=250))
    assert f"{5 - best.k} ≈" in out.getvalue() and f"{best.k} ★" in out.getvalue()


def test_sweep_with_too_few_prompts_cannot_tell_ks_apart():
    result = _summary({1: [1.2, 1.3], 2: [1.6, 1.7]})
    assert result.verdict[0].kind is Kind.SAME and "too few to tell" in result.verdict[0].text
    assert result.optimum_measured.k == 2 and result.optimum_measured.indistinguishable == [1]


# ----------------------------------------------------------------------------- the auto row

FIXED = {1: [1.10, 1.12, 1.09, 1.11, 1.10, 1.12], 2: [1.50, 1.48, 1.52, 1.49, 1.51, 1.50]}


def _auto_line(result):
    return next(v for v in result.verdict if v.text.startswith("auto "))


@pytest.mark.parametrize("auto, kind, words, marks", [
    # paired with K=2 (the best fixed K): ratios 0.93-1.07 -> the interval holds 1.0
    ([1.40, 1.58, 1.45, 1.55, 1.48, 1.53], Kind.SAME, "tied with the best fixed K = 2", (False, True)),
    ([1.80, 1.79, 1.83, 1.78, 1.82, 1.81], Kind.FASTER, "faster than the best fixed K = 2", (True, False)),
    ([1.20, 1.18, 1.22, 1.19, 1.21, 1.20], Kind.SLOWER, "a fixed --k 2 is faster here", (False, False)),
])
def test_sweep_auto_row_is_judged_against_the_best_fixed_k(auto, kind, words, marks):
    result = _summary(FIXED, auto)
    fixed = _summary(FIXED)
    a = result.auto
    assert a.k is None and a.label == "auto" and a.runs == 6
    assert a.mean_k == pytest.approx(1.5) and a.mean_drafted == pytest.approx(1.5)
    assert a.comparison.ratio == pytest.approx(sorted(auto)[2] / 2 + sorted(auto)[3] / 2)
    assert a.comparison.interval.pairs == 6 and a.prediction is None and a.verify_ms is None
    assert a.acceptance[0] == pytest.approx(1.0) and len(a.acceptance) == 3  # up to the largest K it chose
    assert (a.is_optimum, a.indistinguishable) == marks
    # the fixed Ks, their optimum, the cost model and the headline are what they are without auto
    assert [r.k for r in result.rows] == [1, 2] and result.rows == fixed.rows
    assert result.optimum_measured == fixed.optimum_measured and result.optimum_measured.k == 2
    assert result.optimum_predicted == fixed.optimum_predicted and result.pays is fixed.pays
    assert result.verdict[0] == fixed.verdict[0]
    line = _auto_line(result)
    assert result.verdict[1] == line and line.kind is kind and words in line.text
    assert result.auto_vs_best.kind is kind and line.interval == result.auto_vs_best.interval
    assert "mean 1.5" in line.text and f"{a.speedup:.2f}x target-only" in line.text
    assert [x.k for x in result.runs].count(None) == 6

    data = json.loads(json.dumps(result.to_json()))
    assert [r["k"] for r in data["rows"]] == [1, 2, None] and data["rows"][-1]["label"] == "auto"
    assert set(data["rows"][0]) == set(data["rows"][-1])  # the same keys as a fixed K's row
    assert data["rows"][-1]["predicted_tps"] is None and data["rows"][-1]["mean_k"] == pytest.approx(1.5)
    assert data["auto_vs_best"]["k"] == 2 and data["auto_vs_best"]["verdict"] == kind.value
    assert data["settings"]["auto_max_k"] == 8 and data["optimum_measured"]["k"] == 2
    plain = json.loads(json.dumps(fixed.to_json()))
    assert plain["auto_vs_best"] is None and [r["k"] for r in plain["rows"]] == [1, 2]
    assert set(data) == set(plain)

    out = io.StringIO()
    sweep.print_sweep(result, Console(file=out, width=250))
    mark = " ★" if marks[0] else " ≈" if marks[1] else " │"
    assert f"auto (1.5){mark}" in out.getvalue() and line.text[:40] in out.getvalue()


def test_sweep_auto_row_in_the_csv_and_the_plot(tmp_path):
    result = _summary(FIXED, [1.40, 1.58, 1.45, 1.55, 1.48, 1.53])
    with sweep.write_csv(result, tmp_path / "s.csv").open() as f:
        table = list(csv.DictReader(f))
    assert [r["k"] for r in table] == ["1", "2", "auto"]
    assert table[-1]["mean_k"] == "1.5" and table[-1]["predicted_tps"] == ""
    # by position up to the largest K auto chose: one draft kept a step, never a second
    assert [table[-1][f"acc_{i}"] for i in (1, 2, 3)] == ["1.0", "0.0", ""] and table[0]["acc_3"] == ""
    assert float(table[-1]["tps"]) == pytest.approx(result.auto.tps)
    pytest.importorskip("matplotlib")
    png = sweep.plot_sweep(result, tmp_path / "s.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ----------------------------------------------------------------------------- tree rows


def test_sweep_tree_rows_name_the_fastest_shape_against_the_best_k():
    trees = {"2x2": [1.60, 1.62, 1.58, 1.61, 1.63, 1.59], "auto": [1.30, 1.31, 1.29, 1.30, 1.32, 1.28]}
    result = _summary(FIXED, trees=trees)
    fixed = _summary(FIXED)
    assert result.rows == fixed.rows and result.verdict[0] == fixed.verdict[0]  # the Ks are judged alone
    assert [t.label for t in result.trees] == ["tree 2x2", "tree auto"]
    fast, slow = result.trees
    assert fast.is_optimum and not slow.is_optimum and fast.comparison.interval.pairs == 6
    line = next(v for v in result.verdict if v.text.startswith("fastest tree"))
    assert line.kind is Kind.FASTER and "fastest tree: 2x2" in line.text and "faster than the best fixed K = 2" in line.text
    assert "--tree 2x2 beats any chain here" in line.text
    data = json.loads(json.dumps(result.to_json()))
    assert [r["label"] for r in data["rows"]] == ["1", "2", "tree 2x2", "tree auto"]
    assert [(t["tree"], t["k"], t["verdict"]) for t in data["trees_vs_best"]] == [
        ("2x2", 2, Kind.FASTER.value), ("auto", 2, Kind.SLOWER.value)]
    assert data["settings"]["trees"] == ["2x2", "auto"]
    out = io.StringIO()
    sweep.print_sweep(result, Console(file=out, width=250))
    assert "tree 2x2 ★" in out.getvalue() and "tree auto" in out.getvalue()
    assert [x.k for x in result.runs].count("tree 2x2") == 6


def test_sweep_tree_slower_than_a_chain_says_so():
    result = _summary(FIXED, trees={"3x2": [1.20, 1.18, 1.22, 1.19, 1.21, 1.20]})
    line = next(v for v in result.verdict if v.text.startswith("fastest tree"))
    assert line.kind is Kind.SLOWER and "a chain (--k 2) is faster here" in line.text


@pytest.mark.parametrize("text, shapes", [
    ("2x2", ["2x2"]), ("1x1..2x2", ["1x1", "1x2", "2x1", "2x2"]), ("3x2, auto,3x2", ["3x2", "auto"]),
])
def test_tree_lists_and_ranges(text, shapes):
    assert [str(t) for t in parse_tree_list(text, 8)] == shapes


@pytest.mark.parametrize("args, message", [
    (["--tree", "2x2..1x1"], "bad --tree range"),
    (["--tree", "3y2"], "bad --tree '3y2'"),
    (["--tree-nodes", "4"], "--tree-nodes caps the --tree shapes"),
    (["--tree", "2x2", "--tui"], "the sweep UI shows Ks only"),
])
def test_sweep_bad_tree_options_are_one_line(args, message):
    from typer.testing import CliRunner

    from mlxspec.cli import app

    result = CliRunner().invoke(app, ["sweep", "--k", "1", *args])
    lines = result.output.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error:") and message in lines[0]


# ----------------------------------------------------------------------------- a tiny real sweep


@pytest.mark.model
def test_tiny_real_sweep(lm, tmp_path):
    pytest.importorskip("matplotlib")
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("Repeat after me: the quick brown fox jumps over the lazy dog.\n")
    calls = []
    options = sweep.SweepOptions([1, 2], model=lm, draft="ngram:3", prompts_file=prompts, max_tokens=8,
                                 warmup=0, repeats=1, verify_reps=2)
    result = sweep.run_sweep(options, progress=lambda i, n, label: calls.append((i, n, label)))
    record = result
    result = json.loads(json.dumps(result.to_json()))  # JSON-serialisable, and read back as a user would

    assert [r["k"] for r in result["rows"]] == [1, 2, None]  # auto last
    *fixed, auto = result["rows"]
    assert result["baseline"]["tps"] > 0 and result["verification"]["target_ms"] > 0
    assert auto["label"] == "auto" and auto["tps"] > 0 and auto["speedup"] > 0 and auto["greedy_identical"] is True
    assert 0 <= auto["mean_k"] <= result["settings"]["auto_max_k"] == 8 and auto["predicted_tps"] is None
    assert result["auto_vs_best"]["k"] == result["optimum_measured"]["k"]
    assert any(v["text"].startswith("auto ") for v in result["verdict"])
    for r in fixed:
        assert r["tps"] > 0 and r["tps_min"] <= r["tps"] <= r["tps_max"]
        assert r["speedup"] > 0
        assert len(r["acceptance"]) == r["k"]
        assert r["verify_ratio"] > 0 and r["predicted_tps"] > 0
        assert r["greedy_identical"] is True
    best = max(fixed, key=lambda r: r["tps"])
    assert result["optimum_measured"]["k"] == best["k"]
    assert [r["k"] for r in fixed if r["is_optimum"]] == [best["k"]]
    assert result["optimum_predicted"]["k"] in (1, 2)
    assert [p["k"] for p in result["verification"]["per_k"]] == [1, 2]
    assert result["verdict"] and isinstance(result["verdict"][0]["text"], str)
    assert all(len(x["rooms"]) == x["steps"] for x in [r.run.to_json() for r in record.runs])
    assert calls and calls[-1][0] == calls[-1][1]  # the progress bar ends full

    out = io.StringIO()
    sweep.print_sweep(record, Console(file=out, width=200))
    text = out.getvalue()
    assert "K sweep" in text and "verification parallelism" in text and result["verdict"][0]["text"][:20] in text

    csv_path = sweep.write_csv(record, tmp_path / "sweep.csv")
    with csv_path.open() as f:
        table = list(csv.reader(f))
    assert table[0][:2] == ["k", "tps"] and "acc_2" in table[0]
    assert [row[0] for row in table[1:]] == ["1", "2", "auto"]
    assert math.isclose(float(table[1][1]), result["rows"][0]["tps"])

    png = sweep.plot_sweep(record, tmp_path / "sweep.png")
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    import matplotlib.image

    img = matplotlib.image.imread(str(png))
    assert img.ndim == 3 and img.shape[0] > 200 and img.shape[1] > 600


def test_sweep_runs_order_is_pinned():
    """Rounds over (repeat, prompt), the method order rotating round by round (``core.schedule``):
    the order results were measured in before stays the order."""
    from mlxspec.measure.sweep.run import time_sweep_runs

    calls = []

    def run(m, p):
        calls.append((m, p[0]))
        return Run([1, 2], 3, 0.1, 0.2, 1, "length", [1], [1], [1])

    items = [{"id": i, "category": "c"} for i in range(2)]
    time_sweep_runs(run, [0, 1, None], items, [[10], [20]], 2, True, lambda label: None, None)
    assert calls == [(0, 10), (1, 10), (None, 10), (1, 20), (None, 20), (0, 20),
                     (None, 10), (0, 10), (1, 10), (0, 20), (1, 20), (None, 20)]
