"""Damaged model files are one-line errors, never a crash or a traceback: the real GGUF with bytes
of its header and metadata changed or cut short, and the shipped draft's and eagle head's folders
with their config and safetensors damaged. Each load runs in a child process, so a crash is seen,
not suffered."""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mlxspec.targets import store

MODELS = Path(__file__).resolve().parents[1] / "mlxspec" / "models"

# In the child: load each case and print one line per case, "ok", "error: ..." (an MlxspecError,
# what the CLI shows) or "TRACEBACK ..." (anything else).
CHILD = """
import sys
import mlxspec
from mlxspec.errors import MlxspecError
from mlxspec.targets import loading
from mlxspec.targets.drafts import make_drafter


def patched(path, flips):
    # write the flipped bytes, return what to write back
    with open(path, "r+b") as f:
        old = []
        for at, byte in flips:
            f.seek(at)
            old.append((at, f.read(1)[0]))
            f.seek(at)
            f.write(bytes([byte]))
    return old


target = None
for line in sys.stdin.read().splitlines():
    kind, path, *rest = line.split(" ")
    undo = patched(path, [tuple(map(int, x.split("="))) for x in rest]) if rest else []
    try:
        if kind == "gguf":
            loading.load(path)
        else:
            target = target or loading.load("default")
            make_drafter(path, target)
        print("ok", flush=True)
    except MlxspecError as e:
        print("error:", str(e).replace("\\n", " "), flush=True)
    except Exception as e:
        print("TRACEBACK", type(e).__name__, str(e)[:200].replace("\\n", " "), flush=True)
    finally:
        if undo:
            patched(path, undo)
"""

def flip(data: bytearray, rng: random.Random, lo: int, hi: int, n: int) -> None:
    """``n`` random bytes of ``data[lo:hi]`` set to random values."""
    for _ in range(n):
        data[rng.randrange(lo, min(hi, len(data)))] = rng.randrange(256)


def damaged_ggufs(src: Path, out: Path, rng: random.Random) -> list[str]:
    """Cases as the child reads them: the whole file with bytes of its header, metadata or
    tensor table changed (the child writes them, loads, and writes the old bytes back), and
    the file cut short at a few places."""
    full = out / "model.gguf"
    shutil.copyfile(src, full)
    cases = []
    for lo, hi in [(0, 24), (24, 4096), (4096, 1 << 16), (1 << 16, 1 << 20)] * 3:
        flips = " ".join(f"{rng.randrange(lo, hi)}={rng.randrange(256)}" for _ in range(rng.randint(1, 6)))
        cases.append(f"gguf {full} {flips}")
    head = src.read_bytes()[: 1 << 20]
    for n in (0, 3, 100, 5000, 1 << 20):
        cut = out / f"cut{n}.gguf"
        cut.write_bytes(head[:n])
        cases.append(f"gguf {cut}")
    return cases


def damaged_folders(src: Path, weights_file: str, section: str, out: Path, rng: random.Random) -> list[str]:
    """A shipped draft or head folder with its config.json or its safetensors damaged."""
    config = json.loads((src / "config.json").read_text())
    weights = (src / weights_file).read_bytes()
    header = int.from_bytes(weights[:8], "little")
    configs = ['{"hidden_size": 5', "[]", json.dumps({**config, section: "big"}), json.dumps({**config, section: []}),
               json.dumps({k: v for k, v in config.items() if k != "format"}), "\udcff".encode("utf-8", "surrogateescape")
               .decode("latin-1")]
    cases = []
    for i, text in enumerate(configs):
        d = out / f"{src.name}-config{i}"
        shutil.copytree(src, d)
        (d / "config.json").write_text(text)
        cases.append(f"head {d}")
    for i in range(6):
        data = bytearray(weights)
        if i < 2:
            data = data[: rng.randrange(8, 8 + header)]  # cut inside the header
        else:
            flip(data, rng, 0, 8 + header, rng.randint(1, 6))
        d = out / f"{src.name}-weights{i}"
        shutil.copytree(src, d)
        (d / weights_file).write_bytes(bytes(data))
        cases.append(f"head {d}")
    return cases


@pytest.mark.model
def test_damaged_model_files_are_one_line_errors(tmp_path):
    gguf = store.entry(store.default_target()).path
    rng = random.Random(7)
    cases = (damaged_ggufs(gguf, tmp_path, rng)
             + damaged_folders(MODELS / "smollm2-135m-eagle", "head.safetensors", "head", tmp_path, rng)
             + damaged_folders(MODELS / "smollm2-135m-draft", "draft.safetensors", "draft", tmp_path, rng))
    run = subprocess.run([sys.executable, "-c", CHILD], input="\n".join(cases), capture_output=True, text=True,
                         timeout=600)
    lines = run.stdout.splitlines()
    assert run.returncode == 0, f"the child died ({run.returncode}) at case {len(lines)}: {cases[len(lines)]}\n" \
                                f"{run.stderr[-2000:]}"
    assert len(lines) == len(cases)
    bad = [f"{case}: {line}" for case, line in zip(cases, lines) if not line.startswith(("ok", "error: "))]
    assert not bad, "\n".join(bad)
    assert sum(line.startswith("error: ") for line in lines) >= len(cases) // 2  # the damage was seen
