import json

import numpy as np
import pytest
from tiny import tiny_data, tiny_target

from mlxspec.errors import MlxspecError
from mlxspec.targets.store import data_dir
from mlxspec.training.distill import (
    DistillSet,
    batch_arrays,
    benchmark_texts,
    choose_vocab,
    is_benchmark,
    normalise,
    training_prompts,
)


@pytest.fixture(scope="module")
def shared():
    d = data_dir()
    if not (d / "spec_bench_questions.jsonl").is_file():
        pytest.fail(f"shared data missing at {d}: the benchmark guard cannot be tested")
    return d


def test_no_benchmark_question_is_ever_a_training_prompt(shared):
    prompts, dropped = training_prompts(shared, limit=10_000)
    bench = set(benchmark_texts(shared))
    assert len(bench) > 400
    assert not any(normalise(p["text"]) in bench for p in prompts)
    # Spec-Bench's math_reasoning quotes 80 GSM8K test questions, and mt_bench is MT-Bench.
    assert dropped["gsm8k"] == 80 and dropped["mt_bench"] == 80
    assert {p["source"] for p in prompts} >= {"gsm8k", "humaneval", "folio", "own"}


def test_benchmark_match_survives_whitespace_case_and_wrapping(shared):
    row = json.loads((shared / "spec_bench_questions.jsonl").read_text().splitlines()[400])
    q = row["turns"][0]
    bench = benchmark_texts(shared)
    assert is_benchmark(q, bench)
    assert is_benchmark("  " + q.upper().replace(" ", "\n  ") + " ", bench)
    assert is_benchmark(f"Please answer this question carefully.\n{q}\nThink step by step.", bench)
    assert not is_benchmark("Write a haiku about the ocean.", bench)


def test_prompts_interleave_sources_and_are_seeded(shared):
    a, _ = training_prompts(shared, limit=8, seed=3)
    b, _ = training_prompts(shared, limit=8, seed=3)
    c, _ = training_prompts(shared, limit=8, seed=4)
    assert a == b and a != c
    assert len({p["source"] for p in a}) >= 4


def test_vocab_is_the_most_frequent_tokens_with_end_tokens_forced_in():
    seqs = [np.array([5, 5, 5, 7, 7, 9, 3]), np.array([7, 5, 11])]
    assert choose_vocab(seqs, 3, 20, always=[0]).tolist() == [0, 5, 7]
    # Unseen slots go to the lowest ids (BPE merge order).
    assert choose_vocab(seqs, 8, 20, always=[0]).tolist() == [0, 1, 2, 3, 5, 7, 9, 11]


@pytest.fixture(scope="module")
def tiny():
    target = tiny_target()
    return target, tiny_data(target, sequences=4, prompt=5, gen=6)


def test_batch_rows_line_up_with_the_teacher(tiny):
    _, data = tiny
    b = batch_arrays(data, np.array([2, 0]), context=2)
    mask = np.array(b["mask"])
    # Prompt of 5 keeps 2 tokens before the first trained position (index 4 -> 2).
    assert mask[0].tolist() == [0, 0, 1, 1, 1, 1, 1, 1]
    rows = np.array(b["teacher_logp"])[0, mask[0] == 1]
    lo = data.offsets[2]
    np.testing.assert_allclose(rows, data.teacher_logp[lo : lo + 6].astype(np.float32))
    assert np.array(b["tokens"])[0].tolist() == data.tokens[2][2:-1].tolist()
    cols = np.array(b["target_cols"])[0, mask[0] == 1]
    argmax = data.teacher_argmax[lo : lo + 6]
    assert all((c == -1) == (a % 2 == 1) for c, a in zip(cols, argmax))  # head = even ids
    assert all(data.vocab_ids[c] == a for c, a in zip(cols, argmax) if c >= 0)


def test_save_load_round_trip(tmp_path, tiny):
    _, data = tiny
    back = DistillSet.load(data.save(tmp_path / "d.npz"))
    assert [t.tolist() for t in back.tokens] == [t.tolist() for t in data.tokens]
    np.testing.assert_array_equal(back.teacher_logp, data.teacher_logp)
    assert back.meta == data.meta


def test_tiny_or_empty_dataset_is_refused(tiny, tmp_path):
    _, data = tiny
    with pytest.raises(MlxspecError, match="at least 64 positions"):
        data.check()
    with pytest.raises(MlxspecError, match="not a distillation set"):
        (tmp_path / "x.npz").write_bytes(b"nope")
        DistillSet.load(tmp_path / "x.npz")
