"""The command line's shared flags, spelled once, and the checks made on them before anything
loads. One meaning per flag in every command: -m is --model, -d --draft, -k the draft length K
(a list of them where a command sweeps Ks), -t --temp, -n --max-tokens, -o --out, -f
--prompt-file, -p --prompt.

The checks import the core and the loaders inside: those load MLX and mlx-lm (which loads torch
where it is installed), and ``mlxspec --help`` or a refused flag must not wait for them."""

from __future__ import annotations

import functools
import inspect
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Optional

import typer

from mlxspec.errors import MlxspecError
from mlxspec.targets import store
from mlxspec.terminal import Output
from mlxspec.torchpath import backend_spec

ModelOpt = typer.Option("default", "--model", "-m", help="Registry name, .gguf file, mlx-lm folder or hub id (org/name, from the hub cache). -m is --model in every mlxspec command (mlx-lm uses -m for --max-tokens; here that is -n).")
DraftOpt = typer.Option("default", "--draft", "--draft-model", "-d", help="Drafter: default (the registry's choice for the target: for the default model ngram:3 on a CPU under torch, where its eagle head's step costs a third of a target pass, ngram:3+smollm2-135m-eagle on MLX and GPUs; ngram:3 for a target it does not list), none, ngram[:N] (prompt lookup), suffix[:N] (an index of the session's own text), self:L (target's first L layers), A+B (a cascade: lookup A where the text so far has a match, else B, e.g. ngram:3+smollm2-135m-eagle), a trained draft, an eagle head, an EAGLE-3 head, or a draft model (a .gguf file, model folder or cached hub id).")
KOpt = typer.Option(None, "--k", "--num-draft-tokens", "-k", show_default=False, help="Draft tokens per step: auto (the default: chosen every step from this machine's verify-cost curve and the acceptance so far; 0 when drafting cannot pay) or 1..64.")


def _print_version(asked: bool) -> None:
    """``--version``: this package's version and the libraries' that decide its numbers."""
    from importlib.metadata import PackageNotFoundError, version

    if not asked:
        return
    parts = []
    for name in ("mlxspec", "mlx", "mlx-lm", "torch", "llama-cpp-python"):
        try:
            parts.append(f"{name} {version(name)}")
        except PackageNotFoundError:
            parts.append(f"{name} not installed")
    print(parts[0] + " (" + ", ".join(parts[1:]) + ")")
    raise typer.Exit()


VersionOpt = typer.Option(False, "--version", is_eager=True, callback=_print_version,
                          help="Print mlxspec's version and its libraries' (MLX, mlx-lm, torch, llama.cpp), then exit.")
SystemOpt = typer.Option(None, "--system-prompt", help="A system message before the user's (chat template).")
KFixedOpt = typer.Option(4, "--k", "--num-draft-tokens", "-k", help="Draft tokens per step (1..64).")
RemeasureOpt = typer.Option(False, "--remeasure-cost", help="--k auto: measure this machine's verify-cost curve for the model again (cached in $MLXSPEC_HOME/costcurves).")
TreeOpt = typer.Option(None, "--tree", show_default=False, help="Draft a token tree instead of a chain: DxB, depth D, each node's top-B children (e.g. 3x2); DxB:sample, B children drawn from the draft at T > 0 and verified by multi-round rejection; or auto (grown by draft probability, as many nodes verified as this machine's verify-cost curve says pay); verified in one target pass, exact at any temperature.")
TreeNodesOpt = typer.Option(None, "--tree-nodes", show_default=False, help="Cap the --tree at N nodes, breadth first (1..64; default: the whole tree, 16 for auto).")
DtypeOpt = typer.Option("auto", help="Weights: auto (as the file stores them where that runs fast: on the GPU, and on a Linux CPU through torch's int4 kernel with bfloat16 products; float32 on MLX's CPU backend), float32, float16, bfloat16, quantized.")
BackendOpt = typer.Option("auto", "--backend", help="auto, mlx, or torch: the same engine on PyTorch (needs the torch extra of mlxspec; llama-type models). auto: torch on a Linux or Windows CPU where it is installed and runs the model (the file's 4-bit layers on its int4 kernel: about 2.8x MLX's CPU backend there), MLX otherwise and always on Apple silicon.")
DeviceOpt = typer.Option(None, "--device", show_default=False, help="With --backend torch: cpu, cuda or mps (default: the best this machine has).")

