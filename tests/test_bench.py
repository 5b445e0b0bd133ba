"""Tests for mlxspec.measure.bench (baseline and speculative benchmarks), the shared run record
and prompt sets (``runs``) and the paired verdicts (``verdict``)."""

from __future__ import annotations

import io
import json
import math

import pytest
from rich.console import Console

import mlxspec  # noqa: F401  (must come before mlx: loads the fast BLAS)
from mlxspec.core.events import Done, Status, Step, Token
from mlxspec.errors import MlxspecError
from mlxspec.measure import bench, runs
from mlxspec.measure.bench import baseline, speculative
from mlxspec.core.runs import Run
from mlxspec.core.sampling import SamplingParams
from mlxspec.measure.verdict import Kind, Verdict, median_ratio, pooled_ratio


def test_measure_bandwidth_small_is_positive_and_finite():
    gbs = bench.measure_bandwidth(8 * 1024 * 1024, runs=3, warmup=1)
    assert math.isfinite(gbs) and gbs > 0


def test_default_prompts_pick_three_categories(tmp_path, monkeypatch):
    prompts = bench.default_prompts()
    assert len(prompts) == 3 and len({p["category"] for p in prompts}) == 3
    if runs.data_dir().joinpath(runs.QUESTIONS_FILE).is_file():
        assert [p["id"] for p in prompts] == list(bench.DEFAULT_QUESTIONS)
    monkeypatch.setenv("MLXSPEC_DATA", str(tmp_path))  # an empty folder: built-in prompts
    fallback = bench.default_prompts()
    assert [p["text"] for p in fallback] == list(runs.FALLBACK_PROMPTS)


@pytest.mark.model
def test_baseline_bench_tiny_run():
    calls = []
    result = bench.baseline_bench(
        bench.BaselineOptions(prompts=["Name three colours."], max_tokens=8, warmup=1, repeats=1),
        progress=lambda i, n, label: calls.append((i, n, label)),
    )
    data = json.loads(json.dumps(result.to_json()))
    impls = data["implementations"]
    assert set(impls) == {"mlxspec", "mlx_lm"}
    for st in impls.values():
        assert st["decode_tps_median"] > 0 and st["prefill_tps_median"] > 0
        assert st["decode_tps_min"] <= st["decode_tps_median"] <= st["decode_tps_max"]
        assert st["tokens_per_run"] == [8]
        assert st["ms_per_token"] == pytest.approx(1e3 / st["decode_tps_median"])
    assert data["ratio"] == pytest.approx(
        impls["mlxspec"]["decode_tps_median"] / impls["mlx_lm"]["decode_tps_median"]
    )
    assert data["bandwidth_gbs"] > 0 and data["weight_bytes_per_token"] > 0
    assert data["floor_ms_per_token"] > 0
    assert data["floor_ratio"]["mlxspec"] == pytest.approx(
        impls["mlxspec"]["ms_per_token"] / data["floor_ms_per_token"]
    )
    assert data["schema"] == 2 and data["model"] and data["machine"]["cpu_count"]
    assert data["others_busy"] is None or 0.0 <= data["others_busy"] <= 1.0  # the load it ran under
    # one pair only: never a faster / slower verdict
    assert data["verdict"]["kind"] == "no measurable difference" and data["verdict"]["interval"]["pairs"] == 1
    assert [c[:2] for c in calls] == [(1, 2), (2, 2)]

    out = io.StringIO()
    bench.print_baseline(result, Console(file=out, width=160))
    text = out.getvalue()
    assert "mlx-lm" in text and "floor" in text
    assert data["torch"] is None


# ----------------------------------------------------------------------------- torch columns


def _runs(tokens):
    return Run(list(tokens), 5, 0.1, 1.0)


def test_time_baseline_pairs_interleaves_every_column():
    seen = []

    def run(impl, p):
        seen.append(impl)
        return _runs([1, 2])

    cols = ("mlxspec", "mlx_lm", "torch_float32")
    items = [{"id": i, "category": "c"} for i in range(2)]
    pairs = baseline.time_pairs(run, cols, items, [[1], [2]], bench.BaselineOptions(warmup=0, repeats=2), None)
    assert len(pairs) == 4 and all(set(p) == set(cols) for p in pairs)
    assert seen == [*cols, *cols[::-1], *cols, *cols[::-1]]  # reversed every other pair


