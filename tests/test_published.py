"""``export-target`` and ``export-draft``'s published layouts: a target written for transformers
gives our logits in transformers' own classes (a GGUF's pair-ordered query and key rows
reordered for its RoPE); the shipped EAGLE-3 head written in the speculators layout keeps
every tensor and drafts exactly as the original; where ``MLXSPEC_SPECULATORS_PYTHON`` names a
Python with speculators installed, speculators itself loads it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import mlx.core as mx
import numpy as np
import pytest
import torch
from helpers import invoke, one_line_error
from tiny import TWIN_BASE
from mlx.utils import tree_flatten

from mlxspec.core.engine import generate
from mlxspec.core.events import Step
from mlxspec.core.model import Llama, LlamaConfig
from mlxspec.core.sampling import SamplingParams
from mlxspec.errors import MlxspecError
from mlxspec.targets.drafts import make_drafter
from mlxspec.targets.export import export_hf_folder

FAMILIES = {
    "llama": {},
    "gguf-rope": dict(rope_traditional=True),  # a GGUF's query and key rows, pair-ordered
    "gguf-rope+bias": dict(rope_traditional=True, qkv_bias=True, tie_embeddings=False),
    "qwen3": dict(qk_norm=True, model_type="qwen3"),
}
STUB_TOKENIZER = SimpleNamespace(eos_token_ids={1}, bos_token_id=None,
                                 _tokenizer=SimpleNamespace(save_pretrained=lambda path: None))


def random_model(**family) -> Llama:
    mx.random.seed(3)
    model = Llama(LlamaConfig(**TWIN_BASE, **family))
    model.load_weights([(k, mx.random.normal(v.shape) * 0.2) for k, v in tree_flatten(model.parameters())])
    mx.eval(model.parameters())
    return model


@pytest.mark.parametrize("family", list(FAMILIES))
def test_a_target_written_for_transformers_gives_our_logits(family, tmp_path):
    from transformers import AutoModelForCausalLM

    model = random_model(**FAMILIES[family])
    folder = export_hf_folder(model, STUB_TOKENIZER, tmp_path / family)
    config = json.loads((folder / "config.json").read_text())
    assert not config["rope_traditional"] and "quantization" not in config
    theirs = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
    ids = [5, 9, 33, 2, 17, 40, 11, 8, 23]
    with torch.no_grad():
        want = theirs(torch.tensor([ids])).logits[0].numpy()
    got = np.array(model(mx.array([ids]), model.make_cache())[0])
    np.testing.assert_allclose(got, want, atol=2e-5, rtol=1e-4)


def test_export_target_refuses_what_transformers_cannot_read(tmp_path):
    factors = random_model(rope_scaling={"rope_type": "freq_factors", "factors": [1.0] * 4})
    with pytest.raises(MlxspecError, match="per-frequency factors"):
        export_hf_folder(factors, STUB_TOKENIZER, tmp_path / "f")
    one_line_error(invoke("export-target", "--dtype", "int8", "--out", str(tmp_path / "x")), "unknown --dtype 'int8'")
    one_line_error(invoke("export-draft", "--format", "onnx", "--out", str(tmp_path / "x")), "unknown --format 'onnx'")


@pytest.mark.model
def test_the_default_target_exported_for_transformers_gives_our_logits(lm, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    r = invoke("export-target", "--out", str(tmp_path / "hf"))
    assert r.exit_code == 0, r.output
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    tok = AutoTokenizer.from_pretrained(str(tmp_path / "hf"))
    ids = list(tok.apply_chat_template(messages, add_generation_prompt=True, return_dict=True)["input_ids"])
    assert ids == list(lm.tokenizer.apply_chat_template(messages, add_generation_prompt=True))
    theirs = AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf"), dtype=torch.float32)
    with torch.no_grad():
        want = theirs(torch.tensor([ids])).logits[0].numpy()
    got = np.array(lm.model(mx.array([ids]), lm.model.make_cache())[0])
    assert np.abs(got - want).max() < 2e-3 and (got.argmax(-1) == want.argmax(-1)).all()


def accepted(events) -> list[int]:
    return [ev.accepted for ev in events if isinstance(ev, Step)]


@pytest.mark.model
def test_the_shipped_eagle3_head_in_the_speculators_layout_keeps_its_tensors_and_drafts(lm, tmp_path):
    from safetensors.numpy import load_file

    from mlxspec.targets import store

    out = tmp_path / "spec"
    r = invoke("export-draft", "-d", "smollm2-135m-eagle3", "--format", "speculators", "--out", str(out))
    assert r.exit_code == 0, r.output
    config = json.loads((out / "config.json").read_text())
    layer = config["transformer_layer_config"]
    assert config["speculators_model_type"] == "eagle3" and config["architectures"] == ["Eagle3Speculator"]
    assert config["eagle_aux_hidden_state_layer_ids"] == [2, 15, 27] and "rope_theta" not in layer
    assert layer["rope_parameters"] == {"rope_theta": 100000.0, "rope_type": "default"}
    assert config["speculators_config"]["verifier"] == {"name_or_path": "HuggingFaceTB/SmolLM2-135M-Instruct",
                                                        "architectures": ["LlamaForCausalLM"]}
    shipped = load_file(str(store.draft_path("smollm2-135m-eagle3") / "model.safetensors"))
    written = load_file(str(out / "model.safetensors"))
    assert written.keys() == {k.replace("midlayer.", "layers.0.") for k in shipped}
    assert all(np.array_equal(written[k.replace("midlayer.", "layers.0.")], v) and
               written[k.replace("midlayer.", "layers.0.")].dtype == v.dtype for k, v in shipped.items())
    prompt = lm.tokenizer.apply_chat_template([{"role": "user", "content": "Name three colours."}],
                                              add_generation_prompt=True)
    runs = [list(generate(lm.model, prompt, SamplingParams(), 40, set(lm.tokenizer.eos_token_ids), 512, 0,
                          make_drafter(spec, lm), 3)) for spec in ("smollm2-135m-eagle3", str(out))]
    assert accepted(runs[0]) == accepted(runs[1])  # the same acceptance, step by step


SPECULATORS_PYTHON = os.environ.get("MLXSPEC_SPECULATORS_PYTHON")


@pytest.mark.model
@pytest.mark.skipif(not SPECULATORS_PYTHON, reason="speculators is not installed here: set MLXSPEC_SPECULATORS_PYTHON "
                    "to a Python that has it (README, \"EAGLE-3 heads\")")
def test_speculators_loads_the_exported_head_with_its_taps(lm, tmp_path):
    assert invoke("export-target", "--out", str(tmp_path / "hf")).exit_code == 0
    r = invoke("export-draft", "-d", "smollm2-135m-eagle3", "--format", "speculators",
               "--verifier", str(tmp_path / "hf"), "--out", str(tmp_path / "spec"))
    assert r.exit_code == 0, r.output
    script = Path(__file__).parent / "speculators_load.py"
    done = subprocess.run([SPECULATORS_PYTHON, str(script), str(tmp_path / "spec")], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["class"] == "Eagle3DraftModel" and seen["unexpected"] == [] and seen["equal"]
    # missing: the shared embedding table (a serving engine takes the target's) and the verifier's
    # own norm and head, which speculators keeps for training and never stores
    assert set(seen["missing"]) <= {"embed_tokens.weight", "verifier_lm_head.weight", "verifier_norm.weight"}
    assert seen["verifier"] == str((tmp_path / "hf").resolve())
    assert seen["taps"] == [2, 15, 27] and seen["rope_theta"] == 100000.0


def test_a_speculators_export_needs_a_verifier_it_can_name(tmp_path):
    """A target with no hub id (a GGUF file the registry does not list) is one line naming
    --verifier; a folder given is named by its absolute path and its own architectures."""
    from mlxspec.targets.eagle3 import verifier_for

    target = SimpleNamespace(name="my.gguf", config=SimpleNamespace(model_type="llama"))
    with pytest.raises(MlxspecError, match="name one with --verifier") as e:
        verifier_for("my.gguf", target)
    assert "\n" not in str(e.value)
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text(json.dumps({"architectures": ["MistralForCausalLM"]}))
    assert verifier_for("my.gguf", target, str(tmp_path / "hf")) == (str((tmp_path / "hf").resolve()),
                                                                    ["MistralForCausalLM"])
    assert verifier_for("my.gguf", target, "org/name") == ("org/name", ["LlamaForCausalLM"])
