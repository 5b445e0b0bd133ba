"""The session: the one path from options to the engine's events, and the one text decoder of a step."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import mlxspec  # noqa: F401  (fast BLAS before mlx)
from mlxspec.core.engine import generate
from mlxspec.core.events import Done, Status, Step, Token
from mlxspec.core.sampling import SamplingParams
from mlxspec.errors import MlxspecError
from mlxspec.session import Session, SessionOptions, StepText, step_pieces

ROOT = Path(__file__).resolve().parents[1] / "mlxspec"
PROMPT = [3, 17, 9, 40, 2, 33, 17, 9]


@pytest.fixture(scope="module")
def tiny():
    from tiny import lively_target

    lm = lively_target(3)
    lm.context_length = 256
    return lm


def emitted(events) -> list[int]:
    return [t for ev in events if isinstance(ev, Step) for t in ev.emitted]


def test_only_the_session_and_core_call_the_engine():
    """One run-building path: every face and measurement streams from a ``Session``."""
    callers = []
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT.parent).as_posix()
        if rel.startswith("mlxspec/core/") or rel == "mlxspec/session.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == "mlxspec.core.engine":
                callers += [f"{rel}: {a.name}" for a in node.names if a.name in ("generate", "generate_plain")]
            elif isinstance(node, ast.Attribute) and node.attr in ("generate", "generate_plain") \
                    and isinstance(node.value, ast.Name) and node.value.id == "engine":
                callers.append(f"{rel}: engine.{node.attr}")
    assert not callers, "the engine called outside the session:\n" + "\n".join(callers)


@pytest.mark.parametrize("draft, k", [("none", None), ("ngram:2", 3), ("self:1", 2)])
def test_a_session_streams_what_the_engine_gives(tiny, draft, k):
    session = Session(tiny, draft, k, log=None)
    want = list(generate(tiny.model, PROMPT, SamplingParams(), 24, {0}, 256, 0, session.drafter, session.policy))
    got = list(session.stream(PROMPT, max_tokens=24))
    assert emitted(got) == emitted(want) and isinstance(got[-1], Done)
    assert [ev.k for ev in got if isinstance(ev, Step)] == [ev.k for ev in want if isinstance(ev, Step)]
    if draft == "none":
        assert session.drafter is None and session.policy == 4
    else:
        assert session.drafter.name == draft and session.policy == k


def test_speculative_greedy_equals_target_only(tiny):
    plain = emitted(Session(tiny, log=None).stream(PROMPT, max_tokens=32, stop_ids=set()))
    for draft in ("ngram:2", "self:1", "self:2"):
        assert emitted(Session(tiny, draft, 4, log=None).stream(PROMPT, max_tokens=32, stop_ids=set())) == plain


def test_keep_reuses_the_last_turns_cache(tiny):
    session = Session(tiny, "ngram:2", 3, log=None)
    first = list(session.stream(PROMPT, max_tokens=12, stop_ids=set(), keep=True))
    turn = PROMPT + emitted(first) + [5, 6]
    second = list(session.stream(turn, max_tokens=12, stop_ids=set(), keep=True))
    fresh = list(Session(tiny, "ngram:2", 3, log=None).stream(turn, max_tokens=12, stop_ids=set()))
    assert emitted(second) == emitted(fresh)
    assert session.kept.entries[-1].tokens[: len(turn)] == turn
    unkept = Session(tiny, log=None)
    list(unkept.stream(PROMPT, max_tokens=4))
    assert not unkept.kept.entries  # keep=False leaves nothing behind


def test_open_takes_a_loaded_model_and_checks_the_drafter(tiny):
    session = Session.open(SessionOptions(draft="ngram:3", k=2), loaded=tiny, log=None)
    assert session.lm is tiny and session.drafter.name == "ngram:3" and session.policy == 2
    with pytest.raises(MlxspecError, match="bad drafter 'ngram:x'"):
        Session.open(SessionOptions(draft="ngram:x"), loaded=tiny, log=None)


class _Detok:
    def __init__(self):
        self.held, self.last_segment = [], ""

    def reset(self):
        self.held = []

    def add_token(self, t):
        self.last_segment = f"<{t}>"

    def finalize(self):
        self.last_segment = "!"


class _Tokenizer:
    detokenizer = _Detok()

    def decode(self, ids):
        return f"[{ids[0]}]"


def test_step_text_decodes_rejected_drafts_alone():
    step = Step([Token(1, Status.ACCEPTED), Token(2, Status.REJECTED), Token(3, Status.CORRECTED)], k=2, accepted=1,
                draft_ms=0.0, verify_ms=0.0)
    text = StepText(_Tokenizer())
    assert [(t.id, s) for t, s in text.pieces(step)] == [(1, "<1>"), (2, "[2]"), (3, "<3>")]
    assert text.finish() == "!"
    assert [s for _, s in step_pieces(step, text)] == ["<1>", "[2]", "<3>"]
