import pytest

from mlxspec.core.engine import generate_plain
from mlxspec.core.events import Done, Status, Step
from mlxspec.core.sampling import SamplingParams
from mlxspec.errors import MlxspecError
from mlxspec.targets.tokenizer import encode_prompt

pytestmark = pytest.mark.model


def run(lm, prompt, max_tokens=40, params=SamplingParams(), stop=None, context=None, seed=0):
    ids = encode_prompt(lm.tokenizer, prompt) if isinstance(prompt, str) else prompt
    stop = set(lm.tokenizer.eos_token_ids) if stop is None else stop
    events = list(generate_plain(lm.model, ids, params, max_tokens, stop, context or lm.context_length, seed))
    tokens = [t for e in events if isinstance(e, Step) for t in e.tokens]
    return tokens, events[-1]


def test_pinned_greedy_continuation(lm):
    tokens, done = run(lm, "What is the capital of France?")
    assert [t.id for t in tokens] == [504, 3575, 282, 4649, 314, 7042, 30]
    assert lm.tokenizer.decode([t.id for t in tokens]) == "The capital of France is Paris."
    assert all(t.status is Status.PLAIN for t in tokens)
    assert isinstance(done, Done) and done.stop_reason == "eos" and done.generated_tokens == 7


def test_pinned_greedy_list(lm):
    tokens, _ = run(lm, "List the planets of the solar system.", max_tokens=20)
    assert lm.tokenizer.decode([t.id for t in tokens]) == "The Solar System:\n1. Earth\n2. Mars\n3. Jupiter\n4. Saturn"


def test_max_tokens_is_exact(lm):
    tokens, done = run(lm, "List the planets of the solar system.", max_tokens=5)
    assert len(tokens) == 5 and done.stop_reason == "length" and done.generated_tokens == 5


def test_stops_exactly_at_a_stop_token(lm):
    # Stop on the first "." (id 30): the output ends just before it.
    tokens, done = run(lm, "What is the capital of France?", stop={30})
    assert [t.id for t in tokens] == [504, 3575, 282, 4649, 314, 7042]
    assert done.stop_reason == "eos"


def test_context_limit_ends_generation(lm):
    ids = encode_prompt(lm.tokenizer, "List the planets of the solar system.")
    tokens, done = run(lm, ids, max_tokens=50, context=len(ids) + 3)
    assert len(tokens) == 3 and done.stop_reason == "context"


def test_sampling_is_deterministic_under_seed(lm):
    p = SamplingParams(temperature=1.0, top_p=0.9)
    a, _ = run(lm, "Tell me a story.", max_tokens=12, params=p, seed=7)
    b, _ = run(lm, "Tell me a story.", max_tokens=12, params=p, seed=7)
    c, _ = run(lm, "Tell me a story.", max_tokens=12, params=p, seed=8)
    assert [t.id for t in a] == [t.id for t in b]
    assert [t.id for t in a] != [t.id for t in c]


@pytest.mark.parametrize("max_tokens", [0, -3])
def test_bad_max_tokens(lm, max_tokens):
    with pytest.raises(MlxspecError, match="max-tokens must be > 0"):
        run(lm, "hi", max_tokens=max_tokens)


def test_prompt_longer_than_context(lm):
    with pytest.raises(MlxspecError, match="prompt is 40 tokens; the model's context is 16"):
        run(lm, list(range(100, 140)), context=16)


# --- speculative decoding on the real model -------------------------------------------------

from mlxspec.core.engine import generate  # noqa: E402
from mlxspec.targets.drafts import make_drafter  # noqa: E402

PROMPTS = [
    "What is the capital of France?",
    "List the planets of the solar system.",
    "Copy this list exactly, one item per line: apple, banana, cherry, date, elderberry, fig, grape, honeydew, kiwi, lemon.",
    "Write a Python function that reverses a string.",
]


def spec_run(lm, prompt, drafter, k, max_tokens=32, params=SamplingParams(), stop=None, seed=0):
    ids = encode_prompt(lm.tokenizer, prompt)
    stop = set(lm.tokenizer.eos_token_ids) if stop is None else stop
    events = list(generate(lm.model, ids, params, max_tokens, stop, lm.context_length, seed, drafter, k))
    return [e for e in events if isinstance(e, Step)], events[-1]


# ngram:3 greedy also runs at K=4 against pinned events (tests/test_pins.py); K=1 was dropped to keep the suite under 20 min
@pytest.mark.parametrize("spec, k", [("ngram:3", 5), ("self:10", 3), ("ngram:2", 8)])
def test_greedy_speculation_equals_target_only(lm, spec, k):
    for prompt in PROMPTS:
        plain, _ = run(lm, prompt, max_tokens=32)
        steps, done = spec_run(lm, prompt, make_drafter(spec, lm), k)
        out = [t for s in steps for t in s.emitted]
        assert out == [t.id for t in plain], prompt
        assert done.generated_tokens == len(out)


