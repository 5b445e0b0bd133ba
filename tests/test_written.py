"""The target's own answers as eagle training data (``training/written.py``): greedy rows are
the target's greedy decoding, the cache is reused and resumes, on both backends."""

from __future__ import annotations

from types import SimpleNamespace

import mlx.core as mx
import pytest

from mlxspec.core.model import Llama, LlamaConfig
from mlxspec.training import written
from mlxspec.training.corpus import Example

VOCAB = 48
LETTERS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTU"  # ids 1..47; 0 is the end token


class CharTokenizer:
    """One token per letter, no chat template: prompts encode as they are."""

    chat_template = None
    eos_token_ids = frozenset({0})

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [1 + LETTERS.index(c) for c in text]

    def decode(self, ids: list[int]) -> str:
        return "".join(LETTERS[i - 1] for i in ids if i > 0)


def tiny(backend: str) -> SimpleNamespace:
    mx.random.seed(7)
    model = Llama(LlamaConfig(vocab_size=VOCAB, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2,
                              intermediate_size=64, tie_embeddings=False))
    model.lm_head.weight = model.lm_head.weight * 3  # sharp enough that answers vary by prompt
    mx.eval(model.parameters())
    if backend == "torch":
        pytest.importorskip("torch", reason="the torch extra is not installed")
        from mlxspec.torchpath.model import Llama as TorchLlama

        return SimpleNamespace(model=TorchLlama.from_mlx(model), tokenizer=CharTokenizer(), name="tiny", mlx=model)
    return SimpleNamespace(model=model, tokenizer=CharTokenizer(), name="tiny", mlx=model)


def greedy(model: Llama, prompt: list[int], n: int) -> list[int]:
    seq, out = list(prompt), []
    for _ in range(n):
        t = int(mx.argmax(model(mx.array([seq]), None)[0, -1]).item())
        if t == 0:
            break
        out.append(t)
        seq.append(t)
    return out


EXAMPLES = [Example(c, p, "people wrote this", "test") for c, p in
            [("chat", "hello"), ("math", "abcabc"), ("code", "defg"), ("chat", "xyzzy"), ("math", "q"), ("code", "mnopqrs")]]


@pytest.mark.parametrize("backend", ["torch", "mlx"])
def test_even_rows_are_the_targets_greedy_answers_odd_rows_sampled(tmp_path, backend):
    target = tiny(backend)
    out = written.written_examples(target, EXAMPLES, tmp_path, max_new=10, seed=0, max_prompt=6)
    assert len(out) == len(EXAMPLES)  # no answer here is empty
    tok = target.tokenizer
    for i, (e, w) in enumerate(zip(EXAMPLES, out)):
        assert (w.category, w.prompt) == (e.category + " (target)", e.prompt)
        ids = tok.encode(w.response)
        assert 1 <= len(ids) <= 10
        if i % 2 == 0:
            assert w.source == "target-greedy"
            assert ids == greedy(target.mlx, tok.encode(e.prompt)[-6:], 10)
        else:
            assert w.source == "target-T1"


def test_answers_are_cached_and_a_build_resumes(tmp_path, monkeypatch):
    target = tiny("torch")
    monkeypatch.setattr(written, "SHARD", 2)
    progress = []
    first = written.written_examples(target, EXAMPLES, tmp_path, max_new=8, progress=lambda i, n: progress.append((i, n)))
    assert progress == [(2, 6), (4, 6), (6, 6)]
    shards = sorted(tmp_path.glob("*.jsonl"))
    assert len(shards) == 3
    shards[1].unlink()  # an interrupted build: one shard never written
    calls = []
    real = written._continuations
    monkeypatch.setattr(written, "_continuations", lambda *a: calls.append(len(a[1])) or real(*a))
    assert written.written_examples(target, EXAMPLES, tmp_path, max_new=8) == first
    assert calls == [1, 1]  # only the missing shard's two prompts (one greedy, one sampled)
    other = written.written_examples(target, EXAMPLES[:2], tmp_path, max_new=9)  # another length: not reused
    assert calls == [1, 1, 1, 1] and len(other) == 2


def test_second_answers_take_the_other_regime_in_shards_of_their_own(tmp_path):
    """Flipped, odd rows are greedy and even rows sampled, so with the first answers every prompt
    has one of each; the two never share a cached shard, and the first keep their old keys."""
    target = tiny("torch")
    first = written.written_examples(target, EXAMPLES, tmp_path, max_new=10, max_prompt=6)
    shards = set(tmp_path.glob("*.jsonl"))
    second = written.written_examples(target, EXAMPLES, tmp_path, max_new=10, max_prompt=6, flipped=True)
    assert len(set(tmp_path.glob("*.jsonl")) - shards) == len(shards) == 1
    assert [w.source for w in second] == ["target-T1", "target-greedy"] * 3
    assert [w.source for w in first] == ["target-greedy", "target-T1"] * 3
    tok = target.tokenizer
    for e, w in list(zip(EXAMPLES, second))[1::2]:
        assert tok.encode(w.response) == greedy(target.mlx, tok.encode(e.prompt)[-6:], 10)
    key = written.shard_key("tiny", EXAMPLES, 10, 0, 6)
    assert (tmp_path / f"{key}.jsonl") in shards and key != written.shard_key("tiny", EXAMPLES, 10, 0, 6, flipped=True)
