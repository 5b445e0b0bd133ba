"""What every command of the command line shares on the terminal: the stderr console, an
``MlxspecError`` as one line and exit status 2, one progress bar, and the two result outputs.

One meaning per option across commands: ``--json`` prints JSON to stdout (human text goes to
stderr, so the two can be piped apart); ``--out PATH`` writes a result file or folder."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeRemainingColumn

from mlxspec.errors import MlxspecError

err = Console(stderr=True, highlight=False, soft_wrap=True)


def friendly(fn: Callable) -> Callable:
    """Turn an MlxspecError into one line on stderr and exit status 2."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except MlxspecError as e:
            err.print(f"[bold red]error:[/] {escape(str(e))}")  # a message may hold brackets ('mlxspec[torch]')
            raise typer.Exit(2) from None

    return wrapper


@dataclass
class ProgressLine:
    """One live bar's task. Called as ``progress(done, total, label)``, as every measurement
    reports; ``report`` takes a long run's ``training.run.Report`` instead."""

    bar: Progress
    task: TaskID
    done: int = 0

    def __call__(self, done: int, total: Optional[int], label: str) -> None:
        self.bar.update(self.task, completed=done, total=total, description=label)

    def report(self, r: Any) -> None:
        """A ``Report``: a new stage starts from zero; on a log (not a terminal) its log lines
        are printed too, since a bar there is one unreadable line."""
        if r.done < self.done:
            self.bar.reset(self.task)
        self.done = r.done
        self(r.done, r.total, r.stage)
        if r.log and not err.is_terminal:
            err.print(r.log)


@contextmanager
def progress_bar(label: str = "") -> Iterator[ProgressLine]:
    """A transient bar on stderr for the length of the block: the one progress display of
    every command."""
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeRemainingColumn(), console=err, transient=True) as bar:
        yield ProgressLine(bar, bar.add_task(label, total=None))


def print_json(result: dict) -> None:
    """``--json``: the result as one JSON document on stdout."""
    print(json.dumps(result, indent=2))


@dataclass(frozen=True)
class Output:
    """Where a measurement's result goes: ``--json`` (stdout, instead of the tables) and ``--out``."""

    as_json: bool = False
    out: Optional[Path] = None

    def __post_init__(self) -> None:  # refused before a long run, not after it
        if self.out is not None and self.out.is_dir():
            raise MlxspecError(f"--out {self.out} is a folder; give a file")

    def emit(self, result: dict, render: Callable[[Console], None]) -> None:
        """The result as JSON on stdout, or rendered for a person; then written to ``--out``."""
        if self.as_json:
            print_json(result)
        else:
            render(Console())
        write_json(result, self.out)


def write_json(result: dict, path: Optional[Path]) -> None:
    """``--out PATH``: the result as a JSON file (nothing when no path was given)."""
    if path is not None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(result, indent=2))
        except OSError as e:
            raise MlxspecError(f"cannot write {path}: {e.strerror}") from None
        err.print(f"[dim]wrote {path}[/]")


def write_text(text: str, path: Path) -> None:
    """``text`` to ``path`` whole (a partial file never stands), its folder made."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(path)
    except OSError as e:
        raise MlxspecError(f"cannot write {path}: {e.strerror}") from None
    err.print(f"[dim]wrote {path}[/]")


def check_out_folder(out: Path) -> None:
    """Refuse a ``--out`` folder that is a file now, before minutes of work, not after."""
    if out.exists() and not out.is_dir():
        raise MlxspecError(f"--out {out} is a file; give a folder")


def models_table(rows: list[dict], home: Path) -> Table:
    """``models list``: the registry's models and whether each is in the store at ``home``."""
    table = Table(title=f"models (store: {home})")
    for col in ("name", "status", "size", "description"):
        table.add_column(col)
    for r in rows:
        status = "[green]present[/]" if r["present"] else "[yellow]not pulled[/]"
        name = r["name"] + (" (default)" if r["default"] else " (default draft)" if r.get("default_draft") else "")
        table.add_row(name, status, f"{r['size_mb']} MB", r["description"])
    return table