def test_first_divergence_is_earliest_per_prompt_over_repeats():
    ref = [1, 2, 3, 4]
    pairs = [  # repeat 1: prompts a, b; repeat 2: a, b
        {"mlxspec": _runs(ref), "torch_bfloat16": _runs([1, 2, 9, 4])},
        {"mlxspec": _runs(ref), "torch_bfloat16": _runs(ref)},
        {"mlxspec": _runs(ref), "torch_bfloat16": _runs([1, 9, 9, 4])},
        {"mlxspec": _runs(ref), "torch_bfloat16": _runs(ref)},
    ]
    assert bench.first_divergence(pairs, "torch_bfloat16", 2) == [1, None]
    verdict = bench.torch_verdict(pairs, "torch_bfloat16")
    assert verdict.kind == Kind.SAME and "torch bfloat16" in verdict.text and "1.00x" in verdict.text


def test_torch_info_picks_the_fastest_dtype_that_agrees():
    v = Verdict(Kind.SAME, "")
    cols = {"float32_2t": bench.TorchColumn("float32", 2, 0.8, v, [None, None], 8),
            "bfloat16_2t": bench.TorchColumn("bfloat16", 2, 1.3, v, [None, 6], 4),
            "float16_2t": bench.TorchColumn("float16", 2, 0.9, v, [None, None], 4),
            "float16_1t": bench.TorchColumn("float16", 1, 0.95, v, [None, None], 4)}
    info = bench.TorchInfo("x", "cpu", [2, 1], "PyTorch", cols)
    assert info.fastest_exact == "float16_1t"  # bfloat16 is faster but leaves MLX's tokens
    assert info.fastest_exact_dtype == "float16"
    data = json.loads(json.dumps(info.to_json()))
    assert data["columns"]["bfloat16_2t"]["agrees"] is False and data["fastest_exact"] == "float16_1t"
    assert bench.TorchInfo("x", "cpu", [2], "PyTorch", {"bfloat16": cols["bfloat16_2t"]}).fastest_exact is None
    assert bench.label("torch_float16_1t") == "torch float16, 1 thread"
    assert bench.label("torch_float32_2t") == "torch float32, 2 threads" and bench.label("torch_float32") == "torch float32"


def test_torch_columns_option(monkeypatch):
    import importlib.util

    assert bench.torch_columns(False, ["bfloat16"]) == ((), None)
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torch" else real(name, *a))
    cols, note = bench.torch_columns(None)
    assert cols == () and "not installed" in note
    with pytest.raises(MlxspecError, match="needs PyTorch"):
        bench.torch_columns(True)
    monkeypatch.setattr(importlib.util, "find_spec", real)
    pytest.importorskip("torch", reason="torch is an optional extra")
    assert bench.torch_columns(None) == (("float32", "quantized"), None)  # and torchpath.default_dtype("cpu")
    assert bench.torch_columns(True, ["auto", "bfloat16", "float32"])[0] == ("float32", "quantized", "bfloat16")
    with pytest.raises(MlxspecError, match="--torch-dtype"):
        bench.torch_columns(True, ["int8"])


def test_busy_cores_keeps_cores_busy_only_while_the_block_runs():
    import time

    from mlxspec.cpuload import CpuMeter, busy_cpu_seconds

    if busy_cpu_seconds() is None:
        pytest.skip("no /proc/stat here")
    with bench.busy_cores(1):
        time.sleep(0.3)  # the child starts
        meter = CpuMeter()
        time.sleep(0.5)
        share = meter.others_busy()
    import os

    assert share >= 0.6 / (os.cpu_count() or 1)  # about one core's worth, whatever else runs


def test_bench_cli_refuses_more_busy_cores_than_the_machine_has():
    import os

    from typer.testing import CliRunner

    from mlxspec.cli import app

    r = CliRunner().invoke(app, ["bench", "--busy", str((os.cpu_count() or 1) + 1)])
    assert r.exit_code == 2 and "--busy must be in 0.." in r.output


def test_bench_cli_rejects_a_bad_torch_dtype():
    pytest.importorskip("torch", reason="torch is an optional extra")
    from typer.testing import CliRunner

    from mlxspec.cli import app

    r = CliRunner().invoke(app, ["bench", "--baseline", "--torch-dtype", "int8"])
    assert r.exit_code == 2 and "--torch-dtype int8" in r.output