def test_events_tell_the_whole_story(lm):
    steps, done = spec_run(lm, PROMPTS[2], make_drafter("ngram:3", lm), 4, max_tokens=40)
    assert done.steps == len(steps) and done.accepted_lengths == [s.accepted for s in steps]
    assert any(s.accepted > 0 for s in steps), "the repeat prompt should accept some drafts"
    for s in steps[:-1]:  # the last step may be cut by the token limit
        st = [t.status for t in s.tokens]
        assert st[: s.accepted] == [Status.ACCEPTED] * s.accepted
        if s.k == 0:  # the drafter had nothing to propose: a plain target step
            assert st == [Status.PLAIN]
        elif s.accepted == s.k:
            assert st[-1] is Status.BONUS and len(st) == s.k + 1
        else:
            assert st[s.accepted : s.k] == [Status.REJECTED] * (s.k - s.accepted)
            assert st[-1] is Status.CORRECTED
        assert s.draft_ms >= 0 and s.verify_ms > 0


@pytest.mark.parametrize("max_tokens", [1, 2, 3, 7, 11, 18])
def test_max_tokens_exact_inside_an_accepted_run(lm, max_tokens):
    plain, _ = run(lm, PROMPTS[2], max_tokens=max_tokens)
    steps, done = spec_run(lm, PROMPTS[2], make_drafter("ngram:3", lm), 6, max_tokens=max_tokens)
    assert [t for s in steps for t in s.emitted] == [t.id for t in plain]
    assert done.generated_tokens == max_tokens and done.stop_reason == "length"