CoupledOpt = typer.Option(False, "--coupled", help="At T > 0, draw each token from noise keyed by --seed and its position (Gumbel-max): the reply is target-only sampling's for that seed, whatever the drafter and K. Drafts take the same noise on the drafter's q and are kept where they hit the target's draw: a few fewer than rejection sampling keeps (0.29 vs 0.36 of first drafts at T=1 held out).")
BlockVerifyOpt = typer.Option(False, "--block-verify", help="At T > 0, judge a chain the drafter sampled as a block (Sun et al., arXiv 2403.10444) rather than token by token: as exact, never fewer drafts kept on average; the same rule for lookup's drafts and for trees.")
# The logits processors (mlx-lm's definitions; each position judged after its own prefix, so exact
# under speculation too). Presence and frequency look back 20 tokens, as mlx-lm's defaults.
RepetitionOpt = typer.Option(1.0, "--repetition-penalty", help="mlx-lm's repetition penalty: a token among the last --repetition-context-size has its logit divided by this (multiplied when negative); 1 = off.")
RepetitionContextOpt = typer.Option(20, "--repetition-context-size", help="How many recent tokens (prompt included) the repetition penalty looks at.")
PresenceOpt = typer.Option(0.0, "--presence-penalty", help="OpenAI's presence penalty in [-2, 2]: subtracted from the logit of each token among the last 20.")
FrequencyOpt = typer.Option(0.0, "--frequency-penalty", help="OpenAI's frequency penalty in [-2, 2]: subtracted from a token's logit once per time it occurs among the last 20.")
LogitBiasOpt = typer.Option(None, "--logit-bias", show_default=False, metavar="ID=BIAS", help="ID=BIAS: add BIAS (-100..100) to token ID's logit; repeat for more tokens.")



@dataclass(frozen=True)
class FlagGroup:
    """Flags several commands take together, declared once: (parameter, type, typer option)
    each, and ``make``, which turns their values into the one value a command receives."""

    flags: tuple[tuple[str, Any, Any], ...]
    make: Callable[..., Any]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(name for name, _, _ in self.flags)


def grouped(command: Callable) -> Callable:
    """A command some of whose parameters default to a ``FlagGroup``: Typer sees each group's
    flags in that parameter's place, and the command gets the value the group makes of them."""
    signature = inspect.signature(command, eval_str=True)
    groups = {p.name: p.default for p in signature.parameters.values() if isinstance(p.default, FlagGroup)}
    params = []
    for p in signature.parameters.values():
        if p.name in groups:
            params += [inspect.Parameter(n, p.POSITIONAL_OR_KEYWORD, default=opt, annotation=t)
                       for n, t, opt in groups[p.name].flags]
        else:
            params.append(p)

    @functools.wraps(command)
    def wrapper(**kwargs: Any) -> Any:
        for name, group in groups.items():
            kwargs[name] = group.make(**{n: kwargs.pop(n) for n in group.names})
        return command(**kwargs)

    wrapper.__signature__ = signature.replace(parameters=params)  # type: ignore[attr-defined]
    wrapper.__annotations__ = {p.name: p.annotation for p in params}
    return wrapper

def k_option(k: Optional[str], draft: str) -> int | str | None:
    """``--k`` checked before anything loads: an int, ``"auto"``, or None when not given (auto
    with a drafter); ``--k auto`` with ``--draft none`` is refused, as nothing would be drafted."""
    from mlxspec.core.autok import NEEDS_DRAFTER, parse_k_option

    if k is None:
        return None
    spec = parse_k_option(k)
    if spec == "auto" and draft in ("none", ""):
        raise MlxspecError(NEEDS_DRAFTER)
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


