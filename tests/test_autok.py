"""``--k auto``: the policy on scripted cost curves and acceptance profiles, the ``--k`` factory,
exactness on a tiny model, and the verify-cost curve on the real model."""

from __future__ import annotations

import itertools
import json
import math
import random

import pytest

import mlxspec  # noqa: F401  (fast BLAS before mlx)
from mlxspec.core.autok import AutoK, SourcedK, parse_k_option
from mlxspec.errors import MlxspecError
from mlxspec.core.tree import parse_tree

# ms of one target pass over 1..9 tokens
FLAT = [60.0] * 9  # perfectly batch-parallel
MEASURED = [62.0, 71.0, 80.0, 86.0, 91.0, 95.0, 100.0, 106.0, 113.0]  # as on this CPU (~1.15x, 1.47x, ...)
SERIAL = [60.0 * n for n in range(1, 10)]  # token by token
CURVES = {"flat": FLAT, "measured": MEASURED, "serial": SERIAL}
PROFILES = {
    "high": [0.9] * 8,
    "falling": [0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1],
    "rising": [0.3, 0.5, 0.7, 0.9, 0.9, 0.9, 0.9, 0.9],
    "low": [0.2] * 8,
    "zero": [0.0] * 8,
    "perfect": [1.0] * 8,
}


def brute_force(curve, draft_ms, acceptance, max_k=8):
    """argmax over K of E(K)/T(K), written out the slow way; the smallest K on ties."""
    best, best_rate = 0, None
    for k in range(max_k + 1):
        e = sum(_prod(acceptance[:i]) for i in range(k + 1))
        rate = e / (curve[k] + k * draft_ms)
        if best_rate is None or rate > best_rate * (1 + 1e-12):
            best, best_rate = k, rate
    return best


def _prod(xs):
    out = 1.0
    for x in xs:
        out *= x
    return out


def drive(policy, profile, steps, rng, script=None):
    """Run ``policy`` as the engine does: ask K, draft K, accept by the profile's conditional
    acceptance, report back. Returns the Ks asked for."""
    ks = []
    for s in range(steps):
        prof = script(s) if script else profile
        k = policy.next_k()
        n = 0
        while n < k and rng.random() < prof[n]:
            n += 1
        policy.observe(k, n)
        ks.append(k)
    return ks


@pytest.mark.parametrize("curve", CURVES)
@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("draft_ms", [0.0, 3.0, 12.0, 40.0])
def test_best_k_is_the_brute_force_optimum(curve, profile, draft_ms):
    p = AutoK(CURVES[curve], draft_ms, max_k=8)
    assert p.best(PROFILES[profile]) == brute_force(CURVES[curve], draft_ms, PROFILES[profile])


def test_random_curves_and_profiles_match_brute_force():
    rng = random.Random(7)
    for _ in range(300):
        base = rng.uniform(5, 100)
        curve = [base]
        for _ in range(8):
            curve.append(curve[-1] + rng.uniform(0, base))
        acc = [rng.random() for _ in range(8)]
        d = rng.uniform(0, base)
        assert AutoK(curve, d).best(acc) == brute_force(curve, d, acc)


@pytest.mark.parametrize("profile", ["high", "falling", "low"])
def test_learns_a_profile_and_then_picks_its_best_k(profile):
    true = PROFILES[profile]
    p = AutoK(MEASURED, 3.0, forget=0.999, probe_every=4)
    rng = random.Random(1)
    for _ in range(3000):  # draft at full length so that every position is seen
        n = 0
        while n < 8 and rng.random() < true[n]:
            n += 1
        p.observe(8, n)
    est = p.acceptance()
    reached = [i for i in range(8) if _prod(true[:i]) > 0.05]  # positions seen often enough
    assert all(abs(est[i] - true[i]) < 0.06 for i in reached), est
    assert p.next_k() == brute_force(MEASURED, 3.0, true)


def test_k_is_zero_when_the_draft_is_too_slow_even_for_perfect_acceptance():
    # A draft token costs as much as a whole target pass: no K > 0 can beat the plain step.
    p = AutoK(FLAT, 60.0)
    assert not p.can_pay()
    assert drive(p, PROFILES["perfect"], 200, random.Random(0)) == [0] * 200  # never even probes


