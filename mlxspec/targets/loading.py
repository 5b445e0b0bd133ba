"""Where a model spec becomes a loaded model: the formats (``gguf_model``, ``families``,
``weights``) and the backend choice meet here.

``load(spec)`` accepts a registry name (``default`` for the embedded target), a ``.gguf`` file,
or an mlx-lm / Hugging Face model folder, and returns a ``LoadedModel``: our ``Llama`` with the
weights in the per-device format, the tokenizer, and what we know about it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx
from mlx.utils import tree_flatten
from mlx_lm.tokenizer_utils import TokenizerWrapper
from mlx_lm.utils import load_tokenizer

from mlxspec.core.model import Llama, LlamaConfig
from mlxspec.errors import MlxspecError, UnsupportedArchitecture
from mlxspec.runtime import resolve_dtype
from mlxspec.targets import mlxlm, store
from mlxspec.targets.costcurve import stderr_line
from mlxspec.targets.families import config_from_mlx_lm, prepare_weights
from mlxspec.targets.gguf_model import load_gguf
from mlxspec.targets.weights import build_model, check_mode
from mlxspec.torchpath import missing_torch_hint, prefer_torch, require_torch, split_backend, torch_may_run


@dataclass
class LoadedModel:
    model: Llama
    tokenizer: TokenizerWrapper
    name: str
    path: Path
    dtype: str
    context_length: int
    backend: str = "mlx"  # or "torch:<device>" (``torchpath.load``)
    source: LoadedModel | None = None  # on torch: the MLX model the weights were copied from

    @property
    def config(self) -> LlamaConfig:
        return self.model.cfg

    def weight_bytes_per_token(self) -> int:
        """Bytes of weights one decoded token reads: everything but the unused embedding rows
        (with tied embeddings the whole matrix is read once, as the LM head)."""
        if self.backend != "mlx":
            sizes = {k: v.numel() * v.element_size() for k, v in self.model.named_parameters()}
            # the file's 4-bit layers (torchpath.int4) hold no parameters: what their kernel reads
            sizes |= {name: m.kernel_bytes for name, m in self.model.named_modules() if hasattr(m, "kernel_bytes")}
            if (head := getattr(self.model, "quantized_head", None)) is not None:  # the head reads the file's bytes
                sizes = {k: n for k, n in sizes.items() if not k.startswith("model.embed_tokens")}
                sizes["head"] = head.kernel_bytes
        else:
            sizes = {k: v.nbytes for k, v in tree_flatten(self.model.parameters())}
        total = sum(sizes.values())
        if not self.config.tie_embeddings:
            total -= sum(n for k, n in sizes.items() if k.startswith("model.embed_tokens"))
        return total


def _quantization(cfg_dict: dict[str, Any], path: Path) -> dict[str, Any] | None:
    q = cfg_dict.get("quantization")
    if q is not None:
        check_mode(q.get("mode", "affine"), str(path))
    return q


def read_config(folder: Path) -> dict[str, Any]:
    """``folder/config.json`` as a dict, or one ``MlxspecError`` saying what is wrong with it."""
    path = Path(folder) / "config.json"
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise MlxspecError(f"cannot read {path}: {e.strerror}") from None
    except ValueError as e:  # not UTF-8, or not JSON
        raise MlxspecError(f"{path} is not valid JSON: {e}") from None
    if not isinstance(obj, dict):
        raise MlxspecError(f"{path} holds a JSON {type(obj).__name__}, not an object")
    return obj


def load_folder(path: Path, dtype: str = "auto") -> tuple[Llama, TokenizerWrapper, int]:
    """An mlx-lm / Hugging Face folder (config.json, *.safetensors, tokenizer files).
    Raises ``UnsupportedArchitecture`` for a model type (or RoPE scaling) we do not implement."""
    cfg_dict = read_config(path)
    cfg = config_from_mlx_lm(cfg_dict)
    quantization = _quantization(cfg_dict, path)
    weights: dict[str, mx.array] = {}
    for f in sorted(path.glob("*.safetensors")):
        weights.update(mx.load(str(f)))
    if not weights:
        raise MlxspecError(f"{path} has no *.safetensors weights")
    cfg, weights, quantization = prepare_weights(cfg, weights, quantization)
    tokenizer = load_tokenizer(path, eos_token_ids=cfg_dict.get("eos_token_id"))
    return build_model(cfg, weights, resolve_dtype(dtype), quantization), tokenizer, cfg.max_position


def resolve(spec: str) -> tuple[str, Path]:
    """A user's model spec -> (display name, local path). No network."""
    if spec in ("default", ""):
        spec = store.default_target()
    e = store.entry(spec)
    if e is not None:
        if not e.present:
            raise MlxspecError(f"model {e.name!r} is not downloaded; run `mlxspec models pull {e.name}`")
        return e.name, e.path
    p = Path(spec).expanduser()
    if p.is_file() or (p.is_dir() and (p / "config.json").is_file()):
        return p.stem if p.is_file() else p.name, p
    if p.is_dir():
        raise MlxspecError(f"{p} is a folder without config.json (not an mlx-lm / HF model)")
    if store.is_hub_id(spec):
        snapshot = store.hub_snapshot(spec)
        if snapshot is None:
            raise MlxspecError(f"{spec} is not in the hub cache; download it once with `mlxspec models pull {spec}`")
        if not (snapshot / "config.json").is_file():
            raise MlxspecError(f"{spec}: the cached snapshot {snapshot} has no config.json (not an mlx-lm / HF model)")
        return spec, snapshot
    raise MlxspecError(
        f"model {spec!r} not found: not a registry name ({', '.join(x.name for x in store.entries())}), "
        "a .gguf file, a model folder or a hub id (org/name) in the hub cache"
    )