@pytest.mark.model
def test_baseline_bench_torch_columns():
    torch = pytest.importorskip("torch", reason="torch is an optional extra")
    threads = torch.get_num_threads()
    calls = []
    options = bench.BaselineOptions(prompts=["Name three colours.", "Count to five."], max_tokens=4, warmup=0,
                                    repeats=1, torch_dtypes=("float32", "bfloat16"), torch_threads=(1,))
    result = bench.baseline_bench(options, progress=lambda i, n, label: calls.append(label))
    assert torch.get_num_threads() == threads  # restored
    data = json.loads(json.dumps(result.to_json()))
    impls = data["implementations"]
    assert set(impls) == {"mlxspec", "mlx_lm", "torch_float32", "torch_bfloat16"}
    for key in ("torch_float32", "torch_bfloat16"):
        assert impls[key]["tokens_per_run"] == [4] and impls[key]["decode_tps_median"] > 0
    t = data["torch"]
    assert t["device"] == "cpu" and t["threads"] == [1] and set(t["columns"]) == {"float32", "bfloat16"}
    assert t["columns"]["float32"]["threads"] == 1 and t["description"].endswith("CPU (1 thread)")
    f32, b16 = t["columns"]["float32"], t["columns"]["bfloat16"]
    assert f32["first_divergence"] == [None, None] and f32["agrees"] is True  # float32: MLX's tokens
    assert len(b16["first_divergence"]) == 2
    assert b16["weight_bytes_per_token"] * 2 == f32["weight_bytes_per_token"]  # really half precision
    assert f32["ratio"] == pytest.approx(impls["torch_float32"]["decode_tps_median"]
                                         / impls["mlxspec"]["decode_tps_median"])
    assert f32["verdict"]["interval"]["pairs"] == 2 and f32["verdict"]["kind"] == "no measurable difference"
    assert len(calls) == 8 and calls[0].startswith("mlxspec") and calls[4].startswith("torch bfloat16")

    out = io.StringIO()
    bench.print_baseline(result, Console(file=out, width=200))
    text = out.getvalue()
    assert "torch float32" in text and "/ mlxspec" in text and "1 thread)" in text


# ----------------------------------------------------------------------------- spec_bench


def _row(method, pid, cat, n, prefill, decode, first, accepted, drafted, dms=(), vms=(), repeat=0, same=None):
    run = Run(list(range(n)), 20, prefill, decode, first, "length", list(accepted), list(drafted), list(drafted),
              list(dms), list(vms))
    return bench.SpecRun(method, run, 0.0, pid, cat, repeat, 0, same)


def _hand_rows():
    return [
        _row("target", 1, "a", 10, 1.0, 1.0, 1, [0] * 10, [0] * 10, [0.0] * 10, [5.0] * 10),
        _row("target", 2, "b", 10, 1.0, 3.0, 1, [0] * 10, [0] * 10, [0.0] * 10, [7.0] * 10),
        _row("spec", 1, "a", 10, 0.5, 0.5, 3, [2, 0, 1, 3], [3, 3, 2, 3], [1, 1, 1, 1], [10, 10, 10, 10], same=True),
        _row("spec", 2, "b", 10, 1.0, 2.0, 1, [0, 1], [2, 0], [2, 2], [20, 20], same=False),
        _row("mlx_lm", 1, "a", 10, 0.5, 2.0, 2, [1, 1], [3, 3]),
    ]