def test_k_is_zero_when_nothing_is_accepted_and_probes_back_off():
    p = AutoK(MEASURED, 3.0, probe_every=8, probe_max=64)
    ks = drive(p, PROFILES["zero"], 600, random.Random(0))
    assert ks[0] > 0  # the prior is optimistic: it tries
    assert all(k == 0 for k in ks[20:] if k == 0) and ks[-50:].count(0) >= 49
    probes = [i for i, k in enumerate(ks) if k > 0 and i >= 20]
    gaps = [b - a for a, b in itertools.pairwise(probes)]
    assert gaps == sorted(gaps) and gaps[-1] == 65  # doubling up to probe_max plain steps
    no_probe = AutoK(MEASURED, 3.0, probe_every=None)
    assert drive(no_probe, PROFILES["zero"], 300, random.Random(0))[20:] == [0] * 280


def test_adapts_when_acceptance_changes():
    p = AutoK(MEASURED, 3.0, probe_every=4, probe_max=16)
    rng = random.Random(3)

    def script(s):  # easy text, then text the draft cannot guess, then easy again
        return PROFILES["high"] if s < 300 or s >= 600 else PROFILES["zero"]

    ks = drive(p, None, 900, rng, script)
    best_high = brute_force(MEASURED, 3.0, PROFILES["high"])
    assert best_high >= 5 and sum(k == best_high for k in ks[200:300]) >= 90
    assert ks[350:600].count(0) >= 230  # stopped drafting soon after the change (only probes)
    assert sum(k >= 4 for k in ks[700:900]) >= 190  # and a probe noticed the text got easy again


def test_unseen_positions_borrow_from_the_one_before():
    p = AutoK(MEASURED, 3.0, prior=0.6)
    assert p.acceptance() == pytest.approx([0.6] * 8)
    for _ in range(40):
        p.observe(1, 0)  # only position 1 is ever drafted, always rejected
    a = p.acceptance()
    assert a[0] < 0.1 and all(x <= a[0] + 1e-12 for x in a[1:])


def test_a_drafter_that_offers_fewer_tokens_is_not_counted_as_rejecting():
    p = AutoK(MEASURED, 0.0)
    for _ in range(50):
        p.observe(0, 0)  # prompt lookup found nothing
        p.observe(2, 2)  # and here everything it offered was kept
    a = p.acceptance()
    assert a[0] > 0.9 and a[1] > 0.9


def test_observed_timings_move_the_choice():
    p = AutoK(MEASURED, 3.0, probe_every=None)
    k = p.next_k()
    assert k > 0
    for _ in range(30):  # the draft turns out to cost a whole target pass per token
        p.observe_timing(draft_ms=62.0 * k, verify_ms=MEASURED[k], drafted=k)
    assert p.draft_ms == pytest.approx(62.0, rel=0.01) and p.next_k() == 0
    q = AutoK(MEASURED, probe_every=None)  # draft time unknown: a tenth of a target pass
    assert q.draft_ms == pytest.approx(6.2)
    q.observe_timing(40.0, 2 * MEASURED[1], 1)  # the first step catches up on the prompt: not learned
    assert q.draft_ms == pytest.approx(6.2) and q.scale > 1.0
    q.observe_timing(2.0, 2 * MEASURED[1], 1)  # first draft timing replaces the prior
    assert q.draft_ms == pytest.approx(2.0)


def test_a_draft_after_plain_steps_is_not_charged_for_catching_up():
    """A head that sat out plain steps first runs the features it missed; that time belongs to
    those steps, and charging it to the drafted tokens would keep K at 0 (the probe looks dear)."""
    p = AutoK(MEASURED, probe_every=None)
    for _ in range(10):
        p.observe_timing(2.0 * 3, MEASURED[3], 3)
    for _ in range(40):
        p.observe_timing(math.nan, MEASURED[0], 0)  # plain steps
    p.observe_timing(60.0, MEASURED[1], 1)  # the probe: 40 slots of catching up, then one draft
    assert p.draft_ms == pytest.approx(2.0)
    p.observe_timing(2.5, MEASURED[1], 1)  # drafting on: learned again
    assert 2.0 < p.draft_ms < 2.5