def sampling_params(temp: float, top_p: float, top_k: int = 0, min_p: float = 0.0, coupled: bool = False,
                    block_verify: bool = False, repetition_penalty: float = 1.0, repetition_context_size: int = 20, presence_penalty: float = 0.0,
                    frequency_penalty: float = 0.0, logit_bias: Optional[list[str]] = None) -> Any:
    """The sampling flags as a checked ``SamplingParams``: a bad value is one error line before
    anything loads (a bias for a token past the vocabulary is refused once the model is known)."""
    from mlxspec.core.sampling import SamplingParams

    return SamplingParams(temp, top_p, top_k, min_p, coupled=coupled, block_verify=block_verify,
                          repetition_penalty=repetition_penalty,
                          repetition_context_size=repetition_context_size, presence_penalty=presence_penalty,
                          frequency_penalty=frequency_penalty, logit_bias=parse_logit_bias(logit_bias or []))



@dataclass(frozen=True)
class SamplingChoice:
    """The sampling flags as given, temperature and filters None where the model's recommended
    value stands (``targets.sampling_defaults.model_sampling``); ``processors``: the penalties,
    logit bias and coupling, checked."""

    temp: Optional[float]
    top_p: Optional[float]
    top_k: Optional[int]
    min_p: Optional[float]
    processors: Any

    @property
    def asked(self) -> bool:
        """Whether any control beyond temperature and the filters was given (a penalty, a bias,
        coupling, block verification)."""
        from mlxspec.core.sampling import SamplingParams

        return self.processors != SamplingParams()

    def for_model(self, model: str) -> tuple[Any, str]:
        """The ``SamplingParams`` for ``model``, and a line saying where each setting came from."""
        from mlxspec.targets.sampling_defaults import model_sampling

        return model_sampling(model, self.temp, self.top_p, self.top_k, self.min_p, self.processors)


def _sampling_choice(temp: Optional[float] = None, top_p: Optional[float] = None, top_k: Optional[int] = None,
                     min_p: Optional[float] = None, coupled: bool = False, block_verify: bool = False,
                     **penalties: Any) -> SamplingChoice:
    """The flags checked before anything loads (each given value's range, as ``SamplingParams``
    checks it), the model's defaults filled in later."""
    neutral = sampling_params(0.0 if temp is None else temp, 1.0 if top_p is None else top_p, top_k or 0, min_p or 0.0,
                              coupled, block_verify, **penalties)
    return SamplingChoice(temp, top_p, top_k, min_p, replace(neutral, temperature=0.0, top_p=1.0, top_k=0, min_p=0.0))


_PENALTY_FLAGS = (("repetition_penalty", float, RepetitionOpt), ("repetition_context_size", int, RepetitionContextOpt),
                  ("presence_penalty", float, PresenceOpt), ("frequency_penalty", float, FrequencyOpt),
                  ("logit_bias", Optional[list[str]], LogitBiasOpt))
# Every sampling flag, temperature and filters defaulting to the model's recommended values (generate, serve).
ModelTempOpt = typer.Option(None, "--temp", "-t", show_default=False, help="Sampling temperature; 0 is greedy. Default, as for --top-p, --top-k and --min-p: the model's recommended setting (the registry's, or its generation_config.json), else greedy.")
MODEL_SAMPLING = FlagGroup((
    ("temp", Optional[float], ModelTempOpt),
    ("top_p", Optional[float], typer.Option(None, "--top-p", show_default=False, help="Nucleus sampling mass in (0, 1].")),
    ("top_k", Optional[int], typer.Option(None, "--top-k", show_default=False, help="Keep the k most likely tokens (0 = off).")),
    ("min_p", Optional[float], typer.Option(None, "--min-p", show_default=False, help="Drop tokens below min-p x the top probability.")),
    ("coupled", bool, CoupledOpt), ("block_verify", bool, BlockVerifyOpt), *_PENALTY_FLAGS), _sampling_choice)
