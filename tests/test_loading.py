"""Bad model input gets a one-line MlxspecError naming the fix, never a traceback."""

import re

import mlx.core as mx
import pytest

from mlxspec.errors import MlxspecError
from mlxspec.targets import export, loading, store, tokenizer


def test_missing_registry_model_names_the_pull_command(tmp_path, monkeypatch):
    monkeypatch.setenv("MLXSPEC_HOME", str(tmp_path))
    with pytest.raises(MlxspecError, match=r"not downloaded; run `mlxspec models pull smollm2-135m-instruct`"):
        loading.load("default")


def test_unknown_spec(tmp_path):
    with pytest.raises(MlxspecError, match="not found: not a registry name"):
        loading.load(str(tmp_path / "nope.gguf"))


def test_folder_without_config(tmp_path):
    with pytest.raises(MlxspecError, match="without config.json"):
        loading.load(str(tmp_path))


def test_garbage_gguf(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"this is not a gguf file at all" * 10)
    with pytest.raises(MlxspecError, match="cannot read GGUF file .*corrupt or truncated"):
        loading.load(str(bad))


@pytest.mark.model
def test_truncated_gguf(tmp_path):
    real = store.entry(store.default_target()).path
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(real.read_bytes()[: 5_000_000])
    with pytest.raises(MlxspecError, match="cannot read GGUF file .*corrupt or truncated"):
        loading.load(str(cut))


def test_unsupported_architecture(tmp_path):
    path = tmp_path / "mamba.gguf"
    mx.save_gguf(str(path), {"w": mx.zeros((4,))}, {"general.architecture": "mamba"})
    with pytest.raises(MlxspecError, match=r"unsupported architecture 'mamba'; supported: llama"):
        loading.load(str(path))


def test_unsupported_mlx_lm_type(tmp_path):
    # A type mlx-lm lacks too: the ones it has load through its own class (test_mlxlm_target).
    (tmp_path / "config.json").write_text('{"model_type": "no_such_arch"}')
    with pytest.raises(MlxspecError, match=r"unsupported architecture 'no_such_arch'; supported: llama, mistral"):
        loading.load(str(tmp_path))


def test_unknown_dtype_is_rejected_before_loading():
    with pytest.raises(MlxspecError, match="unknown dtype"):
        loading.load("default", dtype="fp8")


@pytest.fixture(scope="module")
def gguf_meta():
    _, meta = mx.load(str(store.entry(store.default_target()).path), return_metadata=True)
    return meta


@pytest.mark.model
def test_same_tokenizer_is_compatible(gguf_meta):
    """Two tokenizers built apart from one model's metadata: the same content, so the check
    returns (None) in either order instead of raising. The vocabularies compared are the model's
    whole table, not two empty ones that would pass any check."""
    from mlxspec.targets.tokenizer import tokenizer_from_gguf

    target, draft = tokenizer_from_gguf(gguf_meta), tokenizer_from_gguf(gguf_meta)
    tokens = list(gguf_meta["tokenizer.ggml.tokens"])
    assert target is not draft and len(tokens) > 1000
    assert target._tokenizer.get_vocab() == draft._tokenizer.get_vocab()
    assert len(target._tokenizer.get_vocab()) == len(tokens)
    assert tokenizer.check_compatible(target, draft) is None
    assert tokenizer.check_compatible(draft, target) is None


@pytest.mark.model
def test_a_draft_tokenizer_with_one_more_token_is_incompatible(gguf_meta):
    from mlxspec.targets.tokenizer import tokenizer_from_gguf

    tokens = list(gguf_meta["tokenizer.ggml.tokens"])
    longer = tokenizer_from_gguf({**gguf_meta, "tokenizer.ggml.tokens": tokens + ["<|extra|>"]})
    n = len(tokens)
    with pytest.raises(MlxspecError, match=rf"differ at id {n}: target None, draft '<\|extra\|>' \({n} vs {n + 1} tokens\)"):
        tokenizer.check_compatible(tokenizer_from_gguf(gguf_meta), longer)


@pytest.mark.model
def test_incompatible_tokenizer_names_the_first_differing_token(gguf_meta):
    from mlxspec.targets.tokenizer import tokenizer_from_gguf

    tokens = list(gguf_meta["tokenizer.ggml.tokens"])
    tokens[1000], tokens[1001] = tokens[1001], tokens[1000]
    other = tokenizer_from_gguf({**gguf_meta, "tokenizer.ggml.tokens": tokens})
    first = re.escape(repr(gguf_meta["tokenizer.ggml.tokens"][1000]))
    with pytest.raises(MlxspecError, match=rf"tokenizers differ at id 1000: target {first}, draft '.+'"):
        tokenizer.check_compatible(tokenizer_from_gguf(gguf_meta), other)


@pytest.mark.model
def test_cli_rejects_an_incompatible_draft(gguf_meta, lm, tmp_path):
    """A real draft folder whose tokenizer differs: one line, naming the token."""
    from typer.testing import CliRunner

    from mlxspec.cli import app
    from mlxspec.targets.tokenizer import tokenizer_from_gguf

    tokens = list(gguf_meta["tokenizer.ggml.tokens"])
    tokens[5], tokens[6] = tokens[6], tokens[5]
    other = tokenizer_from_gguf({**gguf_meta, "tokenizer.ggml.tokens": tokens})
    folder = export.export_folder(lm.model, other, tmp_path / "draft")
    r = CliRunner().invoke(app, ["generate", "hi", "--draft", str(folder), "-n", "2"])
    assert r.exit_code == 2 and "tokenizers differ at id 5" in r.output and "Traceback" not in r.output


def test_padded_draft_vocabulary_is_aligned_to_the_target():
    from mlxspec.core.verify import pad_vocab

    q = mx.array([[0.5, 0.5, 0.0]])
    assert pad_vocab(q, 5).tolist() == [[0.5, 0.5, 0.0, 0.0, 0.0]]
    assert pad_vocab(q, 2).tolist() == [[0.5, 0.5]]
    assert pad_vocab(None, 4) is None