def test_fresh_keeps_timings_and_forgets_acceptance():
    p = AutoK(MEASURED, 3.0)
    for _ in range(30):
        p.observe(4, 0)
    p.observe_timing(8.0, 100.0, 4)
    q = p.fresh()
    assert q.acceptance() == pytest.approx([0.6] * 8) and q.draft_ms == p.draft_ms and q.scale == p.scale
    assert p.acceptance()[0] < 0.2  # the original is untouched


def test_the_curve_is_extended_past_its_end():
    p = AutoK([10.0, 12.0], 0.0, max_k=5)
    assert p.cost == [10.0, 12.0, 14.0, 16.0, 18.0, 20.0]
    assert AutoK([10.0], 0.0, max_k=3).cost == [10.0] * 4
    assert AutoK([10.0, 14.0, 12.0, 15.0], 0.0, max_k=4).cost == [10.0, 14.0, 14.0, 15.0, 16.0]  # dips are noise


@pytest.mark.parametrize("bad", [{"cost": []}, {"cost": [0.0, 1.0]}, {"cost": [1.0], "max_k": 0},
                                 {"cost": [1.0], "max_k": 65}, {"cost": [1.0], "prior": 1.5},
                                 {"cost": [1.0], "draft_ms_per_token": -1.0}, {"cost": [1.0], "probe_every": 0}])
def test_bad_settings_are_refused(bad):
    with pytest.raises(MlxspecError):
        AutoK(**bad)


# ----------------------------------------------------------------------------- --k


@pytest.mark.parametrize("spec, expected", [("auto", "auto"), ("AUTO", "auto"), (" 4 ", 4), ("1", 1), ("64", 64), (8, 8)])
def test_k_option_values(spec, expected):
    assert parse_k_option(spec) == expected


@pytest.mark.parametrize("spec, message", [("0", r"--k must be in 1\.\.64, got 0"), ("65", r"got 65"),
                                           ("-1", r"got -1"), ("x", r"auto or an integer in 1\.\.64, got 'x'"),
                                           ("", "auto or an integer"), ("2.5", "auto or an integer")])
def test_k_option_errors_are_one_line(spec, message):
    with pytest.raises(MlxspecError, match=message) as e:
        parse_k_option(spec)
    assert "\n" not in str(e.value)


@pytest.fixture(scope="module")
def tiny():
    from tiny import tiny_target

    lm = tiny_target()
    lm.context_length = 512
    return lm


def test_k_policy_factory(tiny, tmp_path, monkeypatch):
    from mlxspec.core.autok import k_policy
    from mlxspec.core.drafters import NgramDrafter
    from mlxspec.targets.costcurve import cost_curve, curve_path

    monkeypatch.setenv("MLXSPEC_HOME", str(tmp_path))
    lines = []

    def curve(n):
        return cost_curve(tiny, n, log=lines.append)

    with pytest.raises(MlxspecError, match="--k auto needs a drafter"):
        k_policy("auto", None, curve)
    with pytest.raises(MlxspecError, match=r"--k must be in 1\.\.64"):
        k_policy("0", NgramDrafter(3), curve)
    assert k_policy("3", NgramDrafter(3), curve) == 3
    assert k_policy(None, None, curve) == 4  # --k not given, no drafter: K unused
    assert lines == []  # nothing measured for a fixed K
    p = k_policy(None, NgramDrafter(3), curve, max_k=4)  # not given: auto, match lengths pooled
    assert isinstance(p, AutoK) and p.max_k == 4 and len(p.cost) == 5
    assert lines and "measuring the verify cost of tiny" in lines[0]
    assert curve_path("tiny", "float32").is_file()
    lines.clear()
    k_policy("auto", NgramDrafter(3), curve, max_k=4)
    assert lines == []  # cached