def test_aggregate_exact_numbers():
    agg = bench.aggregate(_hand_rows(), k=3).to_json()
    assert agg["prompts"] == 2
    assert agg["target_tps"] == pytest.approx(20 / 6)
    assert agg["spec_tps"] == pytest.approx(20 / 4)
    assert agg["speedup"] == pytest.approx(1.5)
    assert agg["speedup_median"] == pytest.approx((2.0 + 4 / 3) / 2)  # per prompt: 10/1 / 10/2, 10/3 / 10/4
    assert agg["decode_speedup"] == pytest.approx((16 / 2.5) / (18 / 4))
    assert agg["slower"] is False
    assert agg["verdict"] == "no measurable difference" and agg["interval"]["pairs"] == 2  # two pairs: too few
    assert agg["tau"] == pytest.approx(7 / 6)
    assert agg["tokens_per_step"] == pytest.approx(13 / 6)
    assert agg["acceptance"] == pytest.approx([3 / 5, 2 / 5, 1 / 3])
    assert agg["draft_ms"] == pytest.approx(8 / 6)
    assert agg["verify_ms"] == pytest.approx(80 / 6)
    assert agg["target_ms_per_token"] == pytest.approx(6.0)
    assert agg["methods"]["spec"]["steps"] == 6 and agg["methods"]["target"]["steps"] == 20
    assert agg["methods"]["spec"]["mean_drafted"] == pytest.approx(13 / 6)
    assert agg["greedy_identical"] is False and agg["greedy_mismatches"] == [2]
    m = agg["mlx_lm"]
    assert m["tps"] == pytest.approx(4.0) and m["tau"] == pytest.approx(1.0)
    assert m["acceptance"] == pytest.approx([1.0, 0.0, 0.0])
    assert m["ratio"] == pytest.approx(5.0 / 4.0)
    assert m["decode_tps"] == pytest.approx(8 / 2.0)

    only_b = bench.aggregate([r for r in _hand_rows() if r.category == "b"], k=3).to_json()
    assert only_b["speedup"] == pytest.approx((10 / 3) / (10 / 4)) and only_b["mlx_lm"] is None
    assert only_b["acceptance"] == [0.0, 0.0, None]  # one step drafted 2, one drafted none
    json.dumps(agg)


# ----------------------------------------------------------------------------- verdicts and noise

OVERLAPPING = [0.8, 1.25, 0.9, 1.15, 1.05, 0.95]  # paired speedups on both sides of 1.0
FASTER = [1.4, 1.5, 1.45, 1.38, 1.52, 1.47]
SLOWER = [0.7, 0.75, 0.72, 0.68, 0.74, 0.71]


def _scripted(speedups, cat="a", first_id=0):
    """A target-only and a speculative run per prompt: the target's time varies by prompt (so
    the pairing matters), the speculative run is ``speedup`` times as fast as its pair."""
    out = []
    for i, sp in enumerate(speedups):
        t = 1.0 + 0.5 * (i % 3)
        out.append(_row("target", first_id + i, cat, 20, 0.1 * t, 0.9 * t, 1, [0] * 20, [0] * 20))
        out.append(_row("spec", first_id + i, cat, 20, 0.1 * t / sp, 0.9 * t / sp, 2, [1] * 10, [2] * 10))
    return out


def _temp(rows, k=2):
    cats = list(dict.fromkeys(r.category for r in rows))
    return bench.temp_result(rows, 0.0, cats, k)


@pytest.mark.parametrize("speedups, kind, words", [
    (OVERLAPPING, Kind.SAME, "no measurable difference between speculation and target-only"),
    (FASTER, Kind.FASTER, "speculation is faster"),
    (SLOWER, Kind.SLOWER, "speculation is SLOWER than target-only here"),
    ([1.5, 1.6], Kind.SAME, "too few to tell"),  # two pairs never decide, however far apart
])
def test_bench_verdict_rests_on_the_paired_interval(speedups, kind, words):
    res = _temp(_scripted(speedups))
    (v,) = bench.verdicts([res], "ngram:3", 2)
    assert v.kind is kind and words in v.text
    assert v.interval is not None and v.interval.pairs == len(speedups)
    assert v.interval.excludes(1.0) == (kind is not Kind.SAME or len(speedups) < 5)
    assert f"{v.interval}" in v.text  # the interval is shown
    assert res.overall.slower == (kind is Kind.SLOWER)
    js = v.to_json()
    assert js["kind"] == kind.value and js["interval"]["lo"] <= js["interval"]["hi"] and js["interval"]["level"] == 0.95


def test_bench_names_the_slower_category_and_reports_bugs():
    rows = _scripted(SLOWER, "a") + _scripted(FASTER, "b", first_id=100)
    rows[1] = bench.SpecRun("spec", rows[1].run, 0.0, rows[1].prompt_id, "a", 0, 0, False, 3)  # greedy differs
    res = _temp(rows)
    lines = bench.verdicts([res], "ngram:3", 2)
    assert res.categories["a"].slower and not res.categories["b"].slower
    assert "slower in: a" in lines[0].text
    assert lines[-1].kind is Kind.BUG and "BUG" in lines[-1].text and "0" in lines[-1].text
    out = io.StringIO()
    bench.print_verdicts(lines, Console(file=out, width=300, force_terminal=True, color_system="truecolor"))
    assert "\x1b[1;31m" in out.getvalue()  # the bug line in bold red: coloured by its kind


