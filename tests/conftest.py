import os
import shutil
import tempfile
from pathlib import Path

import pytest

import mlxspec  # noqa: F401  (loads the fast BLAS before anything imports mlx)
from mlxspec.targets import costcurve, store
from mlxspec.training import corpus

_session_home: Path | None = None


def pytest_configure(config: pytest.Config) -> None:
    """Give the test session a store of its own, so no result depends on what earlier runs left
    behind (cost curves, eagle-data shards, study logs) and nothing is written outside a temporary
    folder. The pulled models are linked in, file by file: a test that deletes one removes a link;
    the compiled passes' folder as a whole."""
    global _session_home
    pulled = store.home() / "models"
    _session_home = Path(tempfile.mkdtemp(prefix="mlxspec-test-home-"))
    if pulled.is_dir():
        for src in pulled.rglob("*"):
            dst = _session_home / "models" / src.relative_to(pulled)
            if src.is_dir():
                dst.mkdir(parents=True, exist_ok=True)
            else:
                dst.parent.mkdir(parents=True, exist_ok=True)
                dst.symlink_to(src.resolve())
    if (compiled := store.home() / "compiled").is_dir():  # the default's compiled pass (make setup's), as a user has it
        (_session_home / "compiled").symlink_to(compiled.resolve())
    os.environ["MLXSPEC_HOME"] = str(_session_home)


def pytest_unconfigure(config: pytest.Config) -> None:
    if _session_home is not None:
        shutil.rmtree(_session_home, ignore_errors=True)


@pytest.fixture(scope="session", autouse=True)
def _no_optional_debian_text(tmp_path_factory):
    """A new machine has none of `make draft-data-deps`' packages, so every test sees the corpus
    it would build there; tests of those sources build small fake trees (tests/test_corpus.py)."""
    nowhere = tmp_path_factory.mktemp("not-installed")
    hidden = corpus.PackagePaths(python_doc=nowhere / "doc", wordnet=nowhere / "wordnet",
                                 fortunes=nowhere / "fortunes", man_de=nowhere / "man" / "de",
                                 man_en=nowhere / "man", dpkg_info=None)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(corpus, "system_paths", lambda: hidden)
        yield


@pytest.fixture(scope="session", autouse=True)
def _a_quiet_machine():
    """Cost curves measured in tests are cached whatever else the machine runs meanwhile (a
    busy machine's are not, ``costcurve.BUSY_SHARE``): tests that read the cache back must not
    depend on the load. The rule itself is tested with the shipped threshold and a set meter."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(costcurve, "BUSY_SHARE", 1.0)  # a share is at most 1: every curve is cached
        yield


@pytest.fixture(scope="session", autouse=True)
def _the_machines_kernels():
    """Every test runs the kernels a user's process here runs (``loading.with_kernels`` loads the
    VNNI product kernel where this CPU has VNNI), whichever test loads a model first; tests of
    torch's own int4 kernel set it aside (tests/test_int4.py)."""
    from mlxspec.targets import loading
    from mlxspec.torchpath import torch_may_run

    if torch_may_run("quantized"):
        loading.with_kernels()
    yield


@pytest.fixture(scope="session")
def lm():
    """The real default model (SmolLM2-135M-Instruct), loaded once per test session."""
    from mlxspec.targets import loading

    if not store.entry(store.default_target()).present:
        pytest.fail("default model missing: run `make setup` (or `mlxspec models pull`) first")
    return loading.load("default")


@pytest.fixture(scope="session")
def quick_draft(tmp_path_factory):
    """A draft trained by `mlxspec train-draft --quick --loss wtv --grpo` on the real target
    (about a minute), with the run's JSON summary."""
    import json

    from typer.testing import CliRunner

    from mlxspec.cli import app

    out = tmp_path_factory.mktemp("drafts") / "quick-wtv"
    r = CliRunner().invoke(app, ["train-draft", "--quick", "--loss", "wtv", "--grpo", "--out", str(out), "--json"])
    assert r.exit_code == 0, r.output
    return out, json.loads(r.stdout)
