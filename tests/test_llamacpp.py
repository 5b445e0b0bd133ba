"""llama.cpp as ``bench``'s peer (``measure/bench/llamacpp.py``): the peer code against a
stand-in for ``llama_cpp.Llama``; the real one where the llama extra is installed."""

import importlib.util
import io
import sys

import mlx.core as mx
import numpy as np
import pytest
from rich.console import Console

from mlxspec.core.sampling import SamplingParams
from mlxspec.errors import MlxspecError
from mlxspec.measure import bench
from mlxspec.measure.bench import llamacpp, speculative
from mlxspec.measure.bench.llamacpp import LlamaCpp, check_same_tokens, llama_cpp_run, open_llama_cpp

EOS = 2


class StandIn:
    """What the peer calls of ``llama_cpp.Llama``: it replays ``reply`` and records each call."""

    version = "stand-in"

    def __init__(self, reply=(5, 6, 7, EOS, 9), spell=None, **kwargs):
        self.kwargs, self.reply, self.spell = kwargs, list(reply), spell or {}
        self.calls = []

    def reset(self):
        self.calls.append("reset")

    def set_seed(self, seed):
        self.calls.append(("seed", seed))

    def detokenize(self, ids, special=False):
        return "".join(self.spell.get(i, f"<{i}>") for i in ids).encode()

    def generate(self, ids, **sampling):
        self.calls.append(("generate", list(ids), sampling))
        yield from self.reply


def peer(**kw):
    return LlamaCpp(StandIn(**kw), "m.gguf", 2, "stand-in")


def test_a_reply_is_counted_as_our_engine_counts_it():
    p = peer()
    run = llama_cpp_run(p, [1, 3], SamplingParams(), 10, {EOS}, seed=4)
    assert (run.tokens, run.stop_reason, run.prompt_tokens) == ([5, 6, 7], "eos", 2)  # EOS ends it, uncounted
    assert run.prefill_s >= 0 and run.decode_s >= 0
    run = llama_cpp_run(p, [1, 3], SamplingParams(), 2, {EOS}, seed=4)
    assert (run.tokens, run.stop_reason) == ([5, 6], "length")


def test_every_run_prefills_the_whole_prompt_at_our_sampling():
    p = peer()
    llama_cpp_run(p, [1, 3], SamplingParams(1.0, top_p=0.9, top_k=5, min_p=0.1), 3, {EOS}, seed=11)
    reset, seed, (_, ids, sampling) = p.llm.calls
    assert reset == "reset" and seed == ("seed", 11) and ids == [1, 3]
    # llama.cpp's own defaults (top-k 40, top-p 0.95, min-p 0.05, T 0.8) never apply
    assert sampling == {"temp": 1.0, "top_k": 5, "top_p": 0.9, "min_p": 0.1, "typical_p": 1.0,
                        "repeat_penalty": 1.0, "reset": True}
    with pytest.raises(MlxspecError, match="penalties"):
        llama_cpp_run(p, [1], SamplingParams(repetition_penalty=1.2), 3, {EOS}, seed=0)


class Spelling:
    def decode(self, ids, skip_special_tokens=True):
        return "".join(f"<{i}>" for i in ids)


def test_the_prompt_tokens_are_checked_not_assumed():
    check_same_tokens(peer(), Spelling(), [[1, 2], [3]])
    with pytest.raises(MlxspecError, match="prompt 2's token ids as other text"):
        check_same_tokens(peer(spell={3: "x"}), Spelling(), [[1, 2], [3]])


def test_the_peer_opens_the_targets_own_gguf_file_with_our_threads(tmp_path, monkeypatch):
    lm = type("LM", (), {"name": "m", "path": tmp_path / "m.gguf", "backend": "mlx"})()
    p = open_llama_cpp(lm, 3, StandIn)
    assert p.llm.kwargs["model_path"] == str(tmp_path / "m.gguf")
    assert p.llm.kwargs["n_threads"] == p.llm.kwargs["n_threads_batch"] == 3 and "3 threads" in p.description
    folder = type("LM", (), {"name": "f", "path": tmp_path, "backend": "mlx"})()
    with pytest.raises(MlxspecError, match="GGUF file"):
        open_llama_cpp(folder, 2, StandIn)
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # as where the extra is not installed
    with pytest.raises(MlxspecError, match="llama extra"):
        open_llama_cpp(lm, 2)


@pytest.mark.model
def test_bench_times_llama_cpp_in_the_same_rounds(lm, monkeypatch):
    """The peer interleaved with our methods: its runs, its column, its verdicts."""
    def stand_in(target, threads):
        class Replaying(StandIn):  # llama.cpp's greedy reply: ours, parting at the sixth token
            def generate(self, ids, **sampling):
                ours = speculative.engine_run(lm, list(ids), SamplingParams(), 6, set()).tokens
                yield from ours[:5] + [ours[5] + 1]
        return LlamaCpp(Replaying(), "m.gguf", threads, "llama.cpp stand-in")

    monkeypatch.setattr(speculative, "open_llama_cpp", stand_in)
    monkeypatch.setattr(speculative, "check_same_tokens", lambda *a: None)
    result = bench.spec_bench(bench.SpecOptions(lm, "ngram:3", k=2, temps=(0.0,), categories=["qa"], per_category=1,
                                                max_tokens=6, warmup=0, repeats=1, with_mlx_lm=False, llama_cpp=True))
    data = result.to_json()
    assert {r["method"] for r in data["runs"]} == {"target", "spec", "llama_cpp"}
    overall = data["results"][0]["overall"]
    assert overall["llama_cpp"]["tps"] > 0 and overall["llama_cpp_common_prefix"] == [5]
    assert data["settings"]["llama_cpp"] == "llama.cpp stand-in"
    texts = [v["text"] for v in data["verdicts"]]
    assert any("mlxspec / llama.cpp plain =" in t for t in texts)
    assert any("equals our target-only one on 0 of 1 runs" in t for t in texts)
    out = io.StringIO()
    bench.print_spec(result, Console(file=out, width=260))
    assert "llama.cpp" in out.getvalue()


@pytest.mark.model
@pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None,
                    reason="llama-cpp-python is not installed (the llama extra: a 10-20 minute source build)")
def test_the_real_llama_cpp_decodes_our_prompt_ids(lm):
    from mlxspec.targets.tokenizer import encode_prompt

    p = open_llama_cpp(lm, 2)
    ids = encode_prompt(lm.tokenizer, "What is the capital of France?")
    check_same_tokens(p, lm.tokenizer, [ids])
    run = llama_cpp_run(p, ids, SamplingParams(), 8, {lm.tokenizer.eos_token_id}, seed=0)
    # the same weights in other arithmetic: its greedy first word is one our target ranks near
    # the top (here "The" and "L" are 0.1 apart), not necessarily our argmax
    logits = np.array(lm.model(mx.array([ids]), None)[0, -1].astype(mx.float32))
    assert 0 < len(run.tokens) <= 8 and run.tokens[0] in np.argsort(-logits)[:5]