def test_paired_statistics_are_seeded_and_exact_where_they_can_be():
    a = median_ratio(OVERLAPPING)
    assert a == median_ratio(OVERLAPPING)  # seeded: the same runs give the same interval
    assert a.ratio == pytest.approx(1.0) and a.interval.lo < 1.0 < a.interval.hi
    p = pooled_ratio([10, 10], [1.0, 2.0], [10, 10], [2.0, 4.0])
    assert p.ratio == pytest.approx(2.0) and p.interval.lo == pytest.approx(2.0)
    assert median_ratio([]).ratio is None and median_ratio([]).kind is Kind.EMPTY


# ----------------------------------------------------------------------------- the run record


def test_collect_run_from_events():
    acc, rej, cor, bon = Status.ACCEPTED, Status.REJECTED, Status.CORRECTED, Status.BONUS
    events = [
        Step([Token(1, acc), Token(2, acc), Token(3, bon)], k=2, accepted=2, draft_ms=1.0, verify_ms=5.0, room=2),
        Step([Token(4, rej), Token(5, cor)], k=2, accepted=0, draft_ms=1.5, verify_ms=6.0, room=2),
        Step([Token(6, acc), Token(7, bon)], k=1, accepted=1, draft_ms=0.5, verify_ms=4.0, room=1),
        Done(prompt_tokens=9, generated_tokens=6, prefill_s=0.5, decode_s=1.5, stop_reason="length", steps=3),
    ]
    r = runs.collect_run(events)
    assert r.tokens == [1, 2, 3, 5, 6, 7] and r.prompt_tokens == 9 and r.first_step_tokens == 3
    assert (r.accepted, r.drafted, r.rooms) == ([2, 0, 1], [2, 2, 1], [2, 2, 1])
    assert r.draft_ms == [1.0, 1.5, 0.5] and r.verify_ms == [5.0, 6.0, 4.0]
    assert r.tps == pytest.approx(6 / 2.0) and r.decode_tps == pytest.approx(3 / 1.5) and r.steps == 3
    assert r.to_json()["rooms"] == [2, 2, 1]
    with pytest.raises(MlxspecError, match="Done"):
        runs.collect_run(events[:-1])
    assert runs.first_mismatch([1, 2, 3], [1, 2, 3]) is None
    assert runs.first_mismatch([1, 2, 3], [1, 5, 3]) == 1 and runs.first_mismatch([1, 2], [1, 2, 3]) == 2


def test_mlx_lm_steps_rebuilds_acceptance():
    T, F = True, False
    # k=2, max 5: [T F] [F] [T T] -> the last step used the budget on drafts alone
    assert bench.mlx_lm_steps([T, F, F, T, T], 2, 5) == ([1, 0, 2], [2, 2, 2])
    # full acceptance then the bonus token; a final step cut short by EOS is dropped
    assert bench.mlx_lm_steps([T, T, F, T], 2, 10) == ([2], [2])
    assert bench.mlx_lm_steps([F, F, F], 4, 3) == ([0, 0, 0], [3, 2, 1])
    assert bench.mlx_lm_steps([], 4, 3) == ([], [])


def test_spec_bench_prompts(tmp_path):
    if runs.data_dir().joinpath(runs.QUESTIONS_FILE).is_file():
        items, note = runs.spec_bench_prompts(per_category=2)
        assert note is None
        assert [it["category"] for it in items] == [c for c in runs.SPEC_BENCH_CATEGORIES for _ in range(2)]
        assert [it["id"] for it in items] == [81, 82, 161, 162, 241, 242, 321, 322, 401, 402, 481, 482]
        assert items[0]["source_category"] == "writing"
        items, _ = runs.spec_bench_prompts(["rag", "qa"], per_category=1)
        assert [(it["id"], it["category"]) for it in items] == [(481, "rag"), (321, "qa")]
    with pytest.raises(MlxspecError, match="unknown"):
        runs.spec_bench_prompts(["poetry"])
    txt = tmp_path / "p.txt"
    txt.write_text("first prompt\n\nsecond prompt\n")
    items, _ = runs.spec_bench_prompts(prompts_file=txt)
    assert [(it["id"], it["category"], it["text"]) for it in items] == [
        ("custom-1", "custom", "first prompt"), ("custom-2", "custom", "second prompt")]
    jl = tmp_path / "p.jsonl"
    jl.write_text(json.dumps({"question_id": 7, "turns": ["hello", "again"]}) + "\n")
    items, _ = runs.spec_bench_prompts(prompts_file=jl)
    assert [(it["id"], it["text"]) for it in items] == [(7, "hello")]


