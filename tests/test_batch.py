"""Several requests decoding together (``mlxspec/serve/batch.py``): each request's engine in a
greenlet, their target passes met in rounds and packed. Greedy replies decoded together equal
those decoded alone, passes do go together, a long pass runs alone, a failed pass fails its
group's requests only, and drafts shrink while others decode."""

from __future__ import annotations

import queue
import threading
import time

import pytest

import mlxspec  # noqa: F401  (loads the fast BLAS before mlx runs anything)

torch = pytest.importorskip("torch", reason="the torch extra is not installed: pip install 'mlxspec[torch]'")
pytest.importorskip("greenlet", reason="the torch extra is not installed: pip install 'mlxspec[torch]'")

from mlxspec.core import engine  # noqa: E402
from mlxspec.core.drafters import ModelDrafter  # noqa: E402
from mlxspec.core.events import Step  # noqa: E402
from mlxspec.core.sampling import SamplingParams  # noqa: E402
from mlxspec.serve import batch  # noqa: E402
from mlxspec.serve.batch import NO_JOB, SOLO_ROWS, BusyK, Slots, SlotTarget  # noqa: E402
from mlxspec.torchpath import invariant  # noqa: E402
from mlxspec.torchpath.packed import MAX_ROWS, Pass  # noqa: E402
from tiny import torch_twin  # noqa: E402

PROMPTS = [[(5 * i + j) % 48 for i in range(n)] for j, n in enumerate((3, 20, 40, 7))]
KS = (0, 1, 3, 5)  # each request drafts its own number of tokens a step (0: target-only)


def twin():
    model = torch_twin(6)
    assert invariant.make_batch_invariant(model)
    return model


def reply(model, prompt: list[int], k: int, temp: float = 0.0, n: int = 24, context: int = 512) -> list[int]:
    drafter = ModelDrafter(model, "self:1", 1) if k else None
    events = engine.generate(model, prompt, SamplingParams(temp), n, set(), context, seed=len(prompt), drafter=drafter,
                             k=max(k, 1))
    return [t.id for ev in events if isinstance(ev, Step) for t in ev.tokens if t.emitted]


def serve_all(slots: Slots, model, jobs: list, n_slots: int = 4) -> dict:
    """``jobs`` (prompt, k) decoded by ``slots``, all queued before the first starts."""
    waiting, out = queue.Queue(), {}
    for job in jobs:
        waiting.put(job)
    waiting.put(None)

    def take(block: bool):
        try:
            return waiting.get(block=block)
        except queue.Empty:
            return NO_JOB

    def decode(job, _session) -> None:
        try:
            out[job] = reply(SlotTarget(model, slots), *job)
        except Exception as e:
            out[job] = e

    slots.serve([None] * n_slots, take, decode)
    return out


@pytest.mark.parametrize("temp", [0.0, 1.0])
def test_replies_decoded_together_are_the_solo_replies(temp):
    """Greedy, and sampled with a seed and a fixed K: each request's logits have its solo pass's
    bits, so its draws, the same rule's (exact by ``tests/test_equivalence.py``), give the same text."""
    model = twin()
    solo = {(tuple(p), k, temp): reply(model, p, k, temp) for p, k in zip(PROMPTS, KS)}
    slots = Slots(model)
    together = serve_all(slots, model, [(tuple(p), k, temp) for p, k in zip(PROMPTS, KS)])
    assert {job: toks for job, toks in together.items()} == solo
    assert max(slots.stats.packed_rows) >= 4  # four requests' steps in one pass
    solo_steps = sum(len(t) for t in solo.values())
    assert slots.stats.rounds < solo_steps / 2


def test_more_requests_than_slots_wait_for_a_free_one():
    model = twin()
    jobs = [(tuple(p), k) for p, k in zip(PROMPTS * 2, KS[::-1] * 2)]
    slots = Slots(model)
    together = serve_all(slots, model, list(dict.fromkeys(jobs)), n_slots=2)
    assert together == {job: reply(model, *job) for job in dict.fromkeys(jobs)}
    assert max(slots.stats.packed_rows) <= 2 * 6  # two slots, at most K + 1 = 6 rows each