def as_loaded(model: Any, dtype: str = "auto") -> Any:
    """``model`` loaded: a spec (a string) is loaded, anything else is taken as a model already
    loaded (a ``LoadedModel``, or a test double with its model and tokenizer)."""
    return load(model, dtype) if isinstance(model, str) else model


def load(spec: str = "default", dtype: str = "auto", backend: str = "mlx") -> LoadedModel:
    """A target or draft model by ``spec``, on ``backend``: "mlx", "torch" / "torch:DEVICE"
    (the same weights copied into torch's llama module; ``torchpath.load``), or "auto"
    (``torchpath.prefer_torch``: torch on a Linux CPU where it is installed, else MLX)."""
    if backend == "auto":
        # where torch will run it (a Linux CPU), read the file's quantized layers as stored: the
        # torch target runs them on its int4 kernel (torchpath.int4), MLX's CPU backend would not
        guess = "quantized" if dtype == "auto" and torch_may_run() else dtype
        if (hint := missing_torch_hint()) is not None:
            stderr_line(hint)
        source = load(spec, guess)
        if source.dtype not in ("float32", "quantized") or not prefer_torch(source.model, dtype):
            return source if guess == dtype else load(spec, dtype)
        from mlxspec.torchpath.load import to_torch

        if source.dtype == "quantized":  # the only layers the kernel multiplies: no build for a float32 target
            with_kernels()
        return with_compiled(to_torch(source, guess, "cpu"))
    if backend != "mlx":
        require_torch()
        from mlxspec.torchpath import pick_device
        from mlxspec.torchpath.load import to_torch, torch_dtype  # imports torch, an optional extra

        device = pick_device(split_backend(backend))
        dtype = torch_dtype(dtype, device)
        if dtype == "quantized":
            with_kernels()
        return with_compiled(to_torch(load(spec, "quantized" if dtype == "quantized" else "float32"), dtype, device))
    dtype = resolve_dtype(dtype)
    name, path = resolve(spec)
    if path.is_dir():
        try:
            model, tok, ctx = load_folder(path, dtype)
        except UnsupportedArchitecture:
            # Not a family we implement: mlx-lm's own class, if it has one, behind the target seam.
            model, tok, ctx = mlxlm.load_folder(path, dtype)
    elif path.suffix == ".gguf" or path.read_bytes()[:4] == b"GGUF":
        model, tok, ctx = load_gguf(path, dtype)
    else:
        raise MlxspecError(f"{path}: unknown model format (expected .gguf or an mlx-lm folder)")
    return LoadedModel(model, tok, name, path, dtype, ctx)


def compiled_folder() -> Path:
    return store.home() / "compiled"


def with_kernels() -> bool:
    """Load the VNNI product kernel for the file's quantized layers (``torchpath.vnni``), built
    into the store the first time; whether this process runs it."""
    from mlxspec.torchpath import vnni

    return vnni.ensure(compiled_folder() / "kernels", stderr_line)


def with_compiled(loaded: LoadedModel) -> LoadedModel:
    """A torch target with its compiled pass where ``models pull`` compiled one for its shapes."""
    from mlxspec.torchpath import compiled

    if loaded.dtype == "quantized":
        try:
            loaded.model.compiled = compiled.load_from(loaded.model, compiled_folder())
        except Exception as e:  # a damaged file: the eager pass decodes as well, slower
            stderr_line(f"note: the compiled pass in {compiled_folder()} did not load ({type(e).__name__}: {e}); "
                        "running eager (`mlxspec models pull` compiles it again)")
    return loaded


def compile_target(spec: str, log: Callable[[str], None]) -> None:
    """Compile ``spec``'s pass into the store (``torchpath.compiled``) where torch runs it quantized
    here; nothing where it already is, or where torch would not run it."""
    if not torch_may_run("quantized"):
        return
    loaded = load(spec, "auto", backend="auto")
    if not loaded.backend.startswith("torch") or loaded.dtype != "quantized":
        return
    from mlxspec.torchpath import compiled

    if loaded.model.compiled is not None or not compiled.supported(loaded.model):
        return
    try:
        folder = compiled.compile_to(loaded.model, compiled_folder(), log)
    except Exception as e:  # no C++ compiler, for one: the eager pass decodes as well, slower
        log(f"note: could not compile {loaded.name}'s pass ({type(e).__name__}: {str(e)[:300]}); it runs eager")
        return
    log(f"compiled {loaded.name}'s pass into {folder}")


def pull(name: str, wheel: Path | None, compile_pass: bool, log: Callable[[str], None]) -> None:
    """``mlxspec models pull``: a registry model into the store, or a hub repository into
    huggingface-hub's cache; then, unless told not to, its compiled pass."""
    if store.entry(name) is None and name != "default" and store.is_hub_id(name) and wheel is None:
        store.hub_pull(name, log=log)
    else:
        store.pull(store.default_target() if name == "default" else name, wheel=wheel, log=log)
    if compile_pass:
        compile_target(name, log)
