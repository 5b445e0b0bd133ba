"""Bad model input gets a one-line MlxspecError naming the fix, never a traceback."""

import mlx.core as mx
import pytest

from mlxspec import loading, store
from mlxspec.errors import MlxspecError


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
    (tmp_path / "config.json").write_text('{"model_type": "mamba2"}')
    with pytest.raises(MlxspecError, match=r"unsupported architecture 'mamba2'; supported: llama, mistral"):
        loading.load(str(tmp_path))


def test_unknown_dtype_is_rejected_before_loading():
    with pytest.raises(MlxspecError, match="unknown dtype"):
        loading.load("default", dtype="fp8")
