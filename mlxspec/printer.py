"""What ``mlxspec generate`` prints for each engine event: the reply as text (statistics on
stderr), or with ``--json`` one object per token, per step and a summary, all on stdout.

The CLI imports this module when ``generate`` runs, not before: it loads MLX and mlx-lm."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path
from typing import Any

from mlxspec.core.events import Done, Event, Status, Step, Token
from mlxspec.core.runs import Run, RunCollector
from mlxspec.session import Session, StepText
from mlxspec.errors import MlxspecError
from mlxspec.terminal import err, write_text


class _Tee:
    """stdout, and the copy ``--out`` keeps."""

    def __init__(self, *streams: Any):
        self.streams = streams

    def write(self, text: str) -> None:
        for s in self.streams:
            s.write(text)

    def flush(self) -> None:
        for s in self.streams:
            s.flush()


class ReplyPrinter:
    """Prints one reply as its events come (``add``). The summary is the ``Run`` the events
    make (``RunCollector``), as every command collects a run."""

    def __init__(self, session: Session, k: int | str, as_json: bool, out: Path | None = None, sampling: str = ""):
        self.lm, self.drafter, self.tree, self.k, self.as_json = session.lm, session.drafter, session.tree, k, as_json
        self.sampling = sampling  # its label, e.g. "T=1 min-p=0.1", for the stats line and the summary
        self.text = StepText(self.lm.tokenizer)
        if out is not None and out.is_dir():  # refused before the reply, not after it
            raise MlxspecError(f"--out {out} is a folder; give a file")
        self.path, self.kept = out, io.StringIO()
        self.out = sys.stdout if out is None else _Tee(sys.stdout, self.kept)
        self.collector = RunCollector()

    def save(self) -> None:
        """``--out``: the reply as printed (with ``--json``, its lines), once it has ended."""
        if self.path is not None:
            write_text(self.kept.getvalue(), self.path)

    def add(self, ev: Event) -> None:
        self.collector.add(ev)
        if isinstance(ev, Step):
            self.step(ev)
        elif isinstance(ev, Done):
            self.done(self.collector.run())

    def step(self, ev: Step) -> None:
        for t, piece in self.text.pieces(ev):
            if self.as_json:
                self.write({"token": t.id, "text": piece, "status": t.status.value} | self.logprobs(t))
            elif t.status is not Status.REJECTED:
                self.out.write(piece)
        if self.as_json and self.drafter is not None:
            step = {"k": ev.k, "accepted": ev.accepted, "draft_ms": ev.draft_ms, "verify_ms": ev.verify_ms,
                    **({"drafter": ev.drafter} if ev.drafter else {})}
            if ev.tree is not None:
                step["tree"] = ev.tree.to_dict()
            self.write({"step": step})
        self.out.flush()

    def logprobs(self, t: Token) -> dict:
        """``--logprobs``: the token's log-probability and alternatives (nothing when not asked for,
        or for a rejected draft, which is not part of the reply)."""
        if t.logprob is None:
            return {}
        top = [{"token": i, "text": self.text.alone(i), "logprob": lp} for i, lp in t.top_logprobs or ()]
        return {"logprob": t.logprob, "top_logprobs": top}

    def summary(self, run: Run) -> dict:
        """The ``--json`` summary of a ``Run``: decode tokens/s 0.0 when there is none, no
        accepted lengths for target-only decoding (its steps draft nothing)."""
        return {"prompt_tokens": run.prompt_tokens, "generated_tokens": run.generated_tokens,
                "prefill_s": run.prefill_s, "decode_s": run.decode_s, "stop_reason": run.stop_reason,
                "steps": run.steps, "accepted_lengths": list(run.accepted) if self.drafter else [],
                "prefill_tps": run.prefill_tps, "decode_tps": run.decode_tps or 0.0}

    def done(self, run: Run) -> None:
        tail = self.text.finish()
        if self.as_json:
            if tail:
                self.write({"token": None, "text": tail, "status": "flush"})
            self.write({"summary": self.summary(run), "model": self.lm.name, "dtype": self.lm.dtype,
                        **({"sampling": self.sampling} if self.sampling else {}),
                        "backend": self.lm.backend,
                        "draft": self.drafter.name if self.drafter else None, "k": self.k if self.drafter else 0,
                        **({"tree": str(self.tree), "tree_nodes": self.tree.nodes} if self.tree else {})})
            self.save()
            return
        self.out.write(tail + "\n")
        self.out.flush()
        self.save()
        err.print(f"[dim]{self.stats_line(run)}[/]")

    def interrupted(self) -> None:
        """The reply was stopped before the engine's ``Done`` (Ctrl-C): print what the
        detokenizer held, then say so. ``--json`` ends with a summary whose ``stop_reason`` is
        "interrupted" and whose timings are null, so it never reads as a finished reply."""
        tail, c = self.text.finish(), self.collector
        if self.as_json:
            if tail:
                self.write({"token": None, "text": tail, "status": "flush"})
            self.write({"summary": {"prompt_tokens": None, "generated_tokens": len(c.tokens), "prefill_s": None,
                                    "decode_s": None, "stop_reason": "interrupted", "steps": len(c.accepted),
                                    "accepted_lengths": list(c.accepted) if self.drafter else [],
                                    "prefill_tps": None, "decode_tps": None},
                        "model": self.lm.name, "dtype": self.lm.dtype,
                        "draft": self.drafter.name if self.drafter else None, "k": self.k if self.drafter else 0})
            self.out.flush()
            self.save()
            return
        self.out.write(tail + "\n")
        self.out.flush()
        self.save()
        err.print(f"[dim]interrupted after {len(c.tokens)} generated tokens[/]")

    def stats_line(self, run: Run) -> str:
        """The line on stderr after a text reply: prefill and decode speed, and with a drafter
        the steps and tokens accepted per step."""
        line = (f"{self.lm.backend}: {run.prompt_tokens} prompt tokens, {run.prefill_tps:.1f} tok/s prefill; "
                f"{run.generated_tokens} generated, {run.decode_tps or 0.0:.1f} tok/s decode; stop: {run.stop_reason}"
                + (f"; sampling {self.sampling}" if self.sampling else ""))
        if self.drafter is not None and run.steps:
            tau = sum(run.accepted) / run.steps
            k = self.k if self.k != "auto" else f"auto (mean {sum(run.drafted) / run.steps:.1f} drafted)"
            shape = f"tree={self.tree} ({self.tree.nodes} nodes)" if self.tree else f"k={k}"
            line += f"; {self.drafter.name} {shape}: {run.steps} steps, {tau:.2f} accepted per step"
        return line

    def write(self, obj: dict[str, Any]) -> None:
        self.out.write(json.dumps(obj) + "\n")
