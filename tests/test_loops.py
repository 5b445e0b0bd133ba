"""The loop detector behind the chat's defaults (``measure/loops.py``): exact on token lists,
and the measurement on a tiny model."""

from __future__ import annotations

from tiny import tiny_target

from mlxspec.core.sampling import SamplingParams
from mlxspec.measure.loops import EVERYDAY_QUESTIONS, Reply, measure_loops, repeated_ngram
from mlxspec.session import Session


def test_a_phrase_said_three_times_repeats_and_twice_does_not():
    phrase = list(range(10, 18))  # 8 tokens
    assert repeated_ngram(phrase + [1] + phrase + [2] + phrase)
    assert not repeated_ngram(phrase + [1] + phrase)
    assert not repeated_ngram(phrase[:7] + [1] + phrase[:7] + [2] + phrase[:7])  # 7 tokens is not enough
    assert repeated_ngram([5, 6, 7] * 6)  # a short cycle repeats its 8-grams (overlapping)
    assert not repeated_ngram(list(range(100)))


def test_a_loop_repeats_and_runs_to_the_limit():
    cycle = [5, 6, 7] * 6
    assert Reply("q", cycle, "length", True).loops
    assert not Reply("q", cycle, "eos", True).loops  # repeated, then ended by itself
    assert not Reply("q", list(range(20)), "length", False).loops  # long, not repeating


def test_twenty_questions_measured_on_a_session():
    assert len(EVERYDAY_QUESTIONS) == 20 and EVERYDAY_QUESTIONS[0] == "What is 2+2? Answer in one word."
    lm = tiny_target(seed=1)
    lm.context_length = 4096

    class Session1(Session):  # the tiny target has no chat template: its questions are token ids
        def encode(self, prompt, raw=False):
            return [1 + len(prompt[0]["content"]) % 50, 2, 3]

    r = measure_loops(Session1(lm, log=None), SamplingParams(), max_tokens=24, questions=EVERYDAY_QUESTIONS[:3])
    assert len(r.replies) == 3 and all(len(x.tokens) <= 24 for x in r.replies)
    assert r.looped == sum(x.loops for x in r.replies) and r.at_limit == sum(x.stop_reason != "eos" for x in r.replies)