def _check_spec_result(result, k):
    result = json.loads(json.dumps(result.to_json()))
    for key in ("date", "machine", "backend", "model", "dtype", "settings", "prompts", "runs", "results",
                "verdicts", "mlx_lm", "mlx_lm_reason"):
        assert key in result
    (res,) = result["results"]
    for a in [*res["categories"].values(), res["overall"]]:
        for key in ("target_tps", "spec_tps", "speedup", "speedup_median", "tau", "tokens_per_step",
                    "acceptance", "draft_ms", "verify_ms", "greedy_identical", "slower", "mlx_lm"):
            assert key in a
        assert a["speedup"] == pytest.approx(a["spec_tps"] / a["target_tps"])
        t, s = a["methods"]["target"], a["methods"]["spec"]
        assert a["target_tps"] == pytest.approx(t["tokens"] / t["seconds"])
        assert a["spec_tps"] == pytest.approx(s["tokens"] / s["seconds"])
        assert len(a["acceptance"]) == k
        assert a["greedy_identical"] is True
    return res["overall"]


@pytest.mark.model
def test_spec_bench_tiny_ngram(lm):
    calls = []
    options = bench.SpecOptions(lm, "ngram:3", k=4, temps=(0.0,), categories=["translation"], per_category=1,
                                max_tokens=8, warmup=0, repeats=1, with_mlx_lm=False)
    result = bench.spec_bench(options, progress=lambda i, n, label: calls.append((i, n)))
    overall = _check_spec_result(result, 4)
    data = result.to_json()
    assert overall["mlx_lm"] is None and data["mlx_lm"] is None and data["mlx_lm_reason"]
    assert calls == [(1, 2), (2, 2)]
    assert [p["id"] for p in data["prompts"]] == [161] or data["prompts"][0]["category"] == "builtin"
    assert all(r["generated_tokens"] <= 8 for r in data["runs"])
    assert data["verdicts"][0]["kind"] == "no measurable difference"  # one prompt: too few pairs to tell
    out = io.StringIO()
    bench.print_spec(result, Console(file=out, width=200))
    assert "overall" in out.getvalue() and "speculation" in out.getvalue()


@pytest.mark.model
def test_spec_bench_self_draft_with_mlx_lm(lm):
    result = bench.spec_bench(bench.SpecOptions(lm, "self:2", k=2, temps=(0.0,), categories=["qa"], per_category=1,
                                                max_tokens=6, warmup=0, repeats=1, with_mlx_lm=True))
    overall = _check_spec_result(result, 2)
    data = result.to_json()
    assert data["mlx_lm"] is not None and "first 2 layers" in data["mlx_lm"]["description"]
    m = overall["mlx_lm"]
    assert m is not None and m["tps"] > 0 and len(m["acceptance"]) == 2
    assert m["ratio"] == pytest.approx(overall["spec_tps"] / m["tps"])
    peer = [r for r in data["runs"] if r["method"] == "mlx_lm"]
    assert len(peer) == 1 and 0 < peer[0]["generated_tokens"] <= 6
    out = io.StringIO()
    bench.print_spec(result, Console(file=out, width=220))
    assert "mlx-lm" in out.getvalue()


@pytest.mark.model
def test_spec_bench_peer_with_its_own_draft_and_k(lm):
    """mlx-lm's peer can run another draft than ours (its best for the target) at its own K."""
    result = bench.spec_bench(bench.SpecOptions(lm, "ngram:3", k=2, temps=(0.0,), categories=["qa"], per_category=1,
                                                max_tokens=6, warmup=0, repeats=1, with_mlx_lm=True,
                                                peer_draft="self:2", peer_k=1))
    data = result.to_json()
    assert "first 2 layers" in data["mlx_lm"]["description"]
    assert data["settings"]["mlx_lm_k"] == 1 and data["settings"]["mlx_lm_draft"] == "self:2"
    (peer,) = [r for r in data["runs"] if r["method"] == "mlx_lm"]
    assert peer["drafted"] and set(peer["drafted"]) == {1}
    out = io.StringIO()
    bench.print_spec(result, Console(file=out, width=220))
    assert "1 draft tokens a step" in out.getvalue()


