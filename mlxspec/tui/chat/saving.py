"""A conversation saved from the chat (^s): Markdown to read, and JSON that keeps how each token
came to be (accepted draft, correction, bonus, plain; rejected drafts too) for analysis."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

from .messages import Piece


@dataclass(frozen=True)
class SavedTurn:
    question: str
    pieces: tuple[Piece, ...]  # the reply's tokens as drawn, rejected drafts included
    settings: str  # what the turn ran with, as its box's title says
    summary: str  # its speed and acceptance, as its box's bottom line says ("" while it runs)

    @property
    def reply(self) -> str:
        return "".join(p.text for p in self.pieces if p.emitted)


def conversation_record(model: str, turns: list[SavedTurn], saved: str) -> dict:
    return {"schema": 1, "model": model, "saved": saved, "turns": [
        {"user": t.question, "assistant": t.reply, "settings": t.settings, "summary": t.summary,
         "tokens": [{"text": p.text, "status": p.status.value} for p in t.pieces]} for t in turns]}


def conversation_markdown(model: str, turns: list[SavedTurn], saved: str) -> str:
    parts = [f"# Chat with {model}\n\nSaved {saved} by `mlxspec chat`.\n"]
    for t in turns:
        parts.append(f"## You\n\n{t.question}\n\n## {model}\n\n{t.reply}\n\n*{t.settings}*"
                     + (f" · *{t.summary}*" if t.summary else "") + "\n")
    return "\n".join(parts)


def save_conversation(folder: Path, model: str, turns: list[SavedTurn], now: float | None = None) -> tuple[Path, Path]:
    """Write ``chat-<time>.md`` and ``.json`` into ``folder``; their paths."""
    now = time.time() if now is None else now
    saved = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(now))
    stem = folder / time.strftime("chat-%Y%m%d-%H%M%S", time.localtime(now))
    folder.mkdir(parents=True, exist_ok=True)
    md, js = stem.with_suffix(".md"), stem.with_suffix(".json")
    md.write_text(conversation_markdown(model, turns, saved))
    js.write_text(json.dumps(conversation_record(model, turns, saved), ensure_ascii=False) + "\n")
    return md, js
