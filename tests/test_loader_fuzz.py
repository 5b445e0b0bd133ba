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


def eagle3_folders(out: Path) -> tuple[Path, Path]:
    """A random EAGLE-3 head for the default target in the published layout, as
    ``model.safetensors`` and as ``pytorch_model.bin`` (SafeAILab's)."""
    import mlx.core as mx
    import torch

    from mlxspec.core.drafters.eagle3 import Eagle3Config, Eagle3Head, default_aux_layers
    from mlxspec.targets.eagle3 import save_eagle3

    cfg = Eagle3Config(hidden_size=576, intermediate_size=256, num_heads=9, num_kv_heads=3, draft_vocab=256,
                       target_vocab=49152, target_hidden=576, aux_layers=default_aux_layers(30))
    head = Eagle3Head(cfg, mx.arange(0, 512, 2), embed=lambda t: t)  # the target's table is attached at load
    st = save_eagle3(head, out / "eagle3-st")
    pt = out / "eagle3-bin"
    shutil.copytree(st, pt)
    weights = mx.load(str(pt / "model.safetensors"))
    torch.save({k: torch.from_numpy(__import__("numpy").array(v.astype(mx.float32) if v.dtype == mx.float16 else v))
                for k, v in weights.items()}, pt / "pytorch_model.bin")
    (pt / "model.safetensors").unlink()
    return st, pt


def damaged_bins(src: Path, out: Path, rng: random.Random) -> list[str]:
    """An EAGLE-3 folder's ``pytorch_model.bin`` (a zip torch.load reads with weights_only)
    cut short or with bytes changed."""
    data = (src / "pytorch_model.bin").read_bytes()
    cases = []
    for i in range(6):
        d = out / f"{src.name}-bin{i}"
        shutil.copytree(src, d)
        damaged = bytearray(data[: rng.randrange(0, len(data))] if i < 2 else data)
        if i >= 2:
            flip(damaged, rng, 0, len(damaged), rng.randint(1, 20))
        (d / "pytorch_model.bin").write_bytes(bytes(damaged))
        cases.append(f"head {d}")
    return cases


@pytest.mark.model
def test_damaged_model_files_are_one_line_errors(tmp_path):
    gguf = store.entry(store.default_target()).path
    rng = random.Random(7)
    cases = (damaged_ggufs(gguf, tmp_path, rng)
             + damaged_folders(MODELS / "smollm2-135m-eagle", "head.safetensors", "head", tmp_path, rng)
             + damaged_folders(MODELS / "smollm2-135m-draft", "draft.safetensors", "draft", tmp_path, rng))
    st, pt = eagle3_folders(tmp_path)
    intact = len(cases)
    cases += [f"head {st}", f"head {pt}"]  # undamaged: these load
    cases += damaged_folders(st, "model.safetensors", "num_hidden_layers", tmp_path, rng)
    cases += damaged_bins(pt, tmp_path, rng)
    run = subprocess.run([sys.executable, "-c", CHILD], input="\n".join(cases), capture_output=True, text=True,
                         timeout=600)
    lines = run.stdout.splitlines()
    assert run.returncode == 0, f"the child died ({run.returncode}) at case {len(lines)}: {cases[len(lines)]}\n" \
                                f"{run.stderr[-2000:]}"
    assert len(lines) == len(cases)
    bad = [f"{case}: {line}" for case, line in zip(cases, lines) if not line.startswith(("ok", "error: "))]
    assert not bad, "\n".join(bad)
    assert lines[intact : intact + 2] == ["ok", "ok"], lines[intact : intact + 2]
    assert sum(line.startswith("error: ") for line in lines) >= len(cases) // 2  # the damage was seen
