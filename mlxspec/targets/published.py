"""What ``export-draft`` and ``export-target`` write: our drafts, heads and targets in the layouts
other tools load (mlx-lm, SpecForge/SGLang, speculators/vLLM, transformers). Each returns the
folder written and a line saying what it is."""

from __future__ import annotations

from pathlib import Path

from mlxspec.errors import MlxspecError
from mlxspec.targets.eagle3 import LAYOUTS, export_eagle3, refuse_eagle3_export, verifier_for
from mlxspec.targets.export import export_hf_folder
from mlxspec.targets.folders import export_mlx_lm, resolve_draft
from mlxspec.targets.loading import load
from mlxspec.targets.mlxlm import require_native
from mlxspec.targets.weights import FLOAT_DTYPES

DRAFT_FORMATS = ("mlx-lm", *LAYOUTS)


def write_draft(draft: str, model: str, out: Path, layout: str = "mlx-lm", verifier: str | None = None) -> str:
    """A trained draft model as a standalone mlx-lm folder, or an EAGLE-3 head in ``layout``."""
    if layout not in DRAFT_FORMATS:
        raise MlxspecError(f"unknown --format {layout!r}; choose one of: {', '.join(DRAFT_FORMATS)}")
    if layout == "mlx-lm":
        refuse_eagle3_export(draft)  # before the target loads: nothing to convert
    target = load(model, "float32")
    if layout != "mlx-lm":
        named = verifier_for(model, target, verifier)
        path = export_eagle3(draft, target, out, layout, named)
        return f"wrote {path} (EAGLE-3 head, {layout} layout, verifier {named[0]})"
    require_native(target, "export-draft")
    path = export_mlx_lm(resolve_draft(draft, target), target, out)
    return f"wrote {path} (mlx-lm llama folder; try: mlx_lm.generate --model <target> --draft-model {path})"


def write_target(model: str, out: Path, dtype: str = "float32") -> str:
    """The target as a Hugging Face folder (transformers, vLLM), a GGUF's weights dequantized."""
    if dtype not in FLOAT_DTYPES:
        raise MlxspecError(f"unknown --dtype {dtype!r} for export-target; choose one of: {', '.join(FLOAT_DTYPES)}")
    target = load(model, "float32")
    require_native(target, "export-target")
    path = export_hf_folder(target.model, target.tokenizer, out, dtype)
    return (f"wrote {path} (Hugging Face folder, {dtype}; transformers and vLLM load it, and "
            f"`export-draft --format speculators --verifier {path}` names it in a head)")
