"""A target cache kept between calls (chat turns) gives the same tokens as starting afresh, and
prefills only what is new."""

from __future__ import annotations

import mlx.core as mx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tiny import VOCAB, tiny_target

from mlxspec.core.cache import common_prefix
from mlxspec.core.drafters import ModelDrafter, NgramDrafter
from mlxspec.core.engine import generate
from mlxspec.core.events import Step
from mlxspec.core.prompt_cache import PromptCache
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
        newest = kept.entries[-1]
        assert newest.hidden is not None and newest.hidden.shape[0] == len(newest.tokens)
        convo = convo + again + extra


def test_an_interrupted_turn_leaves_a_usable_cache(target):
    kept = PromptCache()
    events = generate(target.model, [1, 2, 3], SamplingParams(), 12, set(), 4096, 0, NgramDrafter(2), 3, kept)
    next(events)
    events.close()
    assert kept.entries and kept.entries[-1].tokens[:3] == [1, 2, 3]
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


# ----------------------------------------------------------------------------- several entries


def fake_entry_cache(n: int, width: int = 4):
    """A one-layer mlx-lm KVCache holding ``n`` positions (256 allocated: its step)."""
    from mlx_lm.models.cache import KVCache

    c = KVCache()
    c.update_and_fetch(mx.zeros((1, 1, n, width)), mx.zeros((1, 1, n, width)))
    return [c]


def test_two_clients_taking_turns_both_hit_and_prefill_only_their_new_turn(target):
    counting = CountingModel(target.model)
    kept = PromptCache(max_entries=4)
    a, b = [5, 6, 7, 8, 9, 10], [20, 21, 22, 23, 24]
    for turn in range(3):
        for convo_name in ("a", "b"):
            convo = a if convo_name == "a" else b
            before, hits = counting.fed, kept.hits
            answer = tokens(counting, convo, NgramDrafter(2), kept, n=4)
            assert answer == tokens(target.model, convo, NgramDrafter(2), n=4)
            if turn:  # from the second round on each client finds its own conversation
                assert kept.hits == hits + 1
                assert counting.fed - before <= 1 + 2 + 4 * 3  # last answer token, its new turn, the steps
            convo += answer + [30 + turn, 40 + turn]
    assert kept.stats().entries == 2 and kept.stats().misses == 2


def test_a_shared_prefix_is_copied_so_the_longer_conversation_stays(target):
    kept = PromptCache(max_entries=4)
    system = [3, 4, 5, 6]
    a = system + [10, 11, 12]
    answer_a = tokens(target.model, a, None, kept, n=5)
    b = system + [13, 14]
    assert tokens(target.model, b, None, kept, n=5) == tokens(target.model, b, None, n=5)
    assert kept.hits == 1 and kept.stats().entries == 2
    held_a = next(e for e in kept.entries if e.tokens[: len(a)] == a)
    assert held_a.cache[0].offset == len(held_a.tokens)  # the copy was trimmed, not A's own cache
    a2 = a + answer_a + [15]
    counting = CountingModel(target.model)
    assert tokens(counting, a2, None, kept, n=5) == tokens(target.model, a2, None, n=5)
    assert counting.fed <= 2 + 5  # A's whole conversation was still there


def test_least_recently_used_goes_first_and_a_take_counts_as_use():
    kept = PromptCache(max_entries=2)
    kept.keep(fake_entry_cache(3), [1, 2, 3])
    kept.keep(fake_entry_cache(3), [4, 5, 6])
    reuse = kept.take([1, 2, 3, 9], False)  # [1, 2, 3] is handed over and kept again, now the newest
    assert reuse.n == 3 and reuse.cache is not None
    kept.keep(reuse.cache, [1, 2, 3, 9])
    kept.keep(fake_entry_cache(2), [7, 8])
    assert [e.tokens for e in kept.entries] == [[1, 2, 3, 9], [7, 8]]  # [4, 5, 6] was the oldest
    kept.take([1, 2, 7], False)  # shares [1, 2] with the first: copied, the entry stays and is now newest
    kept.keep(fake_entry_cache(2), [5, 5])
    assert [e.tokens for e in kept.entries] == [[1, 2, 3, 9], [5, 5]]


def test_the_byte_limit_holds_and_an_entry_over_it_alone_is_not_kept():
    one = sum(c.nbytes for c in fake_entry_cache(3))
    assert one > 0
    kept = PromptCache(max_entries=10, max_bytes=2 * one)
    for i in range(5):
        kept.keep(fake_entry_cache(3), [i, i + 1])
        assert kept.nbytes <= 2 * one and kept.nbytes == sum(e.nbytes for e in kept.entries)
    assert [e.tokens for e in kept.entries] == [[3, 4], [4, 5]]
    small = PromptCache(max_entries=10, max_bytes=one - 1)
    small.keep(fake_entry_cache(3), [1, 2])
    assert small.stats().entries == 0 and small.nbytes == 0


def test_an_entry_that_a_new_one_extends_is_dropped():
    kept = PromptCache(max_entries=5)
    kept.keep(fake_entry_cache(2), [1, 2])
    kept.keep(fake_entry_cache(2), [3, 4])
    kept.keep(fake_entry_cache(4), [1, 2, 5, 6])  # serves [1, 2] by trimming
    assert [e.tokens for e in kept.entries] == [[3, 4], [1, 2, 5, 6]]


@pytest.mark.parametrize("make", [lambda t: None, lambda t: NgramDrafter(2),
                                  lambda t: ModelDrafter(t.model, "self:1", num_layers=1)])
@given(plan=st.lists(st.tuples(st.integers(0, 2), st.lists(st.integers(1, VOCAB - 1), min_size=1, max_size=4)),
                     min_size=3, max_size=6),
       temp=st.sampled_from([0.0, 1.0]), size=st.integers(1, 3))
@settings(max_examples=8, deadline=None)
def test_clients_interleaved_decode_as_if_each_request_started_afresh(target, make, plan, temp, size):
    """Three clients sharing a system prefix, in any order, through a cache of 1..3 entries:
    every reply is the one a fresh cache gives (greedy and seeded sampling)."""
    kept, convos = PromptCache(max_entries=size), {c: [2, 3, 4] for c in range(3)}
    for client, turn in plan:
        convo = convos[client] + turn
        again = tokens(target.model, convo, make(target), kept, n=6, temp=temp)
        assert again == tokens(target.model, convo, make(target), None, n=6, temp=temp)
        assert kept.stats().entries <= size
        convos[client] = convo + again


def test_an_eagle_head_gets_each_clients_hidden_states(target):
    from mlxspec.core.drafters.eagle import EagleDrafter
    from mlxspec.training.eagle import new_head

    head = new_head(target, mx.arange(0, VOCAB, 2))
    kept, convos = PromptCache(max_entries=3), {0: [3, 4, 5], 1: [9, 8, 7, 6]}
    for client in (0, 1, 0, 1):
        convo = convos[client]
        again = tokens(target.model, convo, EagleDrafter(head, "h"), kept)
        assert again == tokens(target.model, convo, EagleDrafter(head, "h"))
        convos[client] = convo + again + [client + 1]
    assert kept.hits == 2 and all(e.hidden.shape[0] == len(e.tokens) for e in kept.entries)