# --backend and --device as one backend spec ("mlx", "torch:cpu", ...).
BACKEND = FlagGroup((("backend", str, BackendOpt), ("device", Optional[str], DeviceOpt)), backend_spec)
OUTPUT = FlagGroup((("as_json", bool, typer.Option(False, "--json", help="Print the result as one JSON object to stdout instead of the tables.")),
                    ("out", Optional[Path], typer.Option(None, "--out", "-o", help="Write the result as JSON to this file."))),
                   Output)

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
    """The one prompt of PROMPT, ``--prompt`` or ``--prompt-file``, as text; ``-`` for any of
    them reads stdin (mlx-lm's ``--prompt -``)."""
    if prompt_opt is not None:  # mlx-lm's spelling, --prompt/-p
        if prompt is not None or prompt_file is not None:
            raise MlxspecError("give one prompt: PROMPT, --prompt or --prompt-file")
        prompt = prompt_opt
    if prompt == "-" and prompt_file is None:
        prompt, prompt_file = None, Path("-")
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


def named_draft(draft: str, target: str, backend: str = "mlx", dtype: str = "auto") -> str:
    """``default`` as the drafter it stands for on the backend the target will run on (the
    registry may choose per backend), so screens show a real name; a spec that names no drafter
    is refused here, before a model loads or a screen opens."""
    from mlxspec.targets.drafts import DEFAULT_FALLBACK
    from mlxspec.targets.loading import resolve
    from mlxspec.torchpath import pick_device, torch_may_run

    if draft != "default":
        return checked_draft(draft)
    if backend == "auto":  # a llama target (all the registry lists) takes torch wherever it may
        backend = "torch:cpu" if torch_may_run(dtype) else "mlx"
    elif backend == "torch":
        backend = f"torch:{pick_device(None)}"
    return store.default_draft(resolve(target)[0], backend) or DEFAULT_FALLBACK


def measured_target(model: str, dtype: str, spec: str) -> Any:
    """``--model`` as the measurements take it: the spec on MLX (they load it themselves),
    the model already loaded on torch (``spec``: a ``backend_spec``)."""
    if spec == "mlx":
        return model
    from mlxspec.targets import loading

    return loading.load(model, dtype, spec)


def train_options(**values: Any) -> Any:
    """``train-draft``'s flags as the ``TrainOptions`` record its pipeline takes (one field a flag)."""
    from mlxspec.training.run import TrainOptions

    return TrainOptions(**values)


