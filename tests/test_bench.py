"""Tests for mlxspec.bench: the baseline benchmark (mlxspec vs mlx-lm vs the bandwidth floor)."""

from __future__ import annotations

import io
import json
import math

import pytest
from rich.console import Console

import mlxspec  # noqa: F401  (must come before mlx: loads the fast BLAS)
from mlxspec.errors import MlxspecError
from mlxspec.measure import bench


def test_measure_bandwidth_small_is_positive_and_finite():
    gbs = bench.measure_bandwidth(8 * 1024 * 1024, runs=3, warmup=1)
    assert math.isfinite(gbs) and gbs > 0


def test_default_prompts_pick_three_categories(tmp_path, monkeypatch):
    prompts = bench.default_prompts()
    assert len(prompts) == 3 and len({p["category"] for p in prompts}) == 3
    if bench.data_dir().joinpath(bench.QUESTIONS_FILE).is_file():
        assert [p["id"] for p in prompts] == list(bench.DEFAULT_QUESTIONS)
    monkeypatch.setenv("MLXSPEC_DATA", str(tmp_path))  # an empty folder: built-in prompts
    fallback = bench.default_prompts()
    assert [p["text"] for p in fallback] == list(bench.FALLBACK_PROMPTS)


@pytest.mark.model
def test_baseline_bench_tiny_run():
    calls = []
    result = bench.baseline_bench(
        prompts=["Name three colours."],
        max_tokens=8,
        warmup=1,
        repeats=1,
        progress=lambda i, n, label: calls.append((i, n, label)),
    )
    impls = result["implementations"]
    assert set(impls) == {"mlxspec", "mlx_lm"}
    for st in impls.values():
        assert st["decode_tps_median"] > 0 and st["prefill_tps_median"] > 0
        assert st["decode_tps_min"] <= st["decode_tps_median"] <= st["decode_tps_max"]
        assert st["tokens_per_run"] == [8]
        assert st["ms_per_token"] == pytest.approx(1e3 / st["decode_tps_median"])
    assert result["ratio"] == pytest.approx(
        impls["mlxspec"]["decode_tps_median"] / impls["mlx_lm"]["decode_tps_median"]
    )
    assert result["bandwidth_gbs"] > 0 and result["weight_bytes_per_token"] > 0
    assert result["floor_ms_per_token"] > 0
    assert result["floor_ratio"]["mlxspec"] == pytest.approx(
        impls["mlxspec"]["ms_per_token"] / result["floor_ms_per_token"]
    )
    assert [c[:2] for c in calls] == [(1, 2), (2, 2)]
    json.loads(json.dumps(result))

    out = io.StringIO()
    bench.print_baseline(result, Console(file=out, width=160))
    text = out.getvalue()
    assert "mlx-lm" in text and "floor" in text


# ----------------------------------------------------------------------------- spec_bench


def _row(method, pid, cat, n, prefill, decode, first, accepted, drafted, dms=(), vms=(), repeat=0, same=None):
    r = bench._row(method, list(range(n)), 20, prefill, decode, first, "length",
                   list(accepted), list(drafted), list(dms), list(vms))
    r.update(prompt_id=pid, category=cat, repeat=repeat, temperature=0.0, identical_to_target=same)
    return r


def _hand_rows():
    return [
        _row("target", 1, "a", 10, 1.0, 1.0, 1, [0] * 10, [0] * 10, [0.0] * 10, [5.0] * 10),
        _row("target", 2, "b", 10, 1.0, 3.0, 1, [0] * 10, [0] * 10, [0.0] * 10, [7.0] * 10),
        _row("spec", 1, "a", 10, 0.5, 0.5, 3, [2, 0, 1, 3], [3, 3, 2, 3], [1, 1, 1, 1], [10, 10, 10, 10], same=True),
        _row("spec", 2, "b", 10, 1.0, 2.0, 1, [0, 1], [2, 0], [2, 2], [20, 20], same=False),
        _row("mlx_lm", 1, "a", 10, 0.5, 2.0, 2, [1, 1], [3, 3]),
    ]


def test_aggregate_exact_numbers():
    agg = bench.aggregate(_hand_rows(), k=3)
    assert agg["prompts"] == 2
    assert agg["target_tps"] == pytest.approx(20 / 6)
    assert agg["spec_tps"] == pytest.approx(20 / 4)
    assert agg["speedup"] == pytest.approx(1.5)
    assert agg["speedup_median"] == pytest.approx((2.0 + 4 / 3) / 2)  # per prompt: 10/1 / 10/2, 10/3 / 10/4
    assert agg["decode_speedup"] == pytest.approx((16 / 2.5) / (18 / 4))
    assert agg["slower"] is False
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

    only_b = bench.aggregate([r for r in _hand_rows() if r["category"] == "b"], k=3)
    assert only_b["speedup"] == pytest.approx((10 / 3) / (10 / 4)) and only_b["mlx_lm"] is None
    assert only_b["acceptance"] == [0.0, 0.0, None]  # one step drafted 2, one drafted none
    json.dumps(agg)


