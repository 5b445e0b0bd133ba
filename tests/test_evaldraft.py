import dataclasses
import json

import pytest
from typer.testing import CliRunner

from mlxspec.cli import app
from mlxspec.errors import MlxspecError
from mlxspec.measure.evaldraft import EvalOptions, eval_draft, tau_at

pytestmark = pytest.mark.model


def test_eval_uses_the_engine_on_held_out_prompts(lm, quick_draft):
    out, _ = quick_draft
    result = eval_draft(EvalOptions(lm, str(out), ks=(2, 4), temps=(0.0, 1.0), per_category=1, max_tokens=12,
                                    categories=("mt_bench", "math_reasoning")))
    assert [(r.temp, r.k) for r in result.results] == [(0.0, 2), (0.0, 4), (1.0, 2), (1.0, 4)]
    for r in result.results:
        assert 0.0 <= r.tau <= r.k and len(r.acceptance) == r.k
        assert r.tokens > 0 and r.draft_ms > 0
        # tau is the mean accepted per step, so tokens = steps * (tau + 1) up to the last step's cut.
        assert r.tokens <= r.steps * (r.tau + 1) + 1e-6
    assert tau_at(result, 0.0, 4) == result.results[1].tau
    assert len(result.prompts) == 2  # Spec-Bench: never trained on
    data = json.loads(json.dumps(result.to_json()))
    assert data["schema"] == 2 and data["header"]["model"] and data["results"][1]["tau"] == result.results[1].tau
    assert data["results"][1]["tau_interval"] is None  # two prompts: too few to resample


def test_eval_cli_writes_json(tmp_path, quick_draft):
    out, _ = quick_draft
    args = ["eval-draft", "--draft", str(out), "--k", "3", "-t", "0", "-n", "8", "--category", "qa"]
    r = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "e.json")])
    assert r.exit_code == 0, r.output
    assert (tmp_path / "e.json").is_file() and "held-out" in r.output
    r = CliRunner().invoke(app, [*args, "--json"])  # the result on stdout instead of the table
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    assert [(x["temp"], x["k"]) for x in data["results"]] == [(0.0, 3)] and "held-out" not in r.stdout


def test_eval_samples_through_a_min_p_as_the_chat_does(lm, quick_draft, monkeypatch):
    """--min-p reaches the engine at T > 0 only (greedy rows are unchanged) and is recorded;
    a bad one is refused before anything runs."""
    from mlxspec.measure import evaldraft

    out, _ = quick_draft
    seen, run = [], evaldraft.engine_run
    monkeypatch.setattr(evaldraft, "engine_run", lambda lm_, p, params, *a: seen.append(params) or run(lm_, p, params, *a))
    options = EvalOptions(lm, str(out), ks=(3,), temps=(0.0, 1.0), max_tokens=12, categories=("qa",))
    plain, chat = (eval_draft(dataclasses.replace(options, min_p=m)) for m in (0.0, 0.5))
    assert [(s.temperature, s.min_p) for s in seen] == [(0.0, 0.0), (1.0, 0.0), (0.0, 0.0), (1.0, 0.5)]
    assert chat.min_p == 0.5 and chat.to_json()["min_p"] == 0.5 and plain.to_json()["min_p"] == 0.0
    assert chat.results[0].tokens == plain.results[0].tokens and chat.results[0].tau == plain.results[0].tau
    with pytest.raises(MlxspecError, match="min-p"):
        eval_draft(dataclasses.replace(options, min_p=1.5))


