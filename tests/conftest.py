import mlxspec  # noqa: F401  (loads the fast BLAS before anything imports mlx)

import pytest


@pytest.fixture(scope="session")
def lm():
    """The real default model (SmolLM2-135M-Instruct), loaded once per test session."""
    from mlxspec import loading, store

    if not store.entry(store.default_target()).present:
        pytest.fail("default model missing: run `make setup` (or `mlxspec models pull`) first")
    return loading.load("default")
