"""A deterministic stand-in for the models: scripted engine events, a word-per-token
"tokenizer" and a virtual clock. Used by the tests and by ``python -m mlxspec.tui --demo``."""

from __future__ import annotations

import time
from collections.abc import Iterator

from mlxspec.core.events import Done, Event, Status, Step, Token, Tree
from mlxspec.core.tree import depths, first_line
from mlxspec.errors import MlxspecError

from .source import ModelInfo, Settings

A, R, C, B, P = Status.ACCEPTED, Status.REJECTED, Status.CORRECTED, Status.BONUS, Status.PLAIN

# One entry per verification step: (draft ms, verify ms, [(text, status), ...]) in engine order
# (rejected drafts just before the correction that replaced them).
SCRIPT: list[tuple[float, float, list[tuple[str, Status]]]] = [
    (1.0, 100.0, [("Speculative", P)]),
    (2.0, 150.0, [(" decoding", A), (" lets", A), (" a", A), (" small", B)]),
    (2.0, 150.0, [(" draft", A), (" guess", R), (" ahead", R), (" propose", C)]),
    (2.0, 140.0, [(" tokens", A), (" that", A), (" the", A), (" big", R), (" target", C)]),
    (2.0, 140.0, [(" checks", A), (" in", A), (" one", A), (" pass", A), (".", B)]),
    (1.0, 110.0, [(" Mismatches", P)]),
    (2.0, 150.0, [(" are", R), ("\n", R), (" dropped", R), (" are", C)]),
    (2.0, 150.0, [(" struck", A), (" through", A), (".", A), (" Done", B)]),
]

# A tree step's nodes: (text, parent) breadth first, parent -1 below the last committed token.
TreeNodes = tuple[tuple[str, int], ...]


def tree_step(draft_ms: float, verify_ms: float, nodes: TreeNodes, path: tuple[int, ...], target: str):
    """A ``SCRIPT`` entry for one tree step, with the pieces the engine would show for it: the
    accepted ``path``, the drafter's own first line below it (rejected), then the ``target``'s
    token (a correction where that line was refused, else a bonus). Its fourth item is the
    tree: (nodes, path)."""
    parents = [p for _, p in nodes]
    refused = first_line(parents, path[-1] if path else -1)
    pieces = ([(nodes[i][0], A) for i in path] + [(nodes[i][0], R) for i in refused]
              + [(target, C if refused else B)])
    return draft_ms, verify_ms, pieces, (nodes, path)


# Trees of shape 3x2 cut at 8 nodes (``--tree 3x2 --tree-nodes 8``): parents -1 -1 0 0 1 1 2 2.
def _tree_3x2_8(*texts: str) -> TreeNodes:
    return tuple(zip(texts, (-1, -1, 0, 0, 1, 1, 2, 2)))


TREE_SCRIPT = [
    tree_step(3.0, 160.0, _tree_3x2_8("A", "The", " tree", " search", " model", " draft", " of", " is"), (), "Tree"),
    tree_step(3.0, 170.0, _tree_3x2_8(" speculation", " search", " drafts", " lets", " is", " over",
                                      " several", " many"), (0, 2, 6), " continuations"),
    tree_step(3.0, 170.0, _tree_3x2_8(" at", " in", " once", " a", " parallel", " one", ":", ","), (0, 2, 6),
              " the"),
    tree_step(3.0, 165.0, _tree_3x2_8(" target", " model", " checks", " verifies", " then", " checks", " each",
                                      " all"), (0, 2), " every"),
    tree_step(3.0, 170.0, _tree_3x2_8(" branch", " node", " in", " at", " of", " it", " one", " a"), (0, 2, 6),
              " pass"),
    tree_step(3.0, 165.0, _tree_3x2_8(",", ".", " keeps", " and", " then", " The", " the", " every"), (0, 2, 6),
              " longest"),
    tree_step(3.0, 170.0, _tree_3x2_8(" path", " branch", " it", " that", " and", " agreed", " agrees", " likes"),
              (0, 2, 6), " with"),
    tree_step(3.0, 165.0, _tree_3x2_8(",", ".", " and", " then", " The", " It", " appends", " drops"), (0, 2),
              " adds"),
    tree_step(3.0, 165.0, _tree_3x2_8(" a", " one", " token", " word", " more", " token", " of", " to"), (0, 2, 6),
              " its"),
    tree_step(3.0, 165.0, _tree_3x2_8(" choosing", " own", " or", ".", " words", " choice", " and", ","), (1,),
              "."),
]