def test_sourced_k_learns_each_of_lookups_match_lengths_on_its_own():
    from mlxspec.core.drafters import NgramDrafter

    d = NgramDrafter(3)
    curve = [10.0 + 2.0 * i for i in range(9)]
    policy = SourcedK([AutoK(curve), AutoK(curve)], d)
    longer, shorter = policy.policies
    for _ in range(30):  # 3-token matches always kept, 2-token ones never
        d.used_source = 0
        policy.observe(4, 4)
        d.used_source = 1
        policy.observe(4, 0)
    assert longer.acceptance()[0] > 0.9 and shorter.acceptance()[0] < 0.1
    d.reset([1, 2, 3, 9, 2, 3])  # a 2-token match: not worth drafting
    assert policy.next_k() == 0
    d.reset([1, 2, 3, 9, 1, 2, 3])  # a 3-token match: a long chain
    assert policy.next_k() == longer.best() >= 4
    assert list(policy.describe()) == ["ngram:3 matching 3", "ngram:3 matching 2"]


def test_time_verify_warms_up_then_rotates_the_pass_lengths(tiny):
    """Two untimed passes per length, then rounds over every length, the order rotating round
    by round (``core.schedule``): the order is pinned, curves measured before and after compare."""
    from mlxspec.targets.costcurve import time_verify

    seen, rounds = [], []

    class Counting:
        def make_cache(self):
            return tiny.model.make_cache()

        def __call__(self, tokens, cache=None, **kw):
            seen.append(int(tokens.shape[1]))
            return tiny.model(tokens, cache, **kw)

        def __getattr__(self, name):
            return getattr(tiny.model, name)

    times = time_verify(Counting(), list(range(1, 12)), [1, 3, 5], 4, progress=rounds.append)
    assert seen[1:] == [1, 1, 3, 3, 5, 5, 1, 3, 5, 3, 5, 1, 5, 1, 3, 1, 3, 5]  # after the prompt's prefill
    assert rounds == [1, 2, 3, 4] and {n: len(ms) for n, ms in times.items()} == {1: 4, 3: 4, 5: 4}


@pytest.mark.parametrize("busy", [0.1, 0.9, None])
def test_a_curve_measured_on_a_busy_machine_is_kept_and_marked(tiny, tmp_path, monkeypatch, busy):
    from mlxspec.targets import costcurve

    monkeypatch.setenv("MLXSPEC_HOME", str(tmp_path))
    monkeypatch.setattr(costcurve.CpuMeter, "others_busy", lambda self: busy)
    monkeypatch.setattr(costcurve, "BUSY_SHARE", 0.3)  # the rule as shipped (conftest lifts it)
    lines = []
    curve = costcurve.cost_curve(tiny, 2, reps=1, context_tokens=8, log=lines.append)
    assert curve.others_busy == busy and len(curve.ms) == 2 and curve.busy == (busy == 0.9)
    assert costcurve.curve_path("tiny", "float32").is_file()  # kept either way: no later run waits for it
    assert any("marked busy" in line for line in lines) == curve.busy


def test_a_busy_curve_is_used_while_busy_and_measured_again_on_a_quiet_start(tiny, tmp_path, monkeypatch):
    from mlxspec.targets import costcurve

    monkeypatch.setenv("MLXSPEC_HOME", str(tmp_path))
    monkeypatch.setattr(costcurve, "BUSY_SHARE", 0.3)
    monkeypatch.setattr(costcurve, "QUIET_PROBE_S", 0.0)
    load = {"busy": 0.9}
    monkeypatch.setattr(costcurve.CpuMeter, "others_busy", lambda self: load["busy"])
    measured = []
    real = costcurve.measure_cost_curve
    monkeypatch.setattr(costcurve, "measure_cost_curve", lambda *a, **k: measured.append(1) or real(*a, **k))
    first = costcurve.cost_curve(tiny, 2, reps=1, context_tokens=8, log=None)
    lines = []
    assert costcurve.cost_curve(tiny, 2, log=lines.append) == first and len(measured) == 1  # still busy: reused
    assert any("measured under load" in line for line in lines)
    load["busy"] = 0.05
    again = costcurve.cost_curve(tiny, 2, reps=1, context_tokens=8, log=None)
    assert len(measured) == 2 and not again.busy
    assert costcurve.cost_curve(tiny, 2, log=None) == again and len(measured) == 2  # quiet and cached: kept


