"""Tests for mlxspec.bench: the baseline benchmark (mlxspec vs mlx-lm vs the bandwidth floor)."""

from __future__ import annotations

import mlxspec  # noqa: F401  (must come before mlx: loads the fast BLAS)

import io
import json
import math

import pytest
from rich.console import Console

from mlxspec import bench


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
