"""The built wheel, installed in a fresh venv (not editable), runs: the registry and the shipped
drafts travel as package data. Dependencies come from pip's cache where it has them."""

import json
import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run(*cmd, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kw)


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """bin/ of a fresh venv with the project's wheel installed."""
    tmp = tmp_path_factory.mktemp("wheel")
    # Build from a copy: setuptools writes build/ and *.egg-info next to the sources it builds.
    src = tmp / "src"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(".venv", ".git", "build", "*.egg-info", "out",
                                                             ".pytest_cache", ".hypothesis", "__pycache__",
                                                             "checkpoint", "benchmarks", "docs"))
    built = run(sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", tmp / "dist", src)
    assert built.returncode == 0, built.stderr
    wheel = next((tmp / "dist").glob("mlxspec-*.whl"))
    venv.create(tmp / "venv", with_pip=True)
    bin_ = tmp / "venv" / "bin"
    got = run(bin_ / "python", "-m", "pip", "install", "-q", wheel)
    assert got.returncode == 0, got.stderr[-2000:]
    return bin_


@pytest.mark.model
def test_wheel_lists_models_with_their_shipped_drafts(installed):
    r = run(installed / "mlxspec", "models", "list", "--json", cwd="/")
    assert r.returncode == 0, r.stderr
    rows = {m["name"]: m for m in json.loads(r.stdout)["models"]}
    for draft in ("smollm2-135m-draft", "smollm2-135m-eagle", "smollm2-135m-eagle3"):
        assert rows[draft]["present"], rows[draft]
        assert "site-packages" in rows[draft]["path"]  # from the installed package, not this checkout


@pytest.mark.model
def test_wheel_generates_with_a_shipped_draft(installed):
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
    r = run(installed / "mlxspec", "generate", "Say hi.", "--max-tokens", "8", "--temp", "0",
            "-d", "smollm2-135m-eagle", "-k", "2", "--json", cwd="/", env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    lines = [json.loads(x) for x in r.stdout.splitlines()]
    assert lines[-1]["summary"]["generated_tokens"] == 8 and lines[-1]["draft"] == "smollm2-135m-eagle"
    assert sum("token" in x for x in lines) >= 8


@pytest.mark.model
def test_the_wheel_carries_the_licence_and_the_cards_name_theirs(installed):
    site = next((installed.parent / "lib").glob("python*/site-packages"))
    licence = next(site.glob("mlxspec-*.dist-info/licenses/LICENSE")).read_text()
    assert "Apache License" in licence and "Version 2.0, January 2004" in licence
    for draft in ("smollm2-135m-draft", "smollm2-135m-eagle", "smollm2-135m-eagle3"):
        assert "Licence: Apache-2.0" in (site / "mlxspec" / "models" / draft / "README.md").read_text()


@pytest.mark.model
def test_the_wheel_carries_the_kernels_source(installed):
    """A machine with VNNI builds the product and attention kernels from the installed sources."""
    site = next((installed.parent / "lib").glob("python*/site-packages"))
    assert "qmm(Tensor x" in (site / "mlxspec" / "torchpath" / "qmm.cpp").read_text()
    assert "attend(Tensor q" in (site / "mlxspec" / "torchpath" / "attend.cpp").read_text()