def test_stop_token_inside_an_accepted_run(lm):
    plain, _ = run(lm, PROMPTS[2], max_tokens=60)
    ids = [t.id for t in plain]
    stop_tok = ids[len(ids) // 2]  # some token well inside the answer
    cut = ids[: ids.index(stop_tok)]
    steps, done = spec_run(lm, PROMPTS[2], make_drafter("ngram:3", lm), 6, max_tokens=60, stop={stop_tok})
    assert [t for s in steps for t in s.emitted] == cut and done.stop_reason == "eos"


def test_sampling_with_a_draft_is_seeded(lm):
    p = SamplingParams(temperature=1.0)
    d = make_drafter("self:6", lm)
    a = [t for s in spec_run(lm, PROMPTS[0], d, 3, 16, p, seed=3)[0] for t in s.emitted]
    b = [t for s in spec_run(lm, PROMPTS[0], d, 3, 16, p, seed=3)[0] for t in s.emitted]
    assert a == b and len(a) > 0


# --- coupled sampling on tiny models: the reply is target-only sampling's, whatever the drafter -----

import random  # noqa: E402

from mlxspec.core import engine  # noqa: E402
from mlxspec.core.drafters import ModelDrafter, NgramDrafter  # noqa: E402
from mlxspec.core.tree import parse_tree  # noqa: E402


class RandomK:
    """K drawn afresh each step, 0 included: what a timing-driven ``--k auto`` may choose."""

    def __init__(self, seed: int):
        self.rng = random.Random(seed)

    def next_k(self) -> int:
        return self.rng.randint(0, 5)

    def observe(self, drafted: int, accepted: int) -> None:
        pass

    def observe_timing(self, draft_ms: float, verify_ms: float, drafted: int) -> None:
        pass


def coupled_tokens(model, drafter, k, seed=11, tree=None, params=None):
    params = params or SamplingParams(temperature=1.0, min_p=0.02, coupled=True)
    prompt = [(5 * i + 2) % 48 for i in range(12)]
    steps = [ev for ev in engine.generate(model, prompt, params, 30, set(), 512, seed, drafter, k, tree=tree)
             if isinstance(ev, Step)]
    return [t.id for s in steps for t in s.tokens if t.emitted], sum(s.accepted for s in steps)


@pytest.mark.parametrize("backend", ["mlx", "torch"])
def test_coupled_speculation_is_target_only_coupled_sampling(backend):
    from tiny import lively_target

    model = lively_target(3).model
    ngram = NgramDrafter(2)
    if backend == "torch":
        torch_model = pytest.importorskip("mlxspec.torchpath.model")
        from mlxspec.torchpath import ops as torch_ops
        from mlxspec.torchpath.invariant import make_batch_invariant

        model = torch_model.Llama.from_mlx(model)
        assert make_batch_invariant(model)
        ngram = NgramDrafter(2, ops=torch_ops)
    alone, _ = coupled_tokens(model, None, 1)
    accepted = 0
    for drafter in (ModelDrafter(model, "self:1", 1), ngram):
        for k in (1, 4, RandomK(0), RandomK(1)):
            out, kept = coupled_tokens(model, drafter, k)
            assert out == alone, (drafter.name, k)
            accepted += kept
    # A drafter whose q is p draws what the target draws: (almost) every draft is kept.
    layers = len(model.layers)
    out, kept = coupled_tokens(model, ModelDrafter(model, "self", layers), 4)
    assert out == alone and kept >= 0.9 * (len(out) - len(out) // 5)
    out, kept = coupled_tokens(model, ModelDrafter(model, "self:1", 1), 1, tree=parse_tree("3x2"))
    assert out == alone and accepted + kept > 0  # drafts were kept: the coupling was exercised
    assert coupled_tokens(model, None, 1, seed=12)[0] != alone  # the seed matters
    uncoupled = SamplingParams(temperature=1.0, min_p=0.02)
    assert coupled_tokens(model, None, 1, params=uncoupled)[0] != alone  # another stream than plain sampling's


@pytest.mark.parametrize("drafter_kind", [None, "ngram", "eagle"])
def test_an_interrupted_prompt_stops_between_chunks_and_keeps_what_it_prefilled(drafter_kind):
    """``interrupt`` is asked after each prompt chunk: True ends the call with ``Interrupted``
    after that chunk, leaving the chunks prefilled in the kept cache (with their hidden states
    for a head), so the same prompt sent again resumes there and decodes as a clean run does."""
    import mlx.core as mx
    from tiny import lively_target

    from mlxspec.core.drafters.eagle import EagleDrafter
    from mlxspec.core.prefill import PREFILL_CHUNK, Interrupted
    from mlxspec.core.prompt_cache import PromptCache
    from mlxspec.training.eagle import new_head

    target = lively_target(3)
    model = target.model
    drafter = {None: lambda: None, "ngram": lambda: NgramDrafter(2),
               "eagle": lambda: EagleDrafter(new_head(target, mx.arange(48), seed=1), "eagle")}[drafter_kind]
    prompt = [(5 * i + 2) % 48 for i in range(2 * PREFILL_CHUNK + 40)]
    asked = []

    def run(kept=None, interrupt=None):
        events = engine.generate(model, prompt, SamplingParams(), 8, set(), 4096, 0, drafter(), 3, kept=kept,
                                 interrupt=interrupt)
        return [t.id for ev in events if isinstance(ev, Step) for t in ev.tokens if t.emitted]

    kept = PromptCache()
    list(engine.generate(model, prompt[:30], SamplingParams(), 4, set(), 4096, 0, drafter(), 3, kept=kept))
    held = len(kept.entries[0].tokens)
    with pytest.raises(Interrupted):
        run(kept, lambda: asked.append(1) or True)
    assert len(asked) == 1  # given up after its first chunk, not at the prompt's end
    entry, = kept.entries
    assert entry.tokens == prompt[: len(entry.tokens)] and len(entry.tokens) >= PREFILL_CHUNK
    if drafter_kind == "eagle":
        assert entry.hidden.shape[0] == len(entry.tokens)
    resumed = []
    assert run(kept, lambda: resumed.append(1) and False) == run()  # resumed: the reply of a clean run
    assert len(resumed) < len(prompt) // PREFILL_CHUNK and held < PREFILL_CHUNK


def test_a_seed_fixes_a_sampled_reply_under_auto_k_whatever_the_clock(monkeypatch):
    """``--k auto`` learns this call's timings only when it ends, so its K, and with it the
    reply sampled with a seed, does not follow the clock; the timings still reach the policy."""
    from types import SimpleNamespace

    from tiny import lively_target

    from mlxspec.core.autok import AutoK

    model = lively_target(3).model
    prompt = [(5 * i + 2) % 48 for i in range(12)]

    def run(clock_seed: int) -> tuple[list[int], list[int], int]:
        rng, now = random.Random(clock_seed), [0.0]

        def clock() -> float:  # a machine whose load swings: steps of 0.5-40 ms
            now[0] += rng.uniform(0.0005, 0.04)
            return now[0]

        monkeypatch.setattr(engine, "time", SimpleNamespace(perf_counter=clock))
        policy = AutoK([5.0, 5.5, 6.0, 6.5, 7.0], max_k=4)
        steps = [ev for ev in engine.generate(model, prompt, SamplingParams(temperature=1.0), 40, set(), 512, 3,
                                              ModelDrafter(model, "self:1", 1), policy) if isinstance(ev, Step)]
        return [t.id for s in steps for t in s.tokens if t.emitted], [s.k for s in steps], policy.timed_steps

    first, ks, timed = run(0)
    for clock_seed in (1, 2, 3):
        assert run(clock_seed)[:2] == (first, ks)
    assert timed == len(ks) and len(set(ks)) > 1  # the timings were observed, and K did vary