def test_a_session_is_ready_before_its_first_request(tiny, tmp_path, monkeypatch):
    """``Session.ready`` makes the K policy, with its cost curve, before any request: the first
    request measures nothing."""
    from mlxspec.session import Session
    from mlxspec.targets import costcurve

    monkeypatch.setenv("MLXSPEC_HOME", str(tmp_path))
    measured = []
    real = costcurve.measure_cost_curve
    monkeypatch.setattr(costcurve, "measure_cost_curve", lambda *a, **k: measured.append(1) or real(*a, **k))
    session = Session(tiny, "ngram:3", "auto", log=None).ready()
    assert len(measured) == 1
    list(session.stream([1, 2, 3, 1, 2], max_tokens=4))
    assert len(measured) == 1


@pytest.mark.parametrize("scale, steps, busy, stale", [
    (3.0, 40, 0.0, True), (0.3, 40, 0.0, True), (1.2, 40, 0.0, False),
    (3.0, 5, 0.0, False), (3.0, 40, 0.9, False), (3.0, 40, None, False),
])
def test_live_timings_far_off_the_cached_curve_make_it_stale(tiny, tmp_path, monkeypatch, scale, steps, busy, stale):
    from mlxspec.targets import costcurve

    monkeypatch.setenv("MLXSPEC_HOME", str(tmp_path))
    curve = costcurve.cost_curve(tiny, 2, reps=1, context_tokens=8, log=None)  # cached, however busy (conftest)
    monkeypatch.setattr(costcurve, "BUSY_SHARE", 0.3)  # the rule as shipped
    lines = []
    assert costcurve.check_against_live(tiny, curve, scale, steps, busy, lines.append) == stale
    assert costcurve.curve_path("tiny", "float32").is_file() != stale
    assert bool(lines) == stale and all("measured again next time" in line for line in lines)


def test_a_session_drops_a_cached_curve_its_live_steps_disagree_with(tmp_path, monkeypatch):
    """A curve cached 1000x too fast (another machine, another thread count): after one reply
    on a quiet machine the session removes it, and the next session measures again."""
    import json

    from tiny import lively_target

    from mlxspec import cpuload
    from mlxspec.session import Session
    from mlxspec.targets import costcurve

    lm = lively_target(3)
    lm.context_length = 256
    monkeypatch.setenv("MLXSPEC_HOME", str(tmp_path))
    monkeypatch.setattr(costcurve, "BUSY_SHARE", 0.3)
    monkeypatch.setattr(cpuload.CpuMeter, "others_busy", lambda self: 0.0)
    real = costcurve.cost_curve(lm, 9, reps=1, context_tokens=8, log=None)
    path = costcurve.curve_path(lm.name, lm.dtype)
    fast = json.loads(path.read_text())
    fast["ms"] = [m / 1000 for m in real.ms]
    path.write_text(json.dumps(fast))
    lines = []
    session = Session(lm, "ngram:3", "auto", log=lines.append)
    assert session.policy.cost[0] == pytest.approx(real.ms[0] / 1000)
    list(session.stream([3, 17, 9, 40, 2, 33, 17, 9] * 4, max_tokens=40, stop_ids=set()))
    assert session.policy.timed_steps >= costcurve.STALE_STEPS and session.policy.scale > costcurve.STALE_SCALE  # clamped at 8x a step
    assert not path.exists() and any("measured again next time" in line for line in lines)


def test_a_session_builds_one_policy_per_drafter_and_measures_once(tiny, tmp_path, monkeypatch):
    from mlxspec.session import Session

    monkeypatch.setenv("MLXSPEC_HOME", str(tmp_path))
    lines = []
    session = Session(tiny, "ngram:3", "auto", log=lines.append)
    auto = session.policy
    assert isinstance(auto, AutoK) and lines
    lines.clear()
    assert session.use("ngram:3", 2).policy == 2 and session.use("none").policy == 4
    assert session.use("ngram:3").policy is auto and lines == []  # kept across turns, curve cached
    assert session.use("ngram:2").policy is not auto
    with pytest.raises(MlxspecError, match="--tree needs a drafter, and the default for tiny is none"):
        session.use("none", tree=parse_tree("2x2"))
    session.use("ngram:3", tree=parse_tree("auto", 4))
    assert session.policy == session.tree.depth and len(session.tree.costs) == 5 and lines == []


