import mlx.core as mx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mlx_lm.models.cache import RotatingKVCache

from mlxspec.core.cache import rewind
from mlxspec.core.drafters import Commit, ModelDrafter, NgramDrafter, parse_k
from mlxspec.core.model import Llama, LlamaConfig
from mlxspec.core.prefill import prefill
from mlxspec.core.sampling import SamplingParams
from mlxspec.errors import MlxspecError
from mlxspec.targets.drafts import make_drafter

CFG = LlamaConfig(vocab_size=32, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=64)
GREEDY = SamplingParams()


@pytest.fixture(scope="module")
def tiny():
    mx.random.seed(1)
    m = Llama(CFG)
    mx.eval(m.parameters())
    return m


def fresh_logits(model, tokens, num_layers=None):
    return prefill(model, model.make_cache(), tokens, num_layers=num_layers)


def test_ngram_proposes_what_followed_the_last_match():
    d = NgramDrafter(3)
    hist = [5, 6, 7, 8, 9, 1, 5, 6, 7]
    assert d.propose(hist, 4, GREEDY, None).tokens.tolist() == [8, 9, 1, 5]
    assert d.propose(hist, 2, GREEDY, None).tokens.tolist() == [8, 9]


def test_ngram_prefers_the_latest_match_and_backs_off_to_shorter_ngrams():
    d = NgramDrafter(3, min_n=1)
    assert d.propose([1, 2, 3, 1, 2, 4, 9, 2], 2, GREEDY, None).tokens.tolist() == [4, 9]  # bigram miss, unigram "2"
    assert d.propose([1, 2, 3, 1, 2, 4, 9, 1, 2], 1, GREEDY, None).tokens.tolist() == [4]
    assert d.propose([5, 1, 2, 7, 3, 1, 2], 2, GREEDY, None).tokens.tolist() == [7, 3]  # trigram miss, bigram hit


def test_ngram_needs_two_matching_tokens_by_default():
    assert NgramDrafter(3).propose([1, 2, 3, 1, 2, 4, 9, 2], 2, GREEDY, None).tokens.size == 0
    assert NgramDrafter(1).propose([4, 8, 4], 1, GREEDY, None).tokens.tolist() == [8]  # ngram:1 is unigram


def test_ngram_tells_its_match_lengths_apart_before_drafting():
    """So that a K policy can learn each match length's acceptance on its own (``autok.SourcedK``)."""
    assert NgramDrafter(2).sources == ("ngram:2",)
    d = NgramDrafter(3, min_n=1)
    assert d.sources == ("ngram:3 matching 3", "ngram:3 matching 2", "ngram:3 matching 1")
    d.reset([1, 2, 3, 4, 9, 2, 3])  # [2, 3] occurred before, [9, 2, 3] did not
    assert d.upcoming_source() == 1
    d.commit(Commit([4, 7], 1, 9))  # keeps 4, then 9: [3, 4, 9] occurred before
    assert d.history == [1, 2, 3, 4, 9, 2, 3, 4, 9] and d.upcoming_source() == 0
    assert d.propose(d.history, 2, GREEDY, None).tokens.tolist() == [2, 3] and d.used_source == 0
    d.commit(Commit([2, 3], 0, 8))  # [9, 8] and [8] never occurred: the lowest kind, and no draft
    assert d.upcoming_source() == 2 and d.propose(d.history, 2, GREEDY, None).tokens.size == 0


def test_ngram_without_a_match_proposes_nothing():
    proposal = NgramDrafter(2).propose([1, 2, 3, 4], 3, GREEDY, None)
    assert proposal.tokens.size == 0 and proposal.q is None and proposal.is_chain


@settings(max_examples=300, deadline=None)
@given(n=st.integers(1, 5), min_n=st.integers(1, 5), k=st.integers(1, 4),
       history=st.lists(st.integers(0, 4), min_size=1, max_size=40))
def test_ngram_drafts_the_continuation_of_the_latest_longest_match(n, min_n, k, history):
    """Against the rule spelled out: the longest tail of n..min_n tokens seen earlier, its latest
    earlier copy, the k tokens after it (small alphabets, so matches of every length occur)."""
    min_n = min(min_n, n)
    want = []
    for m in range(min(n, len(history) - 1), min_n - 1, -1):
        starts = [s for s in range(len(history) - m) if history[s : s + m] == history[-m:]]
        if starts:
            want = history[starts[-1] + m : starts[-1] + m + k]
            break
    assert NgramDrafter(n, min_n).propose(history, k, GREEDY, None).tokens.tolist() == want


# The rollback property: whatever the target accepts, the draft's cache plus its pending
# tokens must give the same next logits as a fresh prefill of everything committed.
@settings(max_examples=40, deadline=None)
@given(
    prompt=st.lists(st.integers(0, CFG.vocab_size - 1), min_size=1, max_size=12),
    rounds=st.lists(st.tuples(st.integers(1, 6), st.floats(0, 1), st.integers(0, CFG.vocab_size - 1)), min_size=1, max_size=4),
    layers=st.sampled_from([None, 1]),
)
def test_draft_cache_rollback_matches_fresh_prefill(tiny, prompt, rounds, layers):
    d = ModelDrafter(tiny, "tiny", num_layers=layers)
    d.reset(prompt)
    history = list(prompt)
    key = mx.random.key(0)
    for k, frac, nxt in rounds:
        drafted = d.propose(history, k, GREEDY, key).tokens.tolist()
        n = round(frac * k)  # any accept pattern 0..k, not only what the target would choose
        d.commit(Commit(drafted, n, nxt))
        history += drafted[:n] + [nxt]
        # next draft logits from the rolled-back cache == fresh prefill of the history
        ours = d._forward(mx.array(d.pending))
        d.pending = []  # consumed by the probe above: the cache now holds the whole history
        ref = fresh_logits(tiny, history, num_layers=layers)
        np.testing.assert_allclose(np.array(ours), np.array(ref), rtol=1e-4, atol=1e-4)
        d.pending = [history[-1]]
        rewind(d.cache, 1)


