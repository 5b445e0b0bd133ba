import pytest

import mlxspec  # noqa: F401  (loads the fast BLAS before anything imports mlx)


@pytest.fixture(scope="session")
def lm():
    """The real default model (SmolLM2-135M-Instruct), loaded once per test session."""
    from mlxspec.targets import loading, store

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