def test_groups_pack_short_passes_and_leave_long_ones_alone():
    def p(rows: int) -> Pass:
        return Pass(torch.zeros((1, rows), dtype=torch.long), [])

    passes = [p(SOLO_ROWS), p(SOLO_ROWS + 1), *[p(SOLO_ROWS)] * 3, p(1)]
    assert MAX_ROWS == 4 * SOLO_ROWS
    assert batch.groups(passes) == [[1], [0, 2, 3, 4], [5]]


def test_a_failed_pass_fails_the_requests_of_its_group():
    model = twin()

    def broken(_model, passes):
        raise RuntimeError("the kernel failed")

    together = serve_all(Slots(model, run_packed=broken), model, [(tuple(p), 0) for p in PROMPTS[:3]])
    assert all(isinstance(e, RuntimeError) for e in together.values())


def test_busy_slots_draft_less():
    class Fixed:
        def next_k(self) -> int:
            return 5

        scale = 1.0

    slots = Slots(None)
    k = BusyK(Fixed(), slots, rows=4)
    seen = []
    for busy in (0, 1, 2, 3, 4):
        slots._members = set(range(busy))  # stand-ins for the busy slots' greenlets
        seen.append(k.next_k())
    assert seen == [5, 5, 1, 0, 0] and k.scale == 1.0


@pytest.mark.model
def test_the_default_server_decodes_several_requests_together_with_their_solo_replies():
    """On the real default model and drafter (torch, ``--parallel`` at its default): requests sent
    together get, token for token, the greedy replies they get one at a time, in packed passes."""
    from mlxspec.serve import ServeOptions
    from mlxspec.serve.decoder import Decoder, Job
    from mlxspec.targets.tokenizer import encode_prompt

    decoder = Decoder(ServeOptions(draft="default", backend="torch"), log=lambda line: None)
    try:
        assert decoder.parallel == 8
        ids = [encode_prompt(decoder.info.tokenizer, p) for p in
               ("Name three rivers.", "What is 12 times 11?", "Write a haiku about tea.")]

        def tokens(job: Job) -> list[int]:
            return [t.id for ev in job.events() if isinstance(ev, Step) for t in ev.tokens if t.emitted]

        solo = []
        for i in ids:
            decoder.submit(job := Job(i, SamplingParams(), 24, 0))
            solo.append(tokens(job))
        jobs = [Job(i, SamplingParams(), 24, 0) for i in ids]
        out: list = [None] * len(jobs)
        threads = [threading.Thread(target=lambda n=n: out.__setitem__(n, tokens(jobs[n]))) for n in range(len(jobs))]
        for job in jobs:
            decoder.submit(job)
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert out == solo and all(len(t) >= 8 for t in solo)
        assert max(decoder.slots.stats.packed_rows) >= 3 and decoder.decoding == 0
    finally:
        decoder.close()


@pytest.mark.model
def test_parallel_decoding_is_refused_on_mlx_saying_so(lm):
    from mlxspec.errors import MlxspecError
    from mlxspec.serve import ServeOptions
    from mlxspec.serve.decoder import Decoder

    with pytest.raises(MlxspecError, match="torch backend only"):
        Decoder(ServeOptions(parallel=2), loaded=lm)
    decoder = Decoder(ServeOptions(), loaded=lm)  # on MLX the default is one at a time
    try:
        assert decoder.parallel == 1 and decoder.slots is None
    finally:
        decoder.close()


class SlowPrefill:
    """A torch twin whose prompt chunks (passes over many tokens) take ``delay_s`` longer."""

    def __init__(self, model, delay_s: float):
        self.inner, self.delay_s = model, delay_s

    def __getattr__(self, name: str):
        return getattr(self.inner, name)

    def __call__(self, tokens, *args, **kw):
        if tokens.shape[-1] > SOLO_ROWS:
            time.sleep(self.delay_s)
        return self.inner(tokens, *args, **kw)


