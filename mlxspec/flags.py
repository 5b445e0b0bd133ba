"""The command line's shared flags, spelled once, and the checks made on them before anything
loads. One meaning per flag in every command: -m is --model, -d --draft, -k the draft length K
(a list of them where a command sweeps Ks), -t --temp, -n --max-tokens, -o --out, -f
--prompt-file, -p --prompt.

The checks import the core and the loaders inside: those load MLX and mlx-lm (which loads torch
where it is installed), and ``mlxspec --help`` or a refused flag must not wait for them."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Optional

import typer

from mlxspec.errors import MlxspecError
from mlxspec.targets import store
from mlxspec.torchpath import backend_spec

ModelOpt = typer.Option("default", "--model", "-m", help="Registry name, .gguf file, mlx-lm folder or hub id (org/name, from the hub cache). -m is --model in every mlxspec command (mlx-lm uses -m for --max-tokens; here that is -n).")
DraftOpt = typer.Option("default", "--draft", "--draft-model", "-d", help="Drafter: default (the registry's choice for the target: ngram:3+smollm2-135m-eagle for the default model, ngram:3 for a target it does not list), none, ngram[:N] (prompt lookup), suffix[:N] (an index of the session's own text), self:L (target's first L layers), A+B (a cascade: lookup A where the text so far has a match, else B, e.g. ngram:3+smollm2-135m-eagle), an eagle head, a trained draft folder or a draft model path.")
KOpt = typer.Option(None, "--k", "--num-draft-tokens", "-k", show_default=False, help="Draft tokens per step: auto (the default: chosen every step from this machine's verify-cost curve and the acceptance so far; 0 when drafting cannot pay) or 1..64.")
SystemOpt = typer.Option(None, "--system-prompt", help="A system message before the user's (chat template).")
KFixedOpt = typer.Option(4, "--k", "--num-draft-tokens", "-k", help="Draft tokens per step (1..64).")
RemeasureOpt = typer.Option(False, "--remeasure-cost", help="--k auto: measure this machine's verify-cost curve for the model again (cached in $MLXSPEC_HOME/costcurves).")
TreeOpt = typer.Option(None, "--tree", show_default=False, help="Draft a token tree instead of a chain: DxB, depth D, each node's top-B children (e.g. 3x2); DxB:sample, B children drawn from the draft at T > 0 and verified by multi-round rejection; or auto (grown by draft probability, as many nodes verified as this machine's verify-cost curve says pay); verified in one target pass, exact at any temperature.")
TreeNodesOpt = typer.Option(None, "--tree-nodes", show_default=False, help="Cap the --tree at N nodes, breadth first (1..64; default: the whole tree, 16 for auto).")
DtypeOpt = typer.Option("auto", help="Weights: auto (as the file stores them where that runs fast: on the GPU, and on a Linux CPU through torch's int4 kernel with bfloat16 products; float32 on MLX's CPU backend), float32, float16, bfloat16, quantized.")
BackendOpt = typer.Option("auto", "--backend", help="auto, mlx, or torch: the same engine on PyTorch (needs the torch extra of mlxspec; llama-type models). auto: torch on a Linux or Windows CPU where it is installed and runs the model (the file's 4-bit layers on its int4 kernel: about 2.8x MLX's CPU backend there), MLX otherwise and always on Apple silicon.")
DeviceOpt = typer.Option(None, "--device", show_default=False, help="With --backend torch: cpu, cuda or mps (default: the best this machine has).")

TempOpt = typer.Option(0.0, "--temp", "-t", help="Sampling temperature; 0 is greedy.")
TopPOpt = typer.Option(1.0, "--top-p", help="Nucleus sampling mass in (0, 1].")
TopKOpt = typer.Option(0, "--top-k", help="Keep the k most likely tokens (0 = off).")
MinPOpt = typer.Option(0.0, "--min-p", help="Drop tokens below min-p x the top probability.")
# The logits processors (mlx-lm's definitions; each position judged after its own prefix, so exact
# under speculation too). Presence and frequency look back 20 tokens, as mlx-lm's defaults.
RepetitionOpt = typer.Option(1.0, "--repetition-penalty", help="mlx-lm's repetition penalty: a token among the last --repetition-context-size has its logit divided by this (multiplied when negative); 1 = off.")
RepetitionContextOpt = typer.Option(20, "--repetition-context-size", help="How many recent tokens (prompt included) the repetition penalty looks at.")
PresenceOpt = typer.Option(0.0, "--presence-penalty", help="OpenAI's presence penalty in [-2, 2]: subtracted from the logit of each token among the last 20.")
FrequencyOpt = typer.Option(0.0, "--frequency-penalty", help="OpenAI's frequency penalty in [-2, 2]: subtracted from a token's logit once per time it occurs among the last 20.")
LogitBiasOpt = typer.Option(None, "--logit-bias", show_default=False, metavar="ID=BIAS", help="ID=BIAS: add BIAS (-100..100) to token ID's logit; repeat for more tokens.")


def k_option(k: Optional[str], draft: str) -> int | str | None:
    """``--k`` checked before anything loads: an int, ``"auto"``, or None when not given (auto
    with a drafter); ``--k auto`` with ``--draft none`` is refused, as nothing would be drafted."""
    from mlxspec.core.autok import parse_k_option

    if k is None:
        return None
    spec = parse_k_option(k)
    if spec == "auto" and draft in ("none", ""):
        raise MlxspecError("--k auto needs a drafter, but --draft is none (drop --k, or pick a drafter "
                           "such as --draft default or ngram:3)")
    return spec


def tree_option(tree: Optional[str], tree_nodes: Optional[int], k: Optional[str], draft: str) -> Any:
    """``--tree`` / ``--tree-nodes`` checked before anything loads: a ``TreeShape`` or None."""
    from mlxspec.core.tree import parse_tree

    if tree is None:
        if tree_nodes is not None:
            raise MlxspecError("--tree-nodes caps a --tree; give --tree DxB too")
        return None
    shape = parse_tree(tree, tree_nodes)
    if draft in ("none", ""):
        raise MlxspecError("--tree needs a drafter, but --draft is none (try --draft self:8)")
    if k is not None:
        raise MlxspecError("give --k or --tree, not both: a tree's depth is its K")
    return shape


def sampling_params(temp: float, top_p: float, top_k: int = 0, min_p: float = 0.0, repetition_penalty: float = 1.0,
                    repetition_context_size: int = 20, presence_penalty: float = 0.0, frequency_penalty: float = 0.0,
                    logit_bias: Optional[list[str]] = None) -> Any:
    """The sampling flags as a checked ``SamplingParams``: a bad value is one error line before
    anything loads (a bias for a token past the vocabulary is refused once the model is known)."""
    from mlxspec.core.sampling import SamplingParams

    return SamplingParams(temp, top_p, top_k, min_p, repetition_penalty=repetition_penalty,
                          repetition_context_size=repetition_context_size, presence_penalty=presence_penalty,
                          frequency_penalty=frequency_penalty, logit_bias=parse_logit_bias(logit_bias or []))


def parse_logit_bias(items: list[str]) -> tuple[tuple[int, float], ...]:
    """``--logit-bias ID=BIAS`` values as (id, bias) pairs."""
    out = []
    for item in items:
        tok, sep, bias = item.partition("=")
        try:
            if not sep:
                raise ValueError
            out.append((int(tok), float(bias)))
        except ValueError:
            raise MlxspecError(f"bad --logit-bias {item!r}: expected ID=BIAS, e.g. 1234=-5") from None
    return tuple(out)
SIZE_UNITS = {"": 1, "K": 10**3, "KB": 10**3, "M": 10**6, "MB": 10**6, "G": 10**9, "GB": 10**9}  # mlx-lm's, and K


def parse_size(text: str, flag: str) -> int:
    """Bytes from ``2G``, ``512MB``, ``1.5G`` or a plain number (decimal units, as mlx-lm's
    ``--prompt-cache-bytes``)."""
    t = text.strip().upper()
    digits = t.rstrip("KMGB")
    try:
        value = float(digits) * SIZE_UNITS[t[len(digits):]]
    except (ValueError, KeyError):
        raise MlxspecError(f"{flag} takes a size such as 2G, 512M or 1000000, got {text!r}") from None
    if not 0 <= value < float("inf"):
        raise MlxspecError(f"{flag} must be >= 0, got {text!r}")
    return int(value)


def check_max_tokens(max_tokens: int) -> None:
    if max_tokens <= 0:
        raise MlxspecError(f"--max-tokens must be > 0, got {max_tokens}")


def read_prompt(prompt: Optional[str], prompt_file: Optional[Path], prompt_opt: Optional[str] = None) -> str:
    """The one prompt of PROMPT, ``--prompt`` or ``--prompt-file`` (``-`` is stdin), as text."""
    if prompt_opt is not None:  # mlx-lm's spelling, --prompt/-p
        if prompt is not None or prompt_file is not None:
            raise MlxspecError("give one prompt: PROMPT, --prompt or --prompt-file")
        prompt = prompt_opt
    if prompt_file is not None:
        if prompt is not None:
            raise MlxspecError("give a prompt or --prompt-file, not both")
        return nonempty(read_prompt_file(prompt_file), f"prompt file {prompt_file}")
    if prompt is None:
        raise MlxspecError("no prompt: pass PROMPT or --prompt-file FILE")
    return nonempty(prompt)


def nonempty(text: str, where: str = "the prompt") -> str:
    """``text`` unless it is empty or only white space: then there is nothing to answer."""
    if not text.strip():
        raise MlxspecError(f"{where} is empty" + (" (only white space)" if text else ""))
    return text


def read_prompt_file(prompt_file: Path) -> str:
    try:
        data = (sys.stdin.buffer.read() if str(prompt_file) == "-" else prompt_file.read_bytes())
    except OSError as e:
        raise MlxspecError(f"cannot read prompt file {prompt_file}: {e.strerror}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise MlxspecError(
            f"prompt file {prompt_file} is not UTF-8 (byte 0x{data[e.start]:02x} at offset {e.start})"
        ) from None


def with_system(text: str, system: Optional[str]) -> str | list[dict]:
    """The user message, with a system message before it when one is given."""
    if system is None:
        return text
    return [{"role": "system", "content": system}, {"role": "user", "content": text}]


def checked_draft(draft: str) -> str:
    """``--draft`` refused here, before a model loads or a screen opens, when it names no drafter."""
    from mlxspec.targets.drafts import check_draft_spec  # loads MLX: only once a command runs

    check_draft_spec(draft)
    return draft


def named_draft(draft: str, target: str) -> str:
    """``default`` as the drafter it stands for, so screens show a real name; a spec that names
    no drafter is refused here, before a model loads or a screen opens."""
    from mlxspec.targets.drafts import DEFAULT_FALLBACK
    from mlxspec.targets.loading import resolve

    if draft != "default":
        return checked_draft(draft)
    return store.default_draft(resolve(target)[0]) or DEFAULT_FALLBACK


def measured_target(model: str, dtype: str, backend: str, device: Optional[str]) -> Any:
    """``--model`` as the measurements take it: the spec on MLX (they load it themselves),
    the model already loaded on torch."""
    spec = backend_spec(backend, device)
    if spec == "mlx":
        return model
    from mlxspec.targets import loading

    return loading.load(model, dtype, spec)
