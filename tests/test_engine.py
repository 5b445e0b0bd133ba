import pytest

from mlxspec.engine import generate_plain
from mlxspec.errors import MlxspecError
from mlxspec.events import Done, Status, Step
from mlxspec.sampling import SamplingParams
from mlxspec.tokenizer import encode_prompt

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