@pytest.mark.model
def test_a_retry_sent_before_the_first_is_given_up_waits_and_starts_from_its_chunks(lm):
    """Decoding together, a request that starts with a chunk of a prompt still being prefilled
    (a client's retry, sent before the server noticed the first client leave) is held until that
    prompt is prefilled or given up, then starts from the chunks it left kept; beside it from
    nothing (a cache miss) otherwise."""
    from mlxspec.core.prefill import PREFILL_CHUNK
    from mlxspec.serve import ServeOptions
    from mlxspec.serve.decoder import Decoder, Job
    from mlxspec.targets.loading import LoadedModel

    model = twin()
    tiny = LoadedModel(SlowPrefill(model, 0.3), lm.tokenizer, "tiny-random", lm.path, "float32", 4096, "torch:cpu")
    decoder = Decoder(ServeOptions(draft="ngram:3", k=2, parallel=4), loaded=tiny, log=lambda line: None)
    try:
        ids = [(7 * i + 1) % 48 for i in range(4 * PREFILL_CHUNK)]
        first, retry = Job(ids, SamplingParams(), 2, 0), Job(ids, SamplingParams(), 2, 0)
        decoder.submit(first)
        time.sleep(0.4)  # inside its second chunk
        decoder.submit(retry)
        time.sleep(0.4)
        first.cancel.set()  # its client's departure, noticed
        got = [t.id for ev in retry.events() if isinstance(ev, Step) for t in ev.tokens if t.emitted]
        assert decoder.prompt_cache.hits == 1 and decoder.interrupted_prefills == 1
        assert got == reply(model, ids, 0, n=2, context=4096)
    finally:
        decoder.close()


def test_prompt_chunks_take_turns_with_the_others_steps(monkeypatch):
    """A long prompt's chunks run only once the others' steps have had as long as the last chunk
    took: a short request sent beside it finishes between two of its chunks, not one step per
    chunk; both replies as alone."""
    from mlxspec.core import prefill as prefill_module

    monkeypatch.setattr(prefill_module, "PREFILL_CHUNK", 2 * MAX_ROWS)
    model, log = twin(), []

    class Logged(SlowPrefill):
        def __call__(self, tokens, *args, **kw):
            log.append("chunk" if tokens.shape[-1] > MAX_ROWS else "step")
            return super().__call__(tokens, *args, **kw)

    def packed(m, passes):
        log.append("step")
        return batch.packed_forward(m, passes)

    slow, long_prompt = Logged(model, 0.2), [(3 * i + 1) % 48 for i in range(4 * 2 * MAX_ROWS + 5)]
    slots, out = Slots(slow, run_packed=packed), {}
    jobs = queue.Queue()
    for job in ((tuple(long_prompt), 0), (tuple(PROMPTS[0]), 1)):
        jobs.put(job)
    jobs.put(None)

    def decode(job, _session) -> None:
        out[job] = reply(SlotTarget(slow, slots), list(job[0]), job[1], context=2048)
        log.append(f"done {len(job[0])}")

    slots.serve([None] * 2, lambda block: jobs.get(block=block) if block or not jobs.empty() else NO_JOB, decode)
    assert out == {job: reply(model, list(job[0]), job[1], context=2048) for job in out}
    chunks = [i for i, entry in enumerate(log) if entry == "chunk"]
    assert len(chunks) >= 3 and log.index(f"done {len(PROMPTS[0])}") < chunks[1]


@pytest.mark.model
def test_without_greenlet_the_default_is_one_at_a_time_and_more_is_refused(lm, monkeypatch):
    """torch installed without the extra (no greenlet): the server decodes one request at a time
    rather than fail, and an explicit ``--parallel 2`` says what to install."""
    import importlib.util

    from mlxspec.errors import MlxspecError
    from mlxspec.serve import ServeOptions
    from mlxspec.serve.decoder import Decoder
    from mlxspec.targets.loading import LoadedModel

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "greenlet" else find_spec(name, *a))
    tiny = LoadedModel(twin(), lm.tokenizer, "tiny-random", lm.path, "float32", 512, "torch:cpu")
    decoder = Decoder(ServeOptions(draft="ngram:3", k=2), loaded=tiny, log=lambda line: None)
    try:
        assert decoder.parallel == 1 and decoder.slots is None
    finally:
        decoder.close()
    with pytest.raises(MlxspecError, match=r"mlxspec\[torch\]"):
        Decoder(ServeOptions(draft="ngram:3", k=2, parallel=2), loaded=tiny, log=lambda line: None)
