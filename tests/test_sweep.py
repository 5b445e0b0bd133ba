"""Tests for mlxspec.sweep: K parsing, the cost model, the verdict logic, and a tiny real sweep."""

from __future__ import annotations

import csv
import io
import json
import math

import pytest
from rich.console import Console

import mlxspec  # noqa: F401  (must come before mlx: loads the fast BLAS)
from mlxspec.errors import MlxspecError
from mlxspec.measure import sweep

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
    assert rows[0] == pytest.approx({"k": 1, "expected_tokens": 1.8, "step_ms": 12.0, "tps": 150.0, "speedup": 1.5})
    assert rows[1]["expected_tokens"] == pytest.approx(2.2)
    assert rows[1]["step_ms"] == pytest.approx(14.0)
    assert rows[1]["tps"] == pytest.approx(2200 / 14)
    assert rows[1]["speedup"] == pytest.approx(2.2 * 10 / 14)


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


def test_step_rooms_and_position_acceptance():
    # limit 6 tokens, K=2: 0 emitted -> room 2; after 3 -> room 2; after 4 -> room min(2, 6-4-1)=1
    assert sweep.step_rooms([2, 0, 1], 2, 6) == [2, 2, 1]
    # steps (accepted, drafted, room): (2,2,2) (0,2,2) (1,1,2: drafter came up short) (1,1,1: no room)
    acc, cov = sweep.position_acceptance([2, 0, 1, 1], [2, 2, 1, 1], [2, 2, 2, 1], 2)
    assert acc == pytest.approx([3 / 4, 1 / 2])
    assert cov == pytest.approx([1.0, 1 / 2])
    acc, cov = sweep.position_acceptance([], [], [], 2)
    assert acc == [None, None] and cov == [None, None]


# ----------------------------------------------------------------------------- verdict logic

KS = [1, 2, 3]


def flat(p):
    return [[p] * k for k in KS]


def causes(d):
    return [c["cause"] for c in d["causes"]]


def test_draft_too_slow_to_pay():
    # draft 9 ms per token against a 10 ms target token; verification flat
    d = sweep.diagnose(KS, tps=[85.0, 70.0, 60.0], speedup=[0.85, 0.70, 0.60], acceptance=flat(0.7),
                       draft_ms_per_token=[9.0] * 3, verify_ms=[10.5, 11.0, 11.5], target_ms=10.0, baseline_tps=100.0)
    assert not d["pays"]
    assert d["optimum_measured"] == {"k": 1, "tps": 85.0, "speedup": 0.85}
    assert d["verify_kind"] == "batch-parallel"
    assert causes(d) == ["draft_too_slow"]
    assert "draft costs 0.9x the target — too slow to pay" in d["causes"][0]["message"]
    assert d["verdict"][0].startswith("speculation does not pay here: the best K = 1 reaches only 0.85x")
    assert any(line.startswith("why: draft costs 0.9x the target") for line in d["verdict"])


def test_serial_verification():
    # a pass over K+1 tokens costs K+1 token passes: the backend verifies one token at a time
    d = sweep.diagnose(KS, tps=[90.0, 80.0, 70.0], speedup=[0.9, 0.8, 0.7], acceptance=flat(0.8),
                       draft_ms_per_token=[0.1] * 3, verify_ms=[20.0, 30.0, 40.0], target_ms=10.0)
    assert d["verify_slope"] == pytest.approx(1.0)
    assert d["verify_kind"] == "serial"
    assert causes(d) == ["serial_verify"]
    assert "verify cost grows ~linearly with K — this backend verifies serially" in d["causes"][0]["message"]
    assert "4.0x one token" in d["causes"][0]["message"]


def test_acceptance_too_low():
    d = sweep.diagnose(KS, tps=[97.0, 95.0, 93.0], speedup=[0.97, 0.95, 0.93], acceptance=flat(0.05),
                       draft_ms_per_token=[0.1] * 3, verify_ms=[10.5, 11.0, 11.5], target_ms=10.0)
    assert causes(d) == ["low_acceptance"]
    msg = d["causes"][0]["message"]
    assert msg.startswith("acceptance too low: 5% of first drafts accepted, 0.05 tokens won per step at K=1")
    assert "proposed nothing" not in msg
    # a prompt-lookup drafter that finds no match proposes nothing: said so
    d = sweep.diagnose(KS, tps=[97.0, 95.0, 93.0], speedup=[0.97, 0.95, 0.93], acceptance=flat(0.05),
                       draft_ms_per_token=[0.1] * 3, verify_ms=[10.5, 11.0, 11.5], target_ms=10.0,
                       coverage=flat(0.25))
    assert d["causes"][0]["message"].endswith("the drafter proposed nothing in 75% of steps")