# train-draft's flags: each a ``training.run.TrainOptions`` field of the same name.
TRAIN = FlagGroup((
    ("out", Path, typer.Option(..., "--out", "-o", help="Folder for the draft (weights, config, model card, checkpoint).")),
    ("model", str, ModelOpt),
    ("loss", str, typer.Option("wtv", "--loss", help="kl (forward KL), eal (greedy expected accepted length) or wtv (window total variation at --temp).")),
    ("grpo", bool, typer.Option(False, "--grpo", help="Add a GRPO stage after distillation (reward: simulated accepted length).")),
    ("grpo_steps", int, typer.Option(60, help="GRPO steps when --grpo is set.")),
    ("grpo_group", int, typer.Option(8, help="GRPO: drafts sampled per context (G).")),
    ("grpo_reward", str, typer.Option("auto", help="GRPO reward: greedy, sampling, or auto (greedy for eal, sampling otherwise).")),
    ("layers", int, typer.Option(2, help="Draft blocks (1-4).")),
    ("hidden", Optional[int], typer.Option(None, help="Draft hidden size (default: the target's; another size needs --init random).")),
    ("head_vocab", int, typer.Option(8192, help=("Rows of the reduced-vocabulary head (most frequent tokens of the data). For the eagle "
                                         "head 16384 tied 8192 held out at T=1 and lost at the chat's sampling "
                                         "(benchmarks/notes/2026-12-06-head-vocabulary.md)."))),
    ("init", str, typer.Option("target", help="target (copy the target's first blocks, norm and head rows) or random.")),
    ("window", int, typer.Option(5, "--window", help="Window K of draft positions the objective covers.")),
    ("temp", float, typer.Option(1.0, "--temp", "-t", help="Temperature of p and q in kl and wtv.")),
    ("min_p", float, typer.Option(0.0, "--min-p", help="eagle, eagle3, --loss wtv: the teacher filtered as the sampler keeps tokens (those of at least min-p x the top probability, renormalised), e.g. -t 1 --min-p 0.1 for the chat's sampling; the KL warm start reads it whole.")),
    ("fit_top", int, typer.Option(0, "--fit-top", help="eagle, eagle3, --loss eal or wtv: train acceptance only where the target's top token is among the head's N largest (GRIFFIN's mask: a token the head cannot fit spends no capacity); 0: everywhere.")),
    ("steps", int, typer.Option(400, help="Distillation steps.")),
    ("batch", int, typer.Option(8, help="Sequences per step.")),
    ("lr", Optional[float], typer.Option(None, help="Peak learning rate (warm-up, then cosine decay); default 6e-4 for --arch eagle, 3e-4 otherwise.")),
    ("prompts", int, typer.Option(320, help="Training prompts (distillation data is built once and cached).")),
    ("max_new_tokens", int, typer.Option(96, help="Target-generated tokens per training prompt.")),
    ("data", Optional[Path], typer.Option(None, "--data", help="Distillation set (.npz): used if present, else built and saved there.")),
    ("resume", bool, typer.Option(False, "--resume", help="Continue from the checkpoint in --out.")),
    ("checkpoint_every", int, typer.Option(100, help="Steps between checkpoints.")),
    ("seed", int, typer.Option(0, help="Seed for data, initialisation, batch order and GRPO sampling.")),
    ("quick", bool, typer.Option(False, "--quick", help="CI-sized run (~1-2 minutes): 12 prompts, 1 layer, 1024-token head, 40 steps.")),
    ("arch", str, typer.Option("draft", "--arch", help="draft (llama blocks on the target's embeddings), eagle (one block reading the target's hidden states; see --examples-per-category) or eagle3 (an EAGLE-3 head on three of the target's layers, written in the published format vLLM and SGLang load; no feature regression).")),
    ("examples_per_category", int, typer.Option(300, help="eagle: corpus examples per category (11 categories; see mlxspec/training/SOURCES.md).")),
    ("max_examples", Optional[int], typer.Option(None, help="eagle: use only the first N corpus examples (categories interleaved).")),
    ("target_written", int, typer.Option(0, help="eagle: also train on the target's own answers (half greedy, half T=1) to the first N corpus prompts: the text it drafts along. Past the corpus's size, a second answer to each prompt in the other regime (up to twice the prompts). Generated once and cached; fastest with --backend torch.")),
    ("feature_weight", float, typer.Option(0.5, help="eagle: weight of the feature regression beside the token loss.")),
    ("context", int, typer.Option(192, help="eagle: slots per training window.")),
    ("backend", str, typer.Option("mlx", "--backend", help="eagle, eagle3: where the target's features are built and the head trains: mlx, or torch (the same weights on PyTorch, needs the torch extra; on this CPU features 6-8x and training ~2.5x faster). The head is saved in MLX's format either way.")),
    ("device", Optional[str], DeviceOpt),
    ("aux_layers", Optional[str], typer.Option(None, "--aux-layers", help="eagle3: the target blocks whose input the head reads, comma-separated (its config's eagle_aux_hidden_state_layer_ids; L, the layer count, is the last block's output); default 2, L/2, L-3, as vLLM and SGLang tap.")),
    ("zero_layers", Optional[str], typer.Option(None, "--zero-layers", help="eagle3, for ablations: of --aux-layers, those the head is trained without (their states zeroed, their fc columns kept at zero), e.g. --aux-layers 2,15,27,30 --zero-layers 2,15,27 reads the last layer only, from the same cached features as --zero-layers 30. Where two or more taps are left, the head is written with those taps alone (the same function: the dropped fc columns are zero).")),
    ("share_embeddings", bool, typer.Option(False, "--share-embeddings", help="eagle3: write the head without the target's embedding table (mlxspec, vLLM and SGLang then take the target's own); a head shipped in a wheel stays small. By default the table is stored, as published heads do.")),
    ("format", str, typer.Option("specforge", "--format", help="eagle3: the layout written: specforge (SafeAILab's and SpecForge's, which vLLM and SGLang load) or speculators (vLLM's speculators library, and vLLM).")),
    ("verifier", Optional[str], typer.Option(None, "--verifier", show_default=False, help="eagle3 --format speculators: the target's hub id or Hugging Face folder named in the head (default: the registry model's hub id).")),
), train_options)