class FakeDecoder:
    def __init__(self, vocab: dict[int, str]):
        self.vocab = vocab

    def add(self, token_id: int) -> str:
        return self.vocab[token_id]

    def alone(self, token_id: int) -> str:
        return self.vocab[token_id]

    def finish(self) -> str:
        return ""


class FakeSource:
    """Replays ``SCRIPT`` (with the steps' K and acceptance derived from the statuses), or
    ``TREE_SCRIPT`` (K: the tree's nodes; accepted: its path).

    ``delay`` sleeps that many seconds per step (for stop tests and demos); ``fail_load`` and
    ``fail_turn`` raise ``MlxspecError`` from ``load`` / the first event.
    """

    def __init__(self, script=SCRIPT, delay: float = 0.0, fail_load: str | None = None,
                 fail_turn: str | None = None, baseline_ms: float | None = 110.0):
        self.script, self.delay = script, delay
        self.fail_load, self.fail_turn, self.baseline_ms = fail_load, fail_turn, baseline_ms
        self.ids: dict[str, int] = {}  # one "token" per distinct text
        for entry in script:
            texts = [text for text, _ in entry[2]] + [text for text, _ in (entry[3][0] if len(entry) > 3 else ())]
            for text in texts:
                self.ids.setdefault(text, len(self.ids) + 1)
        self.vocab = {i: t for t, i in self.ids.items()}
        self.now = 0.0  # virtual clock, seconds: advances by each step's draft + verify time
        self.requests: list[tuple[list[dict[str, str]], Settings]] = []
        self.kept: list[bool] = []  # each request's ``keep``

    def clock(self) -> float:
        return self.now

    def load(self) -> ModelInfo:
        if self.fail_load:
            raise MlxspecError(self.fail_load)
        return ModelInfo("fake-target", "float32", 64, "fake backend", "cpu", self.baseline_ms)

    def decoder(self) -> FakeDecoder:
        return FakeDecoder(self.vocab)

    def close(self) -> None:
        pass

    def steps(self) -> list[Step]:
        out = []
        for draft_ms, verify_ms, pieces, *tree in self.script:
            tokens = [Token(self.ids[t], s) for t, s in pieces]
            if tree:
                (nodes, path), = tree
                parents = tuple(p for _, p in nodes)
                shown = Tree(tuple(self.ids[t] for t, _ in nodes), parents, tuple(path))
                out.append(Step(tokens, k=len(nodes), accepted=len(path), draft_ms=draft_ms, verify_ms=verify_ms,
                                room=max(depths(parents), default=0), tree=shown))
                continue
            k = sum(s in (A, R) for _, s in pieces)
            accepted = sum(s is A for _, s in pieces)
            out.append(Step(tokens, k=k, accepted=accepted, draft_ms=draft_ms, verify_ms=verify_ms))
        return out

    def events(self, messages: list[dict[str, str]], settings: Settings, keep: bool = True) -> Iterator[Event]:
        self.requests.append((messages, settings))
        self.kept.append(keep)
        return self._events()

    def _events(self) -> Iterator[Event]:
        if self.fail_turn:
            raise MlxspecError(self.fail_turn)
        steps = self.steps()
        self.now += 0.5  # prefill
        first = None
        for step in steps:
            if self.delay:
                time.sleep(self.delay)
            self.now += (step.draft_ms + step.verify_ms) / 1000
            first = self.now if first is None else first
            yield step
        n = sum(len(s.emitted) for s in steps)
        yield Done(12, n, prefill_s=0.5, decode_s=self.now - first, stop_reason="eos", steps=len(steps),
                   accepted_lengths=[s.accepted for s in steps])