def test_overhead_when_the_model_predicts_a_gain_the_run_misses():
    d = sweep.diagnose(KS, tps=[90.0, 85.0, 80.0], speedup=[0.9, 0.85, 0.8], acceptance=flat(0.8),
                       draft_ms_per_token=[0.1] * 3, verify_ms=[10.5, 11.0, 11.5], target_ms=10.0)
    assert causes(d) == ["overhead"]
    assert d["optimum_predicted"]["speedup"] > 1


def test_pays_names_both_optima_and_keeps_cost_causes_as_notes():
    acc = flat(0.8)
    d = sweep.diagnose(KS, tps=[130.0, 150.0, 140.0], speedup=[1.3, 1.5, 1.4], acceptance=acc,
                       draft_ms_per_token=[0.1] * 3, verify_ms=[10.5, 11.0, 11.5], target_ms=10.0, baseline_tps=100.0)
    assert d["pays"] and causes(d) == []
    assert d["optimum_measured"]["k"] == 2
    # E(3) / T(3) = 2.952 / 11.8 ms beats K=2 (2.44 / 11.2) and K=1 (1.8 / 10.6)
    assert d["optimum_predicted"]["k"] == 3
    assert d["optimum_predicted"]["tps"] == pytest.approx(1e3 * 2.952 / 11.8)
    assert d["verdict"][0] == "best K = 2: 1.50x target-only (150.0 vs 100.0 tok/s) — speculation pays here"
    assert d["verdict"][1].startswith("cost model (measured acceptance and costs) predicts best K = 3")
    assert "measured best K = 2" in d["verdict"][1]

    serial = sweep.diagnose(KS, tps=[130.0, 120.0, 110.0], speedup=[1.3, 1.2, 1.1], acceptance=flat(0.95),
                            draft_ms_per_token=[0.1] * 3, verify_ms=[13.0, 16.0, 19.0], target_ms=10.0)
    # ratios 1.3, 1.6, 1.9: slope (0.3 + 1.2 + 2.7) / 14 = 0.3 extra token-times per draft
    assert serial["verify_slope"] == pytest.approx(0.3)
    assert serial["pays"] and causes(serial) == ["partly_serial_verify"]
    assert any(line.startswith("note: verify cost grows") for line in serial["verdict"])


# ----------------------------------------------------------------------------- a tiny real sweep


@pytest.mark.model
def test_tiny_real_sweep(lm, tmp_path):
    pytest.importorskip("matplotlib")
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("Repeat after me: the quick brown fox jumps over the lazy dog.\n")
    calls = []
    result = sweep.run_sweep([1, 2], model_spec=lm, draft="ngram:3", prompts_file=prompts, max_tokens=8,
                             warmup=0, repeats=1, verify_reps=2,
                             progress=lambda i, n, label: calls.append((i, n, label)))
    result = json.loads(json.dumps(result))  # JSON-serialisable, and read back as a user would

    assert [r["k"] for r in result["rows"]] == [1, 2]
    assert result["baseline"]["tps"] > 0 and result["verification"]["target_ms"] > 0
    for r in result["rows"]:
        assert r["tps"] > 0 and r["tps_min"] <= r["tps"] <= r["tps_max"]
        assert r["speedup"] > 0
        assert len(r["acceptance"]) == r["k"]
        assert r["verify_ratio"] > 0 and r["predicted_tps"] > 0
        assert r["greedy_identical"] is True
    best = max(result["rows"], key=lambda r: r["tps"])
    assert result["optimum_measured"]["k"] == best["k"]
    assert [r["k"] for r in result["rows"] if r["is_optimum"]] == [best["k"]]
    assert result["optimum_predicted"]["k"] in (1, 2)
    assert [p["k"] for p in result["verification"]["per_k"]] == [1, 2]
    assert result["verdict"] and isinstance(result["verdict"][0], str)
    assert calls and calls[-1][0] == calls[-1][1]  # the progress bar ends full

    out = io.StringIO()
    sweep.print_sweep(result, Console(file=out, width=200))
    text = out.getvalue()
    assert "K sweep" in text and "verification parallelism" in text and result["verdict"][0][:20] in text

    csv_path = sweep.write_csv(result, tmp_path / "sweep.csv")
    with csv_path.open() as f:
        table = list(csv.reader(f))
    assert table[0][:2] == ["k", "tps"] and "acc_2" in table[0]
    assert [row[0] for row in table[1:]] == ["1", "2"]
    assert math.isclose(float(table[1][1]), result["rows"][0]["tps"])

    png = sweep.plot_sweep(result, tmp_path / "sweep.png")
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    import matplotlib.image

    img = matplotlib.image.imread(str(png))
    assert img.ndim == 3 and img.shape[0] > 200 and img.shape[1] > 600