def bench_checks(max_tokens: int, warmup: int, repeats: int, busy: int, baseline: bool, against: Optional[str]
                 ) -> Optional[str]:
    """``bench``'s counts and modes checked before anything loads; ``--against`` checked as a drafter."""
    check_max_tokens(max_tokens)
    if repeats < 1 or warmup < 0:
        raise MlxspecError("--repeats must be >= 1 and --warmup >= 0")
    if not 0 <= busy <= (os.cpu_count() or 1):
        raise MlxspecError(f"--busy must be in 0..{os.cpu_count() or 1} (the cores here), got {busy}")
    if baseline and against is not None:
        raise MlxspecError("--against compares two drafters; --baseline times target-only decoding")
    return None if against is None else checked_draft(against)


def sweep_trees(temp: float, top_p: float, trees: Optional[str], tree_nodes: Optional[int], tui: bool) -> list:
    """``sweep``'s sampling and tree flags checked before anything loads; the tree shapes to time."""
    from mlxspec.core.sampling import SamplingParams
    from mlxspec.core.tree import parse_tree_list

    SamplingParams(temp, top_p)
    if trees is None and tree_nodes is not None:
        raise MlxspecError("--tree-nodes caps the --tree shapes; give --tree too")
    shapes = parse_tree_list(trees, tree_nodes) if trees is not None else []
    if shapes and tui:
        raise MlxspecError("the sweep UI shows Ks only; drop --tui to time --tree shapes")
    return shapes


def logprobs_option(logprobs: Optional[int], as_json: bool) -> Optional[int]:
    """``generate --logprobs N``: only with --json, N within what the engine reports."""
    from mlxspec.core.sampling import MAX_TOP_LOGPROBS

    if logprobs is not None and not as_json:
        raise MlxspecError("--logprobs goes with --json (each token's object carries them)")
    if logprobs is not None and not 0 <= logprobs <= MAX_TOP_LOGPROBS:
        raise MlxspecError(f"--logprobs must be in 0..{MAX_TOP_LOGPROBS}, got {logprobs}")
    return logprobs


def parity_dtype(dtype: str, device: Optional[str]) -> str:
    """``parity --dtype`` checked for the torch ``device`` it will run on (which it returns)."""
    from mlxspec.torchpath import pick_device, require_torch

    require_torch()
    device = pick_device(device)
    from mlxspec.torchpath.load import torch_dtype  # imports torch, an optional extra

    if dtype == "quantized":
        raise MlxspecError("parity compares torch with its MLX source in float or half precision; --dtype quantized "
                           "runs the file's 4-bit weights with bfloat16 products, another target (choose auto, "
                           "float32, float16 or bfloat16)")
    torch_dtype(dtype, device)
    return device


