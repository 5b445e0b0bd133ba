"""A target cache kept between calls (chat turns) gives the same tokens as starting afresh, and
prefills only what is new."""

from __future__ import annotations

import mlx.core as mx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tiny import VOCAB, tiny_target

from mlxspec.core.cache import PromptCache, common_prefix
from mlxspec.core.drafters import ModelDrafter, NgramDrafter
from mlxspec.core.engine import generate
from mlxspec.core.events import Step
from mlxspec.core.sampling import SamplingParams


@pytest.fixture(scope="module")
def target():
    return tiny_target(seed=3)


def tokens(model, prompt, drafter=None, kept=None, n=12, temp=0.0):
    out = []
    for ev in generate(model, prompt, SamplingParams(temp), n, set(), 4096, 7, drafter, 3, kept):
        if isinstance(ev, Step):
            out += [t.id for t in ev.tokens if t.emitted]
    return out


class CountingModel:
    """The target, counting the tokens it is fed."""

    def __init__(self, model):
        self.model, self.fed = model, 0
        self.capabilities = model.capabilities

    def make_cache(self):
        return self.model.make_cache()

    def __call__(self, tokens, cache, **kw):
        self.fed += tokens.shape[1]
        return self.model(tokens, cache, **kw)


def test_common_prefix():
    assert common_prefix([1, 2, 3], [1, 2, 4, 5]) == 2 and common_prefix([], [1]) == 0
    assert common_prefix([1, 2], [1, 2]) == 2


@pytest.mark.parametrize("make", [lambda t: None, lambda t: NgramDrafter(2),
                                  lambda t: ModelDrafter(t.model, "self:1", num_layers=1)])
@given(turns=st.lists(st.lists(st.integers(1, VOCAB - 1), min_size=1, max_size=6), min_size=2, max_size=3),
       temp=st.sampled_from([0.0, 1.0]))
@settings(max_examples=8, deadline=None)
def test_a_conversation_decodes_as_if_each_turn_started_afresh(target, make, turns, temp):
    kept, convo = PromptCache(), []
    for turn in turns:
        convo = convo + turn
        fresh = tokens(target.model, convo, make(target), None, temp=temp)
        again = tokens(target.model, convo, make(target), kept, temp=temp)
        assert again == fresh
        convo = convo + again  # the next turn extends the conversation, answer included


def test_the_second_turn_prefills_only_what_is_new(target):
    counting = CountingModel(target.model)
    kept = PromptCache()
    first = [5, 6, 7, 8, 9, 10]
    answer = tokens(counting, first, NgramDrafter(2), kept, n=6)
    before = counting.fed
    second = first + answer + [11, 12]
    tokens(counting, second, NgramDrafter(2), kept, n=1)
    # the kept cache holds first + answer[:-1]; the new pass feeds answer[-1], 11 and 12 (its
    # last token is verified with the draft), nothing more
    assert counting.fed - before <= 3 + 1 + 3


def test_a_drafter_reading_hidden_states_gets_them_for_the_whole_prompt(target):
    from mlxspec.core.drafters.eagle import EagleDrafter
    from mlxspec.training.eagle import new_head

    head = new_head(target, mx.arange(0, VOCAB, 2))
    kept, convo = PromptCache(), [3, 4, 5]
    for extra in ([6, 7], [8]):
        fresh = tokens(target.model, convo, EagleDrafter(head, "h"))
        again = tokens(target.model, convo, EagleDrafter(head, "h"), kept)
        assert again == fresh
        assert kept.hidden is not None and kept.hidden.shape[0] == len(kept.tokens)
        convo = convo + again + extra


def test_an_interrupted_turn_leaves_a_usable_cache(target):
    kept = PromptCache()
    events = generate(target.model, [1, 2, 3], SamplingParams(), 12, set(), 4096, 0, NgramDrafter(2), 3, kept)
    next(events)
    events.close()
    assert kept.cache is not None and kept.tokens[:3] == [1, 2, 3]
    convo = [1, 2, 3, 9]
    assert tokens(target.model, convo, None, kept) == tokens(target.model, convo)


@given(first=st.lists(st.integers(1, VOCAB - 1), min_size=2, max_size=10),
       cut=st.integers(0, 10), tail=st.lists(st.integers(1, VOCAB - 1), min_size=1, max_size=4))
@settings(max_examples=12, deadline=None)
def test_a_prompt_that_diverges_from_the_kept_one_reuses_only_the_shared_part(target, first, cut, tail):
    kept = PromptCache()
    tokens(target.model, first, NgramDrafter(2), kept, n=4)
    prompt = first[: min(cut, len(first))] + tail  # an edited message, a re-rendered answer
    assert tokens(target.model, prompt, NgramDrafter(2), kept) == tokens(target.model, prompt, NgramDrafter(2))


@given(turns=st.lists(st.lists(st.integers(1, VOCAB - 1), min_size=1, max_size=6), min_size=2, max_size=3),
       cut=st.integers(0, 4), temp=st.sampled_from([0.0, 1.0]))
@settings(max_examples=10, deadline=None)
def test_a_draft_model_reused_across_turns_keeps_its_cache_exactly(target, turns, cut, temp):
    other = tiny_target(seed=5)
    drafter, convo = ModelDrafter(other.model, "other"), []
    for i, turn in enumerate(turns):
        convo = (convo[: max(len(convo) - cut, 0)] if i == 2 else convo) + turn  # the third turn edits the past
        again = tokens(target.model, convo, drafter, temp=temp)
        assert again == tokens(target.model, convo, ModelDrafter(other.model, "other"), temp=temp)
        held = drafter.committed[: len(drafter.committed) - len(drafter.pending)]
        assert drafter.cache[0].offset == len(held)
        convo = convo + again


def test_the_draft_model_prefills_only_the_new_turn():
    other = tiny_target(seed=5)
    counting = CountingModel(other.model)
    drafter = ModelDrafter(counting, "other")
    target = tiny_target(seed=3)
    first = [5, 6, 7, 8, 9, 10]
    answer = tokens(target.model, first, drafter, n=6)
    before = counting.fed
    tokens(target.model, first + answer + [11, 12], drafter, n=1)
    assert counting.fed - before <= 4 + 3  # the last answer token, 11 and 12, then one draft step