@pytest.mark.model
def test_spec_bench_on_torch_against_mlx_lm_target_only():
    """The default's question in one run: our torch target with the cascade against torch
    target-only and mlx-lm decoding the same MLX weights alone (``--mlx-lm-draft none``)."""
    from mlxspec.targets.loading import load

    tl = load("default", backend="torch:cpu")
    result = bench.spec_bench(bench.SpecOptions(tl, "ngram:3+smollm2-135m-eagle", k="auto", temps=(0.0,),
                                                categories=["qa"], per_category=1, max_tokens=6, warmup=0,
                                                repeats=1, with_mlx_lm=True, peer_draft="none"))
    data = result.to_json()
    # the default torch target runs the file's 4-bit layers; mlx-lm's peer gets them in float32
    assert tl.dtype == "quantized" and data["mlx_lm"]["description"] == (
        "mlx-lm stream_generate, target-only (no draft model), the weights in float32 (mlx-lm's fastest on this CPU)")
    (peer,) = [r for r in data["runs"] if r["method"] == "mlx_lm"]
    assert 0 < peer["generated_tokens"] <= 6 and set(peer["drafted"]) == {0} and set(peer["accepted"]) == {0}
    assert any("mlxspec / mlx-lm target-only = " in v["text"] for v in data["verdicts"])
    assert all(r["identical_to_target"] for r in data["runs"] if r["method"] == "spec")
    out = io.StringIO()
    bench.print_spec(result, Console(file=out, width=220))
    assert "target-only (no draft model)" in out.getvalue() and "draft tokens a step" not in out.getvalue()
    plain = bench.spec_bench(bench.SpecOptions(tl, "ngram:3", k=2, temps=(0.0,), categories=["qa"], per_category=1,
                                               max_tokens=4, warmup=0, repeats=1))
    assert plain.to_json()["mlx_lm"] is None and "--mlx-lm-draft none" in plain.to_json()["mlx_lm_reason"]


@pytest.mark.model
def test_spec_bench_against_another_drafter_in_the_same_rounds(lm):
    result = bench.spec_bench(bench.SpecOptions(lm, "ngram:3", k=2, temps=(0.0,), categories=["qa"], per_category=1,
                                                max_tokens=8, warmup=0, repeats=1, with_mlx_lm=False,
                                                against="ngram:2+smollm2-135m-eagle"))
    data = result.to_json()
    assert data["settings"]["against"] == "ngram:2+smollm2-135m-eagle"
    runs = [r for r in data["runs"] if r["method"] == "against"]
    assert len(runs) == 1 and runs[0]["identical_to_target"] is True and sum(runs[0]["drafted"]) > 0
    overall = data["results"][0]["overall"]
    a = overall["against"]
    assert a["tps"] > 0 and a["ratio"] == pytest.approx(overall["spec_tps"] / a["tps"])
    assert a["speedup_vs_target"] == pytest.approx(a["tps"] / overall["target_tps"])
    assert any(v["text"].startswith("T=0, ngram:3 k=2: against ngram:2+smollm2-135m-eagle: ") for v in data["verdicts"])
    out = io.StringIO()
    bench.print_spec(result, Console(file=out, width=240))
    assert "vs against = ngram:3 / ngram:2+smollm2-135m-eagle" in " ".join(out.getvalue().split())


@pytest.mark.model
def test_spec_bench_samples_with_the_filters_asked_for_in_every_method(lm, monkeypatch):
    from mlxspec.measure.bench import peer as peer_module

    seen = []
    real = peer_module.make_sampler
    monkeypatch.setattr(peer_module, "make_sampler", lambda **kw: seen.append(kw) or real(**kw))
    result = bench.spec_bench(bench.SpecOptions(lm, "ngram:3", k=2, temps=(0.0, 1.0), categories=["qa"],
                                                per_category=1, max_tokens=4, warmup=0, repeats=1, sampling=SamplingParams(min_p=0.1),
                                                peer_draft="none"))
    data = result.to_json()
    assert data["settings"]["min_p"] == 0.1 and data["settings"]["top_p"] == 1.0
    assert {kw["min_p"] for kw in seen} == {0.1} and {kw["temp"] for kw in seen} == {0.0, 1.0}
    texts = [v["text"] for v in data["verdicts"]]
    assert any(t.startswith("T=1 min-p=0.1, ngram:3 k=2:") for t in texts)
    assert any(t.startswith("T=0, ngram:3 k=2:") for t in texts)
    out = io.StringIO()
    bench.print_spec(result, Console(file=out, width=240))
    assert "T=1 min-p=0.1:" in out.getvalue() and "T=0 min-p" not in out.getvalue()