def _access(api_key: Optional[str] = None, allowed_origins: Optional[list[str]] = None) -> Any:
    """The server's key and CORS origins as one ``serve.access.Access``."""
    from mlxspec.serve.access import Access, parse_origins

    if api_key is None and os.environ.get("MLXSPEC_API_KEY") is not None:
        api_key = os.environ["MLXSPEC_API_KEY"]  # click reads a variable set to "" as unset: a server left open
    if api_key is not None and not api_key.strip():
        raise MlxspecError("--api-key is empty (MLXSPEC_API_KEY set to nothing?): give a key, or leave it unset")
    return Access(api_key, parse_origins(allowed_origins))


# Who may call ``serve``.
ACCESS = FlagGroup((
    ("api_key", Optional[str], typer.Option(None, "--api-key", envvar="MLXSPEC_API_KEY", show_default=False, help="Require `Authorization: Bearer KEY` on every route but /health (401 otherwise); also read from MLXSPEC_API_KEY. Without it anyone who can reach the port may use the server.")),
    ("allowed_origins", Optional[list[str]], typer.Option(None, "--allowed-origins", show_default=False, help="Browser origins whose pages may call the server (CORS), e.g. http://localhost:3000; repeat or comma-separate; * for any. Default: none.")),
), _access)


def serve_checks(max_tokens: int, port: int) -> None:
    check_max_tokens(max_tokens)
    if not 0 <= port <= 65535:
        raise MlxspecError(f"--port must be in 0..65535 (0: any free port), got {port}")


def _capacity(prompt_cache_size: int = 10, prompt_cache_bytes: str = "2G", parallel: Optional[int] = None) -> Any:
    """What the server holds at once, checked, as ``serve.requests.Capacity``."""
    from mlxspec.serve.requests import MAX_PARALLEL, Capacity

    if prompt_cache_size < 1:
        raise MlxspecError(f"--prompt-cache-size must be >= 1, got {prompt_cache_size}")
    if parallel is not None and not 1 <= parallel <= MAX_PARALLEL:
        raise MlxspecError(f"--parallel must be in 1..{MAX_PARALLEL}, got {parallel}")
    return Capacity(prompt_cache_size, parse_size(prompt_cache_bytes, "--prompt-cache-bytes"), parallel)


# What ``serve`` holds at once: requests decoding, conversations kept.
CAPACITY = FlagGroup((
    ("parallel", Optional[int], typer.Option(None, "--parallel", show_default=False, help="Requests decoded together, their target passes packed into one (each reply the one it gets alone; torch backend only). Default: 8 on torch, where 8 clients finish in about 0.4x the time of one after another, 4 in 0.5x; 1 on MLX.")),
    ("prompt_cache_size", int, typer.Option(10, "--prompt-cache-size", help="Conversations whose caches are kept between requests, least recently used dropped first (clients taking turns each find theirs).")),
    ("prompt_cache_bytes", str, typer.Option("2G", "--prompt-cache-bytes", help="Memory those caches may hold at most: bytes, or with M or G (decimal units).")),
), _capacity)


def torch_flags(torch_on: Optional[bool], torch_dtypes: Optional[list[str]], torch_device: str,
                torch_threads: Optional[list[int]]) -> Any:
    from mlxspec.measure.bench import TorchFlags

    return TorchFlags(torch_on, tuple(torch_dtypes or ()), torch_device, tuple(torch_threads or ()))


# bench --baseline's torch columns.
TORCH = FlagGroup((
    ("torch_on", Optional[bool], typer.Option(None, "--torch/--no-torch", help="With --baseline: also time mlxspec on PyTorch, one column per --torch-dtype (default: on when torch is installed).")),
    ("torch_dtypes", Optional[list[str]], typer.Option(None, "--torch-dtype", help="With --baseline: torch dtypes timed beside float32 (repeatable; default: the device's own, on a CPU quantized: the file's 4-bit weights on torch's int4 kernel).")),
    ("torch_device", str, typer.Option("cpu", "--torch-device", help="With --baseline: the torch device (cpu, cuda, mps).")),
    ("torch_threads", Optional[list[int]], typer.Option(None, "--torch-threads", help="With --baseline: torch CPU threads (default: torch's own); repeat to time one column per setting in the same run.")),
), torch_flags)
