"""`mlxspec study` (issue 9): its statistics on synthetic logs with known answers (a planted
Spearman rho, a planted domain effect, a planted depth effect), the resumable log, the node
records of a real tree run on a tiny model against a direct computation, bad input, and one
quick run of the command on the real model."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import mlx.core as mx
import numpy as np
import pytest
from scipy.stats import spearmanr
from tiny import features, lively_target, random_head

import mlxspec  # noqa: F401  (loads the fast BLAS before mlx runs anything)
from mlxspec.core.drafters import ModelDrafter
from mlxspec.core.engine import generate
from mlxspec.core.events import Step
from mlxspec.core.sampling import SamplingParams, probs
from mlxspec.core.tree import parse_tree, path_to
from mlxspec.errors import MlxspecError
from mlxspec.measure import study as st

SETTINGS = st.StudySettings("tiny", "self:1", "3x2", 8, 0.0, 1.0, 24, 0, "float32", 2)


# ----------------------------------------------------------------------------- synthetic logs


def synthetic_nodes(rng: np.random.Generator, rate, prompts: int = 40, steps: int = 25) -> list[dict]:
    """Nodes of 3x2 trees of 8 nodes: every node judged, accepted with probability
    ``rate(domain, depth)``, which is also its alpha."""
    parents = parse_tree("3x2", 8).parents()
    depth_of = [1, 1, 2, 2, 2, 2, 3, 3]
    nodes = []
    for d in st.DOMAINS:
        for p in range(prompts):
            for s in range(steps):
                for i, par in enumerate(parents):
                    acc = bool(rng.random() < rate(d, depth_of[i]))
                    nodes.append({"record": "node", "domain": d, "prompt_id": f"{d}/{p}", "step": s, "pos": s,
                                  "node": i, "parent": par, "depth": depth_of[i], "rank": i % 2, "token": 1,
                                  "q_draft": 0.5, "entropy": float(rng.random()),
                                  "p_target": 0.5 * rate(d, depth_of[i]), "target_top": 1,
                                  "judged": True, "accepted": acc})
    return nodes


def test_weighted_spearman_is_scipys_spearman_with_ties_and_resamples():
    rng = np.random.default_rng(0)
    x = rng.integers(0, 6, 300).astype(float)  # many ties, as siblings share their parent's entropy
    y = (rng.random(300) < 0.4).astype(float)
    assert st.weighted_spearman(x, y, np.ones((1, 300)))[0] == pytest.approx(spearmanr(x, y)[0], abs=1e-12)
    counts = rng.integers(0, 3, 300).astype(float)  # a resample: pair i taken counts[i] times
    dup = np.repeat(np.arange(300), counts.astype(int))
    assert st.weighted_spearman(x, y, counts[None])[0] == pytest.approx(spearmanr(x[dup], y[dup])[0], abs=1e-12)


def test_a_planted_rho_is_recovered_with_an_interval_around_it():
    """Entropy h = exp(x) and accepted = [z > 0], (x, z) normal with correlation r: the
    population Spearman rho (ties averaged) is (2 sqrt(3) / pi) asin(r / sqrt(2))."""
    r, n = -0.3, 24000
    truth = 2 * math.sqrt(3) / math.pi * math.asin(r / math.sqrt(2))  # -0.236
    rng = np.random.default_rng(1)
    x = rng.standard_normal(n)
    z = r * x + math.sqrt(1 - r * r) * rng.standard_normal(n)
    est = st.spearman_estimate(np.exp(x), (z > 0).astype(float), np.arange(n) // 60, resamples=400)
    assert est.value == pytest.approx(truth, abs=0.025)
    assert est.lo < truth < est.hi and est.hi - est.lo < 0.1 and est.clusters == 400

    # the same through the whole summary, as a log of nodes
    nodes = synthetic_nodes(np.random.default_rng(2), lambda d, k: 0.5, prompts=10, steps=20)
    for node, xi, zi in zip(nodes, x, z):
        node["entropy"], node["accepted"] = float(np.exp(xi)), bool(zi > 0)
    row = st.domain_rows(nodes, resamples=200)[0]
    assert row.rho_accepted.value == pytest.approx(truth, abs=0.06) and row.rho_accepted.hi < 0


def test_logistic_deviance_of_one_factor_is_the_cell_rates():
    s, t = np.array([3.0, 10.0, 0.0, 7.0]), np.array([10.0, 20.0, 5.0, 7.0])  # with all-fail and all-succeed cells
    X = np.hstack([np.ones((4, 1)), np.eye(4)[:, 1:]])
    rate = s / t
    with np.errstate(divide="ignore", invalid="ignore"):
        closed = -2 * np.nansum(s * np.log(rate)) - 2 * np.nansum((t - s) * np.log(1 - rate))
    assert st.logistic_deviance(X, s, t) == pytest.approx(closed, abs=1e-4)
    pooled = s.sum() / t.sum()
    assert st.logistic_deviance(np.ones((4, 1)), s, t) == pytest.approx(
        -2 * (s.sum() * np.log(pooled) + (t - s).sum() * np.log(1 - pooled)), rel=1e-9)


def test_a_planted_domain_effect_is_found_and_depth_is_not():
    rates = {"code": 0.25, "maths": 0.35, "logic": 0.45, "chat": 0.6}
    nodes = synthetic_nodes(np.random.default_rng(3), lambda d, k: rates[d])
    v = st.domain_vs_depth(nodes)
    assert v.stronger == "domain" and v.domain.explained > 10 * v.depth.explained
    assert v.domain.p_given_other < 1e-10 and v.depth.p_given_other > st.SIGNIFICANT
    assert v.domain.df == 3 and v.depth.df == 2 and v.nodes == len(nodes)
    result = st.summarise(nodes, SETTINGS, resamples=100)
    claims = {c.claim: c for c in result.claims}
    assert claims["task type predicts acceptance better than depth"].verdict == "holds"
    assert claims["flat depth profile (mean alpha by depth)"].verdict == "holds"
    # 8 nodes a step: E[accepted length] = 8 x the rate here (every node judged)
    for r in result.domains:
        assert r.expected_length.value == pytest.approx(8 * rates[r.domain], abs=0.15)
        assert r.expected_length.lo < 8 * rates[r.domain] < r.expected_length.hi


def test_a_planted_depth_effect_is_found_and_domain_is_not():
    rates = {1: 0.6, 2: 0.4, 3: 0.2}
    nodes = synthetic_nodes(np.random.default_rng(4), lambda d, k: rates[k])
    v = st.domain_vs_depth(nodes)
    assert v.stronger == "depth" and v.depth.explained > 10 * v.domain.explained
    assert v.depth.p_given_other < 1e-10 and v.domain.p_given_other > st.SIGNIFICANT
    result = st.summarise(nodes, SETTINGS, resamples=100)
    claims = {c.claim: c for c in result.claims}
    assert claims["task type predicts acceptance better than depth"].verdict == "does not hold"
    assert claims["flat depth profile (mean alpha by depth)"].verdict == "does not hold"
    for n in nodes:
        n["q_draft"] = None  # prompt lookup: no alpha; the profile is then the judged nodes' acceptance
    claims = {c.claim: c for c in st.summarise(nodes, SETTINGS, resamples=20).claims}
    assert claims["flat depth profile (acceptance of judged nodes by depth)"].verdict == "does not hold"
    pooled = [d for d in result.depths if d.domain == "all"]
    assert [d.acceptance for d in pooled] == pytest.approx([0.6, 0.4, 0.2], abs=0.03)


def test_the_depth_profile_follows_the_accepted_path():
    """Two 3x2 steps of 8 nodes: one accepts nodes 0 then 2 (the first line), one accepts
    nothing. A path continues to depth d when it accepts a node there, having reached d - 1."""
    parents, depth_of = parse_tree("3x2", 8).parents(), [1, 1, 2, 2, 2, 2, 3, 3]
    nodes = []
    for step, path in enumerate([{0, 2}, set()]):
        for i, par in enumerate(parents):
            nodes.append({"domain": "chat", "prompt_id": "p", "step": step, "node": i, "parent": par,
                          "depth": depth_of[i], "q_draft": None, "entropy": 1.0, "p_target": 0.1,
                          "judged": par < 0 or par in path, "accepted": i in path})
    rows = {r.depth: r for r in st.depth_rows(nodes) if r.domain == "chat"}
    assert [(rows[d].reached, rows[d].continued) for d in (1, 2, 3)] == [(2, 1), (1, 1), (1, 0)]
    assert [(rows[d].judged, rows[d].accepted) for d in (1, 2, 3)] == [(4, 1), (2, 1), (2, 0)]
    expected = st.domain_rows(nodes, resamples=10)[0].expected_length.value
    c = [rows[d].continues for d in (1, 2, 3)]
    assert expected == 1.0 == c[0] + c[0] * c[1] + c[0] * c[1] * c[2]


def test_the_summary_is_json_and_plots(tmp_path):
    nodes = synthetic_nodes(np.random.default_rng(5), lambda d, k: 0.4, prompts=4, steps=5)
    result = st.summarise(nodes, SETTINGS, resamples=50)
    # 4 prompts a domain: too few for an interval, so no verdict on rho
    assert all(r.rho_accepted.lo is None and r.expected_length.lo is None for r in result.domains)
    assert all(c.verdict == "cannot tell" for c in result.claims if c.claim.startswith("Spearman"))
    assert any("fewer than 5 prompts" in n for n in result.notes)
    data = json.loads(json.dumps(result.to_json()))
    assert [r["domain"] for r in data["domains"]] == list(st.DOMAINS) and data["nodes"] == len(nodes)
    assert {"claim", "paper", "ours", "verdict"} <= set(data["claims"][0])
    paths = st.plot_study(result, tmp_path / "fig")
    assert [p.name for p in paths] == ["fig-depth.png", "fig-entropy.png"]
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in paths)


def test_the_prompts_the_shipped_draft_was_distilled_on_can_be_passed_over():
    seen = st.distilled_on("smollm2-135m-draft")
    assert len(seen) == 320 and st.distilled_on("self:8") is None and st.distilled_on("ngram:3") is None
    items, _ = st.study_prompts(5)
    assert any(it["text"] in seen for it in items)  # some of the first five are in its training set
    held, notes = st.study_prompts(5, skip=seen)
    assert not notes and len(held) == 20 and not any(it["text"] in seen for it in held)
    assert [it["domain"] for it in held] == [d for d in st.DOMAINS for _ in range(5)]


# ----------------------------------------------------------------------------- the log


def fake_run(item):
    nodes = [{"record": "node", "domain": item["domain"], "prompt_id": item["id"], "step": 0, "pos": 0, "node": i,
              "parent": -1, "depth": 1, "rank": i, "token": 5, "q_draft": 0.5, "entropy": 1.0, "p_target": 0.3,
              "target_top": 5, "judged": True, "accepted": i == 0} for i in range(2)]
    return nodes, {"record": "prompt", "domain": item["domain"], "prompt_id": item["id"], "tokens": [5]}


def test_an_interrupted_log_is_resumed_without_duplicates(tmp_path):
    items = [{"domain": d, "id": f"{d}/{i}", "text": "t"} for d in ("code", "chat") for i in range(3)]
    path = tmp_path / "log.jsonl"
    log = st.StudyLog(path, SETTINGS)
    calls = []

    def interrupted(item):
        if len(calls) == 2:
            raise KeyboardInterrupt
        calls.append(item["id"])
        return fake_run(item)

    with pytest.raises(KeyboardInterrupt):
        st.run_prompts(items, log, interrupted)
    # a third prompt half written (its nodes, no prompt line) and a torn last line
    half = fake_run(items[2])[0]
    with path.open("a") as f:
        f.write("".join(json.dumps(n) + "\n" for n in half) + '{"record": "no')

    ran = []
    log = st.StudyLog(path, SETTINGS)
    assert log.done == {("code", "code/0"), ("code", "code/1")}
    assert st.run_prompts(items, log, lambda it: (ran.append(it["id"]), fake_run(it))[1]) == 4
    assert ran == ["code/2", "chat/0", "chat/1", "chat/2"]
    c = st.read_log(path)
    assert c.dropped == 0 and [p["prompt_id"] for p in c.prompts] == [it["id"] for it in items]
    keys = [(n["prompt_id"], n["node"]) for n in c.nodes]
    assert len(keys) == len(set(keys)) == 2 * len(items)
    assert st.run_prompts(items, st.StudyLog(path, SETTINGS), lambda it: pytest.fail("ran again")) == 0


def test_a_log_of_other_settings_is_refused_and_fresh_starts_again(tmp_path):
    path = tmp_path / "log.jsonl"
    st.run_prompts([{"domain": "code", "id": "c/0"}], st.StudyLog(path, SETTINGS), fake_run)
    with pytest.raises(MlxspecError, match=r"other settings: max_tokens 24 \(now 64\).*--fresh"):
        st.StudyLog(path, replace(SETTINGS, max_tokens=64))
    assert st.StudyLog(path, replace(SETTINGS, per_domain=9)).done == {("code", "c/0")}  # more prompts: resumes
    assert st.StudyLog(path, replace(SETTINGS, max_tokens=64), fresh=True).done == set()
    (tmp_path / "other.jsonl").write_text('{"x": 1}\n')
    with pytest.raises(MlxspecError, match="not a study log"):
        st.StudyLog(tmp_path / "other.jsonl", SETTINGS)


# ----------------------------------------------------------------------------- node records


@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_node_records_match_the_targets_logits_of_each_root_to_node_path(temperature):
    target = lively_target(0)
    params = SamplingParams(temperature=temperature)
    prompt = [3, 17, 9, 40, 2, 33]
    drafter = ModelDrafter(target.model, "self:1", 1)
    events = list(generate(target.model, prompt, params, 30, set(), 512, 0, drafter, tree=parse_tree("3x2", 8),
                           node_stats=True))
    nodes, summary = st.prompt_records(events, "code", "p0", len(prompt))
    steps = [e for e in events if isinstance(e, Step)]
    assert summary["generated"] == 30 and summary["tokens"] == [t for s in steps for t in s.emitted]
    assert summary["nodes"] == len(nodes) == sum(s.k for s in steps if s.tree) > 0

    def dist(model_out):
        row = model_out.astype(mx.float32)
        p = mx.softmax(row) if params.greedy else probs(row, params)
        return np.array(p, dtype=np.float64)

    generated = summary["tokens"]
    by_step: dict[int, list[dict]] = {}
    for n in nodes:
        by_step.setdefault(n["step"], []).append(n)
    accepted_anywhere = judged_rejects = 0
    for step, mine in by_step.items():
        parents = tuple(n["parent"] for n in mine)
        tokens = [n["token"] for n in mine]
        assert tokens == list(steps[step].tree.tokens)
        assert sum(n["accepted"] for n in mine) == steps[step].accepted
        for n in mine:
            context = prompt + generated[: n["pos"]] + [tokens[i] for i in path_to(parents, n["parent"])]
            p = dist(target.model(mx.array([context]), None)[0, -1])
            q = dist(target.model(mx.array([context]), None, num_layers=1)[0, -1])
            nz = p[p > 0]
            assert n["entropy"] == pytest.approx(float(-(nz * np.log(nz)).sum()), abs=1e-4)
            assert n["p_target"] == pytest.approx(p[n["token"]], abs=1e-4)
            assert n["q_draft"] == pytest.approx(q[n["token"]], abs=1e-4)
            assert p[n["target_top"]] == pytest.approx(p.max(), abs=1e-6)
            assert n["judged"] == (n["parent"] < 0 or mine[n["parent"]]["accepted"])
            assert n["depth"] == len(path_to(parents, n["node"])) and 0 <= n["rank"] < 2
            if params.greedy and n["judged"]:  # greedy: a judged node is accepted iff it is the argmax
                assert n["accepted"] == (n["token"] == int(np.argmax(p)))
            accepted_anywhere += n["accepted"]
            judged_rejects += n["judged"] and not n["accepted"]
    assert accepted_anywhere > 0 and judged_rejects > 0


def test_eagle_and_prompt_lookup_trees_log_their_nodes_too():
    from mlxspec.core.drafters import NgramDrafter
    from mlxspec.core.drafters.eagle import EagleDrafter

    target = lively_target(1)
    prompt = [3, 17, 9, 40, 2, 33, 3, 17, 9]
    head = random_head(target)
    for drafter in (EagleDrafter(head, "eagle"), NgramDrafter(2, 1)):
        events = generate(target.model, prompt, SamplingParams(), 20, set(), 512, 0, drafter,
                          tree=parse_tree("3x2", 8), node_stats=True)
        nodes, summary = st.prompt_records(events, "chat", "p", len(prompt))
        assert nodes and summary["generated"] == 20
        generated = summary["tokens"]
        for n in nodes:
            mine = [m for m in nodes if m["step"] == n["step"]]
            above = [mine[i]["token"] for i in path_to(tuple(m["parent"] for m in mine), n["parent"])]
            context = prompt + generated[: n["pos"]] + above
            p = np.array(mx.softmax(target.model(mx.array([context]), None)[0, -1]), dtype=np.float64)
            assert n["p_target"] == pytest.approx(p[n["token"]], abs=1e-4)
            if drafter.name.startswith("ngram"):
                assert n["q_draft"] is None and st.alpha(n) is None
            elif n["depth"] == 1:  # the head's own row after the committed tokens, over its vocabulary
                _, z = head(features(target, context[:-1])[None], mx.array([context[1:]]))
                q = np.array(mx.softmax(z[0, -1]), dtype=np.float64)
                col = head.vocab_ids.tolist().index(n["token"])
                assert n["q_draft"] == pytest.approx(q[col], abs=1e-4)


def test_without_node_stats_the_engine_computes_none():
    target = lively_target(0)
    events = list(generate(target.model, [3, 17, 9, 40], SamplingParams(), 12, set(), 512, 0,
                           ModelDrafter(target.model, "self:1", 1), tree=parse_tree("3x2", 8)))
    trees = [e.tree for e in events if isinstance(e, Step) and e.tree]
    assert trees and all(t.stats is None for t in trees) and "stats" not in trees[0].to_dict()


# ----------------------------------------------------------------------------- the command line


@pytest.mark.parametrize("args, message", [
    (["--tree", "3y2"], r"bad --tree '3y2': expected DxB"),
    (["--tree", "3x2", "--tree-nodes", "99"], r"--tree-nodes must be in 1\.\.64"),
    (["--prompts-per-domain", "0"], r"--prompts-per-domain must be >= 1, got 0"),
    (["--max-tokens", "0"], r"--max-tokens must be > 0"),
    (["--draft", "none"], r"needs a drafter that can branch, but --draft is none"),
    (["--temp", "-1"], r"temperature must be a finite number >= 0"),
])
def test_cli_bad_input_is_one_line_errors(args, message):
    from helpers import invoke, one_line_error

    one_line_error(invoke("study", *args), message)


def test_cli_help_names_json_out_plot_and_the_papers_defaults():
    from helpers import invoke

    r = invoke("study", "--help", terminal_width=200)
    assert r.exit_code == 0
    for opt in ("--json", "--out", "--plot", "--log", "--quick", "--prompts-per-domain", "--tree-nodes"):
        assert opt in r.output
    assert "smollm2-135m-draft" in r.output and "3x2" in r.output


def test_cli_missing_data_folder_is_one_line_error(tmp_path, monkeypatch):
    from helpers import invoke, one_line_error

    monkeypatch.setenv("MLXSPEC_DATA", str(tmp_path / "nowhere"))
    one_line_error(invoke("study", "--quick"), r"prompt data is missing from .*nowhere.*set MLXSPEC_DATA")


@pytest.mark.model
def test_cli_unknown_drafter_is_one_line_error(tmp_path):
    from helpers import invoke, one_line_error

    one_line_error(invoke("study", "--quick", "--draft", "no-such-drafter", "--log", str(tmp_path / "l.jsonl")),
                   r"no-such-drafter")


@pytest.mark.model
def test_cli_quick_study_runs_resumes_and_reports(tmp_path):
    from helpers import invoke

    log, out = tmp_path / "log.jsonl", tmp_path / "study.json"
    r = invoke("study", "--quick", "--log", str(log), "--out", str(out), "--json")
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    assert data == json.loads(out.read_text())
    s = data["settings"]
    assert (s["tree"], s["tree_nodes"], s["max_tokens"], s["per_domain"], s["temperature"]) == ("3x2", 8, 24, 2, 0.0)
    assert s["draft"] == "smollm2-135m-draft" and data["prompts"] == 8 and data["ran"] == 8
    assert [d["domain"] for d in data["domains"]] == list(st.DOMAINS)
    assert all(d["prompts"] == 2 and d["nodes"] > 0 and d["mean_alpha"] is not None for d in data["domains"])
    assert data["nodes"] == sum(d["nodes"] for d in data["domains"]) and data["claims"]
    assert any("was distilled on" in n and "--held-out" in n for n in data["notes"])
    assert (tmp_path / "study-depth.png").is_file() and (tmp_path / "study-entropy.png").is_file()
    lines = [json.loads(x) for x in log.read_text().splitlines()]
    assert lines[0]["record"] == "header" and sum(x["record"] == "node" for x in lines) == data["nodes"]
    again = invoke("study", "--quick", "--log", str(log), "--json")  # everything is in the log: nothing runs
    assert again.exit_code == 0, again.output
    assert json.loads(again.stdout)["ran"] == 0 and json.loads(again.stdout)["domains"] == data["domains"]


def test_a_paired_difference_cancels_what_the_pairs_share():
    """Two drafts on 30 prompts whose difficulty varies far more than the drafts differ (b keeps
    0.03 fewer of its drafts on every prompt): unpaired intervals overlap, the paired one is
    narrow, excludes 0 and covers the planted -0.03; with fewer than 5 pairs, no interval."""
    from mlxspec.measure.study import stats

    rng = np.random.default_rng(0)
    ease = rng.uniform(0.1, 0.8, 30)
    steps = rng.integers(40, 80, 30).astype(float)
    a_kept, b_kept = steps * ease, steps * (ease - 0.03)
    a = stats.ratio_estimate(a_kept, steps, range(30))
    b = stats.ratio_estimate(b_kept, steps, range(30))
    assert a.lo < b.hi  # told apart they are not
    d = stats.paired_ratio_difference(b_kept, steps, a_kept, steps)
    assert d.value == pytest.approx(-0.03) and d.lo == pytest.approx(-0.03) and d.hi == pytest.approx(-0.03)
    noisy = stats.paired_ratio_difference(b_kept + rng.normal(0, 2, 30), steps, a_kept, steps)
    assert noisy.lo < -0.03 < noisy.hi < 0 and noisy.hi - noisy.lo < (a.hi - a.lo) / 3
    few = stats.paired_ratio_difference(b_kept[:4], steps[:4], a_kept[:4], steps[:4])
    assert few.value == pytest.approx(-0.03) and few.lo is None and few.clusters == 4
