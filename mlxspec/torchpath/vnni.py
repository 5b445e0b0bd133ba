"""The file's 4- and 8-bit layers multiplied as bytes on AVX-512 VNNI (``qmm.cpp``).

torch's int4 kernel multiplies bfloat16 activations by weights it dequantizes to bfloat16 and
has no 8-bit one worth using here; llama.cpp rounds the activations to one byte per value (per
group of 32) and multiplies bytes. ``qmm.cpp`` multiplies bytes on the file's own weights too,
with the activations as two bytes a value (one moved this model's logits by 10%; two are more
exact than torch's kernel), on every thread: the blocks' one-token products at the memory's speed, the head
reading the file's 8-bit embedding (half the bytes of bfloat16) instead of a bfloat16 copy
(benchmarks/notes/2026-12-04-vnni-products.md). Every output is one lane's sum in a fixed order,
so a row has the same bits whatever the rows beside it: verify rows stay the one-token pass's.

The kernel is C++ built once per machine into the store (``ensure``: g++ and torch's headers, the
compiler inductor needs anyway; ~10 s, its two sources side by side) and loaded as a torch operator, so the compiled pass calls
it like any library product. Where it cannot run (no VNNI, no compiler, not Linux) nothing
changes: torch's int4 kernel and the bfloat16 head, as before.
"""

from __future__ import annotations

import hashlib
import os
import platform
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch

# the products, and the compiled pass's attention (``attend.cpp``), which needs AVX-512 only
SOURCES = tuple(Path(__file__).with_name(n) for n in ("qmm.cpp", "attend.cpp"))
GROUP, LANES = 32, 16  # the kernel's: weights per scale, output rows per repacked block
# -fopenmp: without it ATen's parallel_for is a plain loop (the products ran on one of two threads)
FLAGS = ("-O3", "-std=c++20", "-shared", "-fPIC", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq",
         "-mavx512vnni", "-mf16c", "-mfma", "-fopenmp", "-w")
CPU_FLAGS = ("avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni", "f16c", "fma")


def supported() -> bool:
    """Whether this CPU runs the kernel: x86-64 Linux with AVX-512 VNNI."""
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        return False
    try:
        flags = next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags"))
    except (OSError, StopIteration):
        return False
    return set(CPU_FLAGS) <= set(flags.split(":", 1)[1].split())


def active() -> bool:
    """Whether the kernel is loaded in this process (``ensure``): the file's layers pack for it."""
    try:
        torch.ops.mlxspec_vnni.qmm
    except (AttributeError, RuntimeError):
        return False
    return True


def library(folder: Path) -> Path:
    """Where the kernel built from this source for this torch lives in ``folder``."""
    text = f"{torch.__version__}|{FLAGS}|".encode() + b"".join(p.read_bytes() for p in SOURCES)
    return folder / f"qmm-{hashlib.sha256(text).hexdigest()[:16]}.so"


def build_id() -> str:
    """Six hex digits naming this build of the kernels (their sources, flags and torch)."""
    return library(Path()).stem.removeprefix("qmm-")[:6]


def build(folder: Path) -> Path:
    """Compile the kernel into ``folder`` (written aside, then moved in: another process may be
    loading it); earlier builds' files removed. The library."""
    from torch.utils import cpp_extension

    target = library(folder)
    folder.mkdir(parents=True, exist_ok=True)
    includes = [f"-I{p}" for p in cpp_extension.include_paths()]
    libs = [f"-L{p}" for p in cpp_extension.library_paths()] + [f"-Wl,-rpath,{p}" for p in cpp_extension.library_paths()]
    abi = f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}"
    cxx = os.environ.get("CXX", "g++")
    with tempfile.TemporaryDirectory(dir=folder) as work:
        # each source takes ~9 s here (torch's headers): compiled side by side, then linked
        objects = [str(Path(work) / f"{src.stem}.o") for src in SOURCES]
        compiles = [subprocess.Popen([cxx, *FLAGS, abi, *includes, "-c", str(src), "-o", obj], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, text=True) for src, obj in zip(SOURCES, objects)]
        errors = [c.communicate()[1] for c in compiles]
        for c, err in zip(compiles, errors):
            if c.returncode:
                raise subprocess.CalledProcessError(c.returncode, c.args, stderr=err)
        linked = str(Path(work) / target.name)
        subprocess.run([cxx, *FLAGS, *objects, "-o", linked, *libs, "-lc10", "-ltorch", "-ltorch_cpu"], check=True,
                       capture_output=True, text=True)
        os.replace(linked, target)
    for old in folder.glob("qmm-*.so"):
        if old != target:
            old.unlink(missing_ok=True)
    return target


