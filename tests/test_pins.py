"""Greedy output pinned across refactors: for each drafter, the exact tokens and events that
`mlxspec generate --k 4 -n 40 --json` produced before the package was reshaped
(tests/data/greedy_pins.json, recorded from the CLI). Greedy speculative output must also be
target-only output, which the pins show: every drafter's tokens equal `none`'s."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mlxspec.core.engine import generate
from mlxspec.core.events import Step
from mlxspec.core.sampling import SamplingParams
from mlxspec.targets.drafts import make_drafter
from mlxspec.targets.tokenizer import encode_prompt

PINS = json.loads((Path(__file__).parent / "data" / "greedy_pins.json").read_text())

pytestmark = pytest.mark.model


def events_of(lm, spec: str, prompt: str) -> list[list]:
    tok = lm.tokenizer
    out = []
    for ev in generate(lm.model, encode_prompt(tok, prompt), SamplingParams(), 40, set(tok.eos_token_ids),
                       lm.context_length, 0, make_drafter(spec, lm), 4):
        if isinstance(ev, Step):
            out += [[t.id, t.status.value] for t in ev.tokens]
            if spec != "none":
                out.append(["step", ev.k, ev.accepted])
    return out


def test_pins_agree_with_target_only():
    plain = {p["prompt"]: [e[0] for e in p["events"]] for p in PINS if p["draft"] == "none"}
    for p in PINS:
        emitted = [e[0] for e in p["events"] if e[0] != "step" and e[1] != "rejected"]
        assert emitted == plain[p["prompt"]], p["draft"]


# "default" was recorded when the registry's default draft was smollm2-135m-draft; pinned by name.
@pytest.mark.parametrize("recorded, spec", [("none", "none"), ("ngram:3", "ngram:3"), ("self:8", "self:8"),
                                            ("default", "smollm2-135m-draft")])
def test_greedy_events_are_what_they_were(lm, recorded, spec):
    for pin in (p for p in PINS if p["draft"] == recorded):
        assert events_of(lm, spec, pin["prompt"]) == pin["events"], pin["prompt"]