@pytest.mark.parametrize("against", ["none", "ngram:3"])
def test_against_must_name_another_drafter(against):
    with pytest.raises(MlxspecError, match="--against names the drafter to compare"):
        bench.spec_bench(bench.SpecOptions("default", "ngram:3", against=against))


def test_spec_runs_rotate_every_method_through_every_position():
    """Three methods over three prompts: each runs first, second and third once (a reversed
    order would keep the middle one in the middle for ever)."""
    calls = []
    items = [{"id": i, "category": "qa"} for i in range(3)]
    options = bench.SpecOptions(temps=(1.0,), max_tokens=4, warmup=0, repeats=1)
    speculative.time_spec_runs(lambda m, t, p, n: calls.append(m), ["target", "spec", "mlx_lm"], options, items,
                               [[1], [2], [3]], None)
    rounds = [calls[i:i + 3] for i in range(0, 9, 3)]
    for position in range(3):
        assert sorted(r[position] for r in rounds) == ["mlx_lm", "spec", "target"]


def test_spec_bench_peer_options_need_the_peer():
    with pytest.raises(MlxspecError, match="drop --no-mlx-lm"):
        bench.spec_bench(bench.SpecOptions("default", "ngram:3", k=2, with_mlx_lm=False, peer_k=2))
    with pytest.raises(MlxspecError, match=r"--mlx-lm-k must be in 1\.\.64, got 0"):
        bench.spec_bench(bench.SpecOptions("default", "ngram:3", k=2, peer_k=0))


@pytest.mark.model
def test_spec_bench_with_a_tree(lm):
    """``bench --tree``: the speculative runs draft trees (greedy output still the target's)."""
    from mlxspec.core.tree import parse_tree

    result = bench.spec_bench(bench.SpecOptions(lm, "ngram:3", k="auto", temps=(0.0,), categories=["translation"],
                                                per_category=1, max_tokens=8, warmup=0, repeats=1, with_mlx_lm=False,
                                                tree=parse_tree("2x2")))
    overall = _check_spec_result(result, 2)
    data = result.to_json()
    assert data["settings"]["tree"] == "2x2" and data["settings"]["k"] == 2
    assert "ngram:3 k=tree 2x2" in data["verdicts"][0]["text"]
    out = io.StringIO()
    bench.print_spec(result, Console(file=out, width=200))
    assert "tree=2x2" in out.getvalue()
    assert overall["greedy_identical"] is not False


def test_bench_cli_tree_needs_a_drafter():
    from typer.testing import CliRunner

    from mlxspec.cli import app

    result = CliRunner().invoke(app, ["bench", "--tree", "2x2", "--draft", "none"])
    assert result.exit_code == 2 and result.output.startswith("error: --tree needs a drafter")


def test_spec_runs_order_is_pinned():
    """Warm-up in method order per temperature, then rounds rotated by temperature + repeat +
    prompt (``core.schedule``): the order results were measured in before stays the order."""
    calls = []
    items = [{"id": i, "category": "qa"} for i in range(2)]
    options = bench.SpecOptions(temps=(0.0, 1.0), max_tokens=4, warmup=1, repeats=2)
    speculative.time_spec_runs(lambda m, t, p, n: calls.append((m[0], t, p[0])) or runs.Run([1], 1, 0.1, 0.1),
                               ["target", "spec"], options, items, [[1], [2]], None)
    assert [m + str(p) for m, t, p in calls if t == 0.0] == ["t1", "s1", "t1", "s1", "s2", "t2", "s1", "t1", "t2", "s2"]
    assert [m + str(p) for m, t, p in calls if t == 1.0] == ["t1", "s1", "s1", "t1", "t2", "s2", "t1", "s1", "s2", "t2"]