def test_intervals_resample_prompts_not_steps():
    """tau and the first draft's rate are ratios over all steps; their intervals resample whole
    prompts, so prompts that disagree widen them however many steps each has, and under five
    prompts there is none."""
    from types import SimpleNamespace

    from mlxspec.measure.evaldraft import prompt_intervals, tally

    def run(accepted, drafted):
        return SimpleNamespace(accepted=accepted, drafted=drafted)

    # Ten prompts of 50 steps: half keep every draft of 3, half keep none; zero-draft steps count
    # in tau (as in method_stats) and not in the first draft's rate.
    runs = [run([3] * 50 + [0], [3] * 50 + [0]) if i % 2 else run([0] * 50, [3] * 50) for i in range(10)]
    tau, first = prompt_intervals([tally(r) for r in runs])
    assert tau.value == pytest.approx(150 * 5 / 505) and first.value == pytest.approx(0.5)
    assert first.clusters == 10 == tau.clusters
    assert tau.lo < tau.value < tau.hi and first.lo < 0.5 < first.hi
    assert first.hi - first.lo > 0.3  # 10 prompts split 5 / 5: wide, though 500 steps
    same = prompt_intervals([tally(run([1, 0] * 25, [3] * 50)) for _ in range(10)])[1]
    assert same.value == 0.5 and same.lo == same.hi == 0.5  # prompts that agree: no spread
    few = prompt_intervals([tally(r) for r in runs[:4]])[0]
    assert few.value is not None and few.lo is None


def test_the_table_shows_each_interval_beside_its_value_in_80_columns():
    from rich.console import Console

    from mlxspec.measure.evaldraft import EvalResult, EvalRow, print_eval

    row = EvalRow(1.0, 5, 0.51, [0.33, 0.12, 0.05, 0.01, 0.01], 1.51, 41.2, 1.4, 244.9, 1500, 2304,
                  (0.42, 0.6), (0.29, 0.37))
    few = dataclasses.replace(row, temp=0.0, tau_interval=None, first_interval=None)
    console = Console(width=80, record=True)
    print_eval(EvalResult(None, "HEAD", ["p"] * 24, 96, None, [row, few]), console)
    text = console.export_text()
    assert "0.51 (.42-.60)" in text and "0.33 (.29-.37)" in text and "1.4 / 244.9" in text
    assert max(len(line) for line in text.splitlines()) <= 80

    from mlxspec.measure.evaldraft import PairedRow
    from mlxspec.measure.study.stats import Estimate

    paired = PairedRow(1.0, 5, Estimate(0.04, -0.03, 0.11, 24, 24), Estimate(-0.01, -0.02, 0.0, 24, 24))
    console = Console(width=80, record=True)
    print_eval(EvalResult(None, "HEAD", ["p"] * 24, 96, None, [row], against="OTHER", against_results=[row],
                          paired=[paired]), console)
    text = console.export_text()
    assert "HEAD minus OTHER" in text and "+0.04 (-0.03, +0.11)" in text and "-0.01 (-0.02, +0.00)" in text
    assert max(len(line) for line in text.splitlines()) <= 80


def test_against_pairs_two_drafts_on_the_same_prompts_and_seeds(lm, quick_draft):
    """A draft against itself at T = 1 differs by exactly 0 on every resample (same prompts, same
    seeds, same runs) though its own interval is wide; against another draft the paired
    difference is the difference of the two rows."""
    out, _ = quick_draft
    options = EvalOptions(lm, str(out), ks=(2,), temps=(1.0,), per_category=1, max_tokens=8, against=str(out))
    self_ = eval_draft(options)
    (a,), (b,), (d,) = self_.results, self_.against_results, self_.paired
    assert len(self_.prompts) >= 5 and a.per_prompt == b.per_prompt and a.tau_interval[1] > a.tau_interval[0]
    assert d.tau.value == 0 and d.tau.lo == d.tau.hi == 0 and d.first.lo == d.first.hi == 0
    other = eval_draft(dataclasses.replace(options, against="ngram:3"))
    (a,), (b,), (d,) = other.results, other.against_results, other.paired
    assert d.tau.value == pytest.approx(a.tau - b.tau) and d.first.value == pytest.approx(a.acceptance[0] - b.acceptance[0])
    assert d.tau.lo <= d.tau.value <= d.tau.hi
    data = json.loads(json.dumps(other.to_json()))
    assert data["against"] == "ngram:3" and data["paired"][0]["tau"]["value"] == pytest.approx(d.tau.value)
    assert data["results"][0]["per_prompt"][0]["steps"] > 0
    with pytest.raises(MlxspecError, match="--against needs a drafter"):
        eval_draft(dataclasses.replace(options, against="none"))