def test_cli_refuses_k_auto_with_no_drafter():
    from typer.testing import CliRunner

    from mlxspec.cli import app

    for cmd in (["generate", "hi"], ["bench"], ["chat"]):
        r = CliRunner().invoke(app, [*cmd, "--draft", "none", "--k", "auto"])
        assert r.exit_code == 2, r.output
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: --k auto needs a drafter"), lines


def test_greedy_with_auto_k_is_target_only(tiny):
    from mlxspec.core.drafters import ModelDrafter
    from mlxspec.core.engine import generate
    from mlxspec.core.events import Step
    from mlxspec.core.sampling import SamplingParams

    greedy = SamplingParams(temperature=0.0)
    prompt = [3, 17, 9, 40, 2, 33]

    def tokens(drafter=None, k=4):
        evs = list(generate(tiny.model, prompt, greedy, 40, set(), 512, 0, drafter, k))
        return [t for ev in evs if isinstance(ev, Step) for t in ev.emitted], [ev.k for ev in evs if isinstance(ev, Step)]

    plain, _ = tokens()
    # A draft that barely pays: the policy switches between drafting and plain steps.
    policy = AutoK(FLAT, 20.0, max_k=6, probe_every=2, probe_max=2)
    out, ks = tokens(ModelDrafter(tiny.model, "self:1", num_layers=1), policy)
    assert out == plain
    assert 0 in ks and any(k > 0 for k in ks)


# ----------------------------------------------------------------------------- the real model


@pytest.mark.model
def test_cost_curve_measures_and_caches_on_the_default_model(lm, tmp_path, monkeypatch):
    from mlxspec.targets.costcurve import CostCurve, cost_curve, curve_path

    monkeypatch.setenv("MLXSPEC_HOME", str(tmp_path))
    lines = []
    c = cost_curve(lm, 3, reps=1, context_tokens=64, log=lines.append)
    assert len(c.ms) == 3 and all(m > 0 for m in c.ms) and c.target == lm.name and c.dtype == lm.dtype
    assert lines and "round 1/1" in " ".join(lines)
    path = curve_path(lm.name, lm.dtype)
    assert CostCurve.from_json(json.loads(path.read_text())) == c
    lines.clear()
    assert cost_curve(lm, 2, log=lines.append) == c and lines == []  # cached: covers 2 lengths
    again = cost_curve(lm, 3, remeasure=True, reps=1, context_tokens=64, log=lines.append)
    assert lines and again.measured and len(again.ms) == 3


def test_chat_panel_shows_the_k_in_use():
    from mlxspec.core.events import Status, Step, Token
    from mlxspec.tui.chat.messages import Piece, StepData
    from mlxspec.tui.chat.source import Settings
    from mlxspec.tui.chat.stats import Baseline, TurnStats
    from mlxspec.tui.chat.widgets import render_stats

    settings = Settings(draft="ngram:3", k="auto")
    assert settings.turn_k == 8 and "K=auto" in settings.label and Settings(draft="none", k="auto").turn_k == 0
    stats = TurnStats(started=0.0, k=settings.turn_k)
    for i, (k, n) in enumerate([(3, 1), (0, 0), (5, 5)]):
        statuses = [Status.ACCEPTED] * n + [Status.REJECTED] * (k - n) + [Status.BONUS if n == k else Status.CORRECTED]
        step = Step([Token(j, st) for j, st in enumerate(statuses)], k, n, 1.0, 5.0, room=k)
        stats.add(StepData(tuple(Piece("x", st) for st in statuses), step, float(i)))
    text = render_stats(stats, settings, Baseline()).plain
    assert "K              auto" in text and "K in use       5  (mean 2.7)" in text
