"""The study's settings and its JSON-lines log: one line per verified tree node, then one line
per finished prompt, after a header that a resumed run must match.

    {"record": "node", "domain", "prompt_id", "step", "pos", "node", "parent", "depth", "rank",
     "token", "q_draft", "entropy", "p_target", "target_top", "judged", "accepted"}

A prompt counts as done only with its ``{"record": "prompt", ...}`` line, so an interrupted run
resumes at the first prompt without one, and lines of a half-logged prompt are dropped.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from mlxspec.core.events import Done, Step
from mlxspec.core.tree import depths
from mlxspec.errors import MlxspecError
from mlxspec.targets import store

DEFAULT_PER_DOMAIN = 50
DEFAULT_MAX_TOKENS = 64
QUICK_PER_DOMAIN, QUICK_MAX_TOKENS = 2, 24
LOG_VERSION = 1


@dataclass(frozen=True)
class StudySettings:
    """What identifies a study's log (a resumed run must match it), and the prompt count."""

    model: str
    draft: str
    tree: str
    tree_nodes: int
    temperature: float
    top_p: float
    max_tokens: int
    seed: int
    dtype: str
    per_domain: int = DEFAULT_PER_DOMAIN
    held_out: bool = False  # prompts the draft was distilled on passed over

    def identity(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("per_domain")
        d.pop("held_out")  # a prompt's records do not depend on which others were picked
        return d


def default_log_path(s: StudySettings) -> Path:
    """``$MLXSPEC_HOME/study/<settings>.jsonl``: one log per setting, so a rerun resumes it."""
    slug = (f"{s.model}_{s.draft}_{s.tree}n{s.tree_nodes}_T{s.temperature:g}_p{s.top_p:g}_"
            f"n{s.max_tokens}_seed{s.seed}_{s.dtype}")
    return store.home() / "study" / (re.sub(r"[^A-Za-z0-9._-]+", "-", slug).strip("-") + ".jsonl")


@dataclass
class LogContents:
    header: dict[str, Any] | None
    nodes: list[dict[str, Any]]
    prompts: list[dict[str, Any]]
    dropped: int  # lines of prompts that were not finished, or unreadable lines


def read_log(path: str | Path) -> LogContents:
    """A study log: its header, the node and prompt records of finished prompts (those with a
    prompt line), and how many lines were left out (a prompt cut short, a torn last line)."""
    header, nodes, prompts, pending, dropped = None, [], [], defaultdict(list), 0
    with Path(path).open(encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
                kind = rec["record"]
            except (json.JSONDecodeError, KeyError, TypeError):
                dropped += 1
                continue
            if kind == "header" and header is None:
                header = rec
            elif kind == "node":
                pending[(rec.get("domain"), rec.get("prompt_id"))].append(rec)
            elif kind == "prompt":
                nodes += pending.pop((rec.get("domain"), rec.get("prompt_id")), [])
                prompts.append(rec)
            else:
                dropped += 1
    dropped += sum(len(v) for v in pending.values())
    return LogContents(header, nodes, prompts, dropped)


class StudyLog:
    """The JSON-lines log of a study: opened (created, or checked against ``settings`` and
    cleaned of a half-logged prompt), then one ``add`` per finished prompt."""

    def __init__(self, path: str | Path, settings: StudySettings, fresh: bool = False):
        self.path = Path(path)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            if self.path.is_dir():
                raise MlxspecError(f"--log {self.path} is a folder; give a file")
            if fresh or not self.path.exists() or self.path.stat().st_size == 0:
                self._rewrite({"record": "header", "version": LOG_VERSION, "settings": settings.identity()}, [], [])
                self.contents = LogContents(None, [], [], 0)
            else:
                self.contents = self._resume(settings.identity())
        except OSError as e:
            raise MlxspecError(f"cannot use the study log {self.path}: {e.strerror or e}") from None

    def _resume(self, ident: dict[str, Any]) -> LogContents:
        """The log's finished prompts, once its header matches ``ident``."""
        c = read_log(self.path)
        if c.header is None:
            raise MlxspecError(f"{self.path} is not a study log (no header line); give another --log or --fresh")
        theirs = c.header.get("settings", {})
        diff = [f"{k} {theirs.get(k)!r} (now {v!r})" for k, v in ident.items() if theirs.get(k) != v]
        if diff:
            raise MlxspecError(f"{self.path} was logged with other settings: {', '.join(diff)}; "
                               "give another --log, or --fresh to start it again")
        if c.dropped:  # keep only whole prompts, so nothing is logged twice
            self._rewrite(c.header, c.nodes, c.prompts)
        return c

    def _rewrite(self, header: dict, nodes: list[dict], prompts: list[dict]) -> None:
        by_prompt = defaultdict(list)
        for n in nodes:
            by_prompt[(n["domain"], n["prompt_id"])].append(n)
        tmp = self.path.with_name(self.path.name + ".tmp")
        with tmp.open("w", encoding="utf-8") as f:
            f.write(json.dumps(header) + "\n")
            for p in prompts:
                for n in by_prompt.get((p["domain"], p["prompt_id"]), []):
                    f.write(json.dumps(n) + "\n")
                f.write(json.dumps(p) + "\n")
        os.replace(tmp, self.path)

    @property
    def done(self) -> set[tuple[str, Any]]:
        return {(p["domain"], p["prompt_id"]) for p in self.contents.prompts}

    def add(self, nodes: list[dict[str, Any]], prompt: dict[str, Any]) -> None:
        """A finished prompt: its nodes, then its prompt line, in one write."""
        text = "".join(json.dumps(n) + "\n" for n in nodes) + json.dumps(prompt) + "\n"
        try:
            with self.path.open("a", encoding="utf-8") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
        except OSError as e:
            raise MlxspecError(f"cannot write the study log {self.path}: {e.strerror or e}") from None
        self.contents.nodes += nodes
        self.contents.prompts.append(prompt)


def run_prompts(items: Sequence[dict[str, Any]], log: StudyLog,
                run_one: Callable[[dict[str, Any]], tuple[list[dict], dict]],
                progress: Callable[[int, int, str], Any] | None = None) -> int:
    """Run every item not finished in ``log`` (``run_one(item) -> (nodes, prompt record)``),
    logging each as it finishes. Returns how many ran."""
    done = log.done
    todo = [it for it in items if (it["domain"], it["id"]) not in done]
    before = len(items) - len(todo)
    for i, it in enumerate(todo):
        if progress is not None:
            progress(i, len(todo), f"study · {it['domain']} {it['id']}"
                     + (f" · {before} done before" if before else ""))
        nodes, prompt = run_one(it)
        log.add(nodes, prompt)
    if progress is not None and todo:
        progress(len(todo), len(todo), "study · summarising")
    return len(todo)


def _step_nodes(tree: Any, domain: str, prompt_id: Any, step: int, pos: int) -> list[dict[str, Any]]:
    """The node records of one tree step (its ``NodeStats``): ``rank`` is a node's place among
    its siblings, ``judged`` says its parent was accepted (or is the root)."""
    s, path = tree.stats, set(tree.path)
    seen: Counter = Counter()
    out = []
    for i, (tok, par, depth) in enumerate(zip(tree.tokens, tree.parents, depths(tree.parents))):
        rank = seen[par]
        seen[par] += 1
        out.append({
            "record": "node", "domain": domain, "prompt_id": prompt_id, "step": step, "pos": pos,
            "node": i, "parent": par, "depth": depth, "rank": rank, "token": tok,
            "q_draft": None if s.q_draft is None else s.q_draft[i], "entropy": s.entropy[i],
            "p_target": s.p_target[i], "target_top": s.target_top[i],
            "judged": par < 0 or par in path, "accepted": i in path,
        })
    return out


def prompt_records(events: Iterable[Any], domain: str, prompt_id: Any,
                   prompt_tokens: int = 0) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The node records and the prompt record of one generation, from the engine's events
    (``generate(..., tree=..., node_stats=True)``)."""
    nodes: list[dict[str, Any]] = []
    tokens: list[int] = []
    steps = tree_steps = 0
    done = None
    t0 = time.perf_counter()
    for ev in events:
        if isinstance(ev, Done):
            done = ev
            continue
        if not isinstance(ev, Step):
            continue
        t = ev.tree
        if t is not None and t.tokens and t.stats is not None:
            tree_steps += 1
            nodes += _step_nodes(t, domain, prompt_id, steps, len(tokens))
        tokens += ev.emitted
        steps += 1
    prompt = {"record": "prompt", "domain": domain, "prompt_id": prompt_id, "prompt_tokens": prompt_tokens,
              "generated": len(tokens), "steps": steps, "tree_steps": tree_steps, "nodes": len(nodes),
              "stop_reason": done.stop_reason if done else None, "seconds": time.perf_counter() - t0,
              "tokens": tokens}
    return nodes, prompt
