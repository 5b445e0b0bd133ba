"""Hub repository ids resolve through huggingface-hub's own cache, offline."""

import json

import huggingface_hub.constants
import pytest

from mlxspec.errors import MlxspecError
from mlxspec.targets import loading, store


def fake_hub_cache(root, repo_id: str, files: dict[str, str]):
    """The layout huggingface-hub writes: models--org--name/{refs/main, snapshots/<rev>/...}."""
    repo = root / ("models--" + repo_id.replace("/", "--"))
    rev = "0123456789abcdef0123456789abcdef01234567"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(rev)
    snap = repo / "snapshots" / rev
    snap.mkdir(parents=True)
    for name, text in files.items():
        (snap / name).write_text(text)
    return snap


@pytest.fixture
def hub(tmp_path, monkeypatch):
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return tmp_path


@pytest.mark.parametrize("spec, ok", [("mlx-community/Qwen2.5-0.5B-Instruct-4bit", True), ("org/name", True),
                                      ("a/b/c", False), ("/abs", False), ("noslash", False), ("org/.hidden", False)])
def test_hub_id_shape(spec, ok):
    assert store.is_hub_id(spec) is ok


def test_cached_repo_resolves_to_its_snapshot(hub):
    snap = fake_hub_cache(hub, "mlx-community/tiny-llama", {"config.json": json.dumps({"model_type": "llama"})})
    assert loading.resolve("mlx-community/tiny-llama") == ("mlx-community/tiny-llama", snap)


def test_uncached_repo_names_the_pull_command(hub):
    with pytest.raises(MlxspecError, match=r"not in the hub cache; download it once with `mlxspec models pull org/x`"):
        loading.resolve("org/x")


def test_cached_repo_without_config_is_refused(hub):
    fake_hub_cache(hub, "org/weights-only", {"README.md": "no config"})
    # README.md is not among the files mlxspec asks the cache for, so the snapshot looks empty
    with pytest.raises(MlxspecError, match="org/weights-only"):
        loading.resolve("org/weights-only")


def test_pull_offline_is_one_line(hub):
    with pytest.raises(MlxspecError, match=r"^org/x: download failed"):
        store.hub_pull("org/x", log=lambda s: None)


def test_a_local_folder_wins_over_a_hub_id(tmp_path, monkeypatch):
    (tmp_path / "org" / "name").mkdir(parents=True)
    (tmp_path / "org" / "name" / "config.json").write_text("{}")
    monkeypatch.chdir(tmp_path)
    name, path = loading.resolve("org/name")
    assert (name, path.resolve()) == ("name", tmp_path / "org" / "name")