@settings(max_examples=30, deadline=None)
@given(
    prompt=st.lists(st.integers(0, CFG.vocab_size - 1), min_size=2, max_size=10),
    steps=st.lists(st.tuples(st.lists(st.integers(0, CFG.vocab_size - 1), max_size=6), st.floats(0, 1), st.integers(0, CFG.vocab_size - 1)), min_size=1, max_size=4),
)
def test_target_cache_rollback_matches_fresh_prefill(tiny, prompt, steps):
    """The engine's target-side move: feed [y, drafts], keep y + the first n, then continue."""
    cache = tiny.make_cache()
    prefill(tiny, cache, prompt[:-1])
    history, y = list(prompt), prompt[-1]
    for drafted, frac, nxt in steps:
        n = round(frac * len(drafted))
        tiny(mx.array([[y] + drafted]), cache)
        rewind(cache, len(drafted) - n)
        history += drafted[:n] + [nxt]
        y = nxt
        assert cache[0].offset == len(history) - 1
    probe = tiny(mx.array([[y]]), cache)[0, -1]
    np.testing.assert_allclose(np.array(probe), np.array(fresh_logits(tiny, history)), rtol=1e-4, atol=1e-4)


def test_non_trimmable_draft_cache_is_refused(tiny):
    class Rotating(Llama):
        def make_cache(self):
            return [RotatingKVCache(max_size=4) for _ in self.layers]

    m = Rotating(CFG)
    with pytest.raises(MlxspecError, match="cannot be rolled back"):
        ModelDrafter(m, "rot").reset([1, 2, 3])


@pytest.mark.parametrize("k", [0, -1, 65, 1000])
def test_bad_k(k):
    with pytest.raises(MlxspecError, match=r"--k must be in 1\.\.64"):
        parse_k(k)


@pytest.mark.parametrize(
    "spec, message",
    [("ngram:x", "expected ngram:N"), ("ngram:0", "ngram size must be in 1..16"),
     ("self:0", r"self:L needs 1 <= L < 30"), ("self:30", r"self:L needs 1 <= L < 30"),
     ("self:abc", "expected self:L with L an integer")],
)
def test_bad_drafter_specs(spec, message):
    class Target:  # only the layer count matters for these checks
        class config:
            num_layers = 30

    with pytest.raises(MlxspecError, match=message):
        make_drafter(spec, Target())


@pytest.mark.parametrize("name, weights", [("smollm2-135m-draft", "draft.safetensors"),
                                           ("smollm2-135m-eagle", "head.safetensors"),
                                           ("smollm2-135m-eagle3", "model.safetensors")])
def test_the_shipped_drafts_are_small_and_registered(name, weights):
    from mlxspec.targets import store

    folder = store.draft_path(name)
    assert (folder / "README.md").is_file()
    shipped = [folder / f for f in (weights, "config.json", "README.md")]
    assert sum(f.stat().st_size for f in shipped) < 30e6  # embeddings are the target's, not stored


def test_the_default_target_drafts_by_lookup_then_the_head_except_on_a_cpu_under_torch(monkeypatch):
    """On MLX (and GPUs) the cascade of prompt lookup and the shipped eagle head; on a CPU under
    torch lookup alone, the faster there at the chat's sampling and at T = 1 (BENCHMARKS.md, "The
    default configuration"). Screens name the same drafter before the model loads."""
    from types import SimpleNamespace

    from mlxspec import flags
    from mlxspec.targets import store
    from mlxspec.targets.drafts import make_drafter
    from mlxspec import torchpath

    target = store.default_target()
    assert store.default_draft(target) == "ngram:3+smollm2-135m-eagle"
    assert store.default_draft(target, "torch:cuda") == "ngram:3+smollm2-135m-eagle"
    assert store.default_draft(target, "torch:cpu") == "ngram:3"
    assert make_drafter("default", SimpleNamespace(name=target, backend="torch:cpu")).name == "ngram:3"
    assert flags.named_draft("default", target, "mlx") == "ngram:3+smollm2-135m-eagle"
    for may_run, want in ((True, "ngram:3"), (False, "ngram:3+smollm2-135m-eagle")):
        monkeypatch.setattr(torchpath, "torch_may_run", lambda dtype="auto", r=may_run: r)
        assert flags.named_draft("default", target, "auto") == want


@pytest.mark.model
def test_default_is_the_cascade_and_the_shipped_drafts_load_by_name(lm):
    from mlxspec.core.drafters.eagle import EagleDrafter
    from mlxspec.targets.drafts import make_drafter
    from mlxspec.core.drafters.draft_model import DraftModel

    assert make_drafter("default", lm).name == "ngram:3+smollm2-135m-eagle"
    d = make_drafter("smollm2-135m-draft", lm)
    assert d.name == "smollm2-135m-draft" and isinstance(d.model, DraftModel)
    assert d.model.cfg.tokenizer_sha256  # it was checked against the target's tokenizer on load
    assert isinstance(make_drafter("smollm2-135m-eagle", lm), EagleDrafter)