def ensure(folder: Path, log: Callable[[str], None] = lambda _: None) -> bool:
    """Load the kernel, building it into ``folder`` first where this build has none; whether it
    is active. A failed build logs one line and leaves torch's kernels in place."""
    if active():
        return True
    if not supported():
        return False
    path = library(folder)
    if not path.exists():
        log("building the VNNI product kernel for this CPU (once, ~10 s) ...")
        try:
            build(folder)
        except (OSError, subprocess.CalledProcessError) as e:
            detail = getattr(e, "stderr", "") or str(e)
            log(f"note: could not build the VNNI product kernel ({detail.strip()[:300]}); torch's kernels run")
            return False
    try:
        torch.ops.load_library(str(path))
    except (OSError, RuntimeError) as e:  # a damaged file: the next build replaces it
        path.unlink(missing_ok=True)
        log(f"note: the VNNI product kernel in {path} did not load ({str(e)[:200]}); torch's kernels run")
        return False
    torch.library.register_fake("mlxspec_vnni::qmm")(_shape)
    torch.library.register_fake("mlxspec_vnni::attend")(lambda q, *_: torch.empty_like(q))
    return True


def _shape(x: torch.Tensor, w: torch.Tensor, sz: torch.Tensor, bits: int) -> torch.Tensor:
    return x.new_empty((x.shape[0], w.shape[0] * LANES))


def repack(q: torch.Tensor, scales: torch.Tensor, biases: torch.Tensor,
           bits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernel's operands for ``W = scale * q + bias``: q (N, K) integers in 0..2**bits - 1,
    scales and biases (N, K / group) for groups of 32 or a multiple of it (float16 must hold
    them exactly, as it does the file's). Rows are padded to a multiple of 16 with zeros."""
    n, k = q.shape
    per = k // scales.shape[1] // GROUP  # a group of 64 is two of 32 with one scale
    scales, biases = scales.repeat_interleave(per, dim=1), biases.repeat_interleave(per, dim=1)
    pad = -n % LANES
    q, scales, biases = (torch.nn.functional.pad(t, (0, 0, 0, pad)) for t in (q, scales, biases))
    blocks, groups = (n + pad) // LANES, k // GROUP
    q = q.to(torch.uint8).view(blocks, LANES, groups, GROUP)
    if bits == 4:
        q = q[..., :16] | (q[..., 16:] << 4)  # weight j low, weight j + 16 high
    w = q.reshape(blocks, LANES, groups, -1, 4).permute(0, 2, 3, 1, 4).reshape(blocks, groups, -1)
    sz = torch.stack([scales, biases]).view(2, blocks, LANES, groups).transpose(2, 3)
    return w.contiguous(), sz.to(torch.float16).contiguous()


def product(x: torch.Tensor, w: torch.Tensor, sz: torch.Tensor, bits: int, n: int | None = None) -> torch.Tensor:
    """``x @ W.T`` in float32 for ``repack``'s operands, x (..., K); the first ``n`` columns
    (None: all, the rows were whole blocks)."""
    rows = x.reshape(-1, x.shape[-1]).float().contiguous()
    out = torch.ops.mlxspec_vnni.qmm(rows, w, sz, bits)
    if n is not None and out.shape[-1] != n:
        out = out[:, :n]
    return out.reshape(*x.shape[:-1], out.shape[-1])
