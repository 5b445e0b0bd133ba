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