def test_verdicts_say_slower_plainly():
    rows = _hand_rows()
    slow_rows = [dict(r, total_s=r["total_s"] * 2) if r["method"] == "spec" else r for r in rows]
    result = {"settings": {"draft": "ngram:3", "k": 3}, "results": [
        {"temperature": 0.0, "categories": {c: bench.aggregate([r for r in slow_rows if r["category"] == c], 3)
                                            for c in "ab"}, "overall": bench.aggregate(slow_rows, 3)},
    ]}
    lines = bench.verdicts(result)
    assert "speculation is SLOWER than target-only here: 0.75x" in lines[0]
    assert "slower in: b" in lines[0]
    assert any("BUG" in ln and "2" in ln for ln in lines)
    assert any("mlx-lm" in ln for ln in lines)


def test_mlx_lm_steps_rebuilds_acceptance():
    T, F = True, False
    # k=2, max 5: [T F] [F] [T T] -> the last step used the budget on drafts alone
    assert bench.mlx_lm_steps([T, F, F, T, T], 2, 5) == ([1, 0, 2], [2, 2, 2])
    # full acceptance then the bonus token; a final step cut short by EOS is dropped
    assert bench.mlx_lm_steps([T, T, F, T], 2, 10) == ([2], [2])
    assert bench.mlx_lm_steps([F, F, F], 4, 3) == ([0, 0, 0], [3, 2, 1])
    assert bench.mlx_lm_steps([], 4, 3) == ([], [])


def test_spec_bench_prompts(tmp_path):
    if bench.data_dir().joinpath(bench.QUESTIONS_FILE).is_file():
        items, note = bench.spec_bench_prompts(per_category=2)
        assert note is None
        assert [it["category"] for it in items] == [c for c in bench.SPEC_BENCH_CATEGORIES for _ in range(2)]
        assert [it["id"] for it in items] == [81, 82, 161, 162, 241, 242, 321, 322, 401, 402, 481, 482]
        assert items[0]["source_category"] == "writing"
        items, _ = bench.spec_bench_prompts(["rag", "qa"], per_category=1)
        assert [(it["id"], it["category"]) for it in items] == [(481, "rag"), (321, "qa")]
    with pytest.raises(MlxspecError, match="unknown"):
        bench.spec_bench_prompts(["poetry"])
    txt = tmp_path / "p.txt"
    txt.write_text("first prompt\n\nsecond prompt\n")
    items, _ = bench.spec_bench_prompts(prompts_file=txt)
    assert [(it["id"], it["category"], it["text"]) for it in items] == [
        ("custom-1", "custom", "first prompt"), ("custom-2", "custom", "second prompt")]
    jl = tmp_path / "p.jsonl"
    jl.write_text(json.dumps({"question_id": 7, "turns": ["hello", "again"]}) + "\n")
    items, _ = bench.spec_bench_prompts(prompts_file=jl)
    assert [(it["id"], it["text"]) for it in items] == [(7, "hello")]


def _check_spec_result(result, k):
    for key in ("date", "machine", "backend", "model", "dtype", "settings", "prompts", "runs", "results",
                "verdicts", "mlx_lm", "mlx_lm_reason"):
        assert key in result
    json.loads(json.dumps(result))
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
    result = bench.spec_bench(lm, "ngram:3", k=4, temps=(0.0,), categories=["translation"], per_category=1,
                              max_tokens=8, warmup=0, repeats=1, with_mlx_lm=False,
                              progress=lambda i, n, label: calls.append((i, n)))
    overall = _check_spec_result(result, 4)
    assert overall["mlx_lm"] is None and result["mlx_lm"] is None and result["mlx_lm_reason"]
    assert calls == [(1, 2), (2, 2)]
    assert [p["id"] for p in result["prompts"]] == [161] or result["prompts"][0]["category"] == "builtin"
    assert all(r["generated_tokens"] <= 8 for r in result["runs"])
    out = io.StringIO()
    bench.print_spec(result, Console(file=out, width=200))
    assert "overall" in out.getvalue() and "speculation" in out.getvalue()


@pytest.mark.model
def test_spec_bench_self_draft_with_mlx_lm(lm):
    result = bench.spec_bench(lm, "self:2", k=2, temps=(0.0,), categories=["qa"], per_category=1,
                              max_tokens=6, warmup=0, repeats=1, with_mlx_lm=True)
    overall = _check_spec_result(result, 2)
    assert result["mlx_lm"] is not None and "first 2 layers" in result["mlx_lm"]["description"]
    m = overall["mlx_lm"]
    assert m is not None and m["tps"] > 0 and len(m["acceptance"]) == 2
    assert m["ratio"] == pytest.approx(overall["spec_tps"] / m["tps"])
    peer = [r for r in result["runs"] if r["method"] == "mlx_lm"]
    assert len(peer) == 1 and 0 < peer[0]["generated_tokens"] <= 6
    out = io.StringIO()
    bench.print_spec(result, Console(file=out, width=220))
    assert "mlx-lm" in out.getvalue()
