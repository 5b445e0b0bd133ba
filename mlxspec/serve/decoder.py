"""The one thread that runs the model: it opens a ``Session`` and decodes queued jobs, one at a
time or several together (``serve.batch``), handing the engine's events back to the handler
thread that waits for each."""

from __future__ import annotations

import importlib.util
import itertools
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from mlxspec.core.cache import common_prefix
from mlxspec.core.events import Done, Event
from mlxspec.core.ops import ops_for
from mlxspec.core.prefill import PREFILL_CHUNK, Interrupted
from mlxspec.core.prompt_cache import PromptCache
from mlxspec.core.sampling import SamplingParams
from mlxspec.errors import MlxspecError
from mlxspec.runtime import wait_for_thread_exit
from mlxspec.serve.requests import DEFAULT_PARALLEL, ApiError, ServeOptions
from mlxspec.session import Session
from mlxspec.targets.costcurve import stderr_line

Log = Callable[[str], None]
PROGRESS_CHUNKS = 4  # prompt chunks between a long prefill's progress lines in the log (2,048 tokens)


def prefill_watch(stop: Callable[[], bool], prompt_tokens: int, log: Log, every: int = PROGRESS_CHUNKS,
                  clock: Callable[[], float] = time.perf_counter) -> Callable[[], bool]:
    """The engine's ``interrupt`` for one request, asked after each prompt chunk: every ``every``
    chunks it logs how far a long prompt has come (a server that looks stuck is prefilling), and
    it says whether to give the prompt up (``stop``: its client left, or the server stops)."""
    start, chunks = clock(), itertools.count(1)

    def interrupt() -> bool:
        if (n := next(chunks)) % every == 0:
            done, s = n * PREFILL_CHUNK, clock() - start
            log(f"{time.strftime('%Y-%m-%d %H:%M:%S')} prefilling a {prompt_tokens}-token prompt: "
                f"{done} tokens in {s:.1f} s ({done / s:.0f} tok/s)")
        return stop()

    return interrupt


def parallel_refused(parallel: int) -> MlxspecError:
    return MlxspecError(f"--parallel {parallel} decodes on the torch backend only (--backend torch), with the torch "
                        "extra installed (pip install 'mlxspec[torch]'); on MLX requests decode one at a time")


_END = object()  # a job's last item
ALIVE_POLL_S = 0.5  # how often a waiting request checks that its client is still there


def shutting_down() -> ApiError:
    """What a request still queued or decoding gets when the server stops (Ctrl-C, SIGTERM): an
    error, not a normal end, so a stream cut short never reads as finished (``finish_reason``
    "length"). In a stream it is the last event, as OpenAI's API reports a failure mid-stream
    (the official client raises on it); otherwise a 503."""
    return ApiError(503, "the server is shutting down; the reply was cut short", "server_shutdown", "server_error")


@dataclass
class Job:
    """One request on its way through the decoder: the engine's events come back on ``items``;
    setting ``cancel`` stops decoding after the current step."""

    ids: list[int]
    params: SamplingParams
    max_tokens: int
    seed: int
    logprobs: int | None = None  # report each token's log-probability with this many alternatives
    prefilled: bool = False  # its prompt is in the cache (its first event came)
    items: queue.Queue = field(default_factory=queue.Queue)
    cancel: threading.Event = field(default_factory=threading.Event)

    def events(self, alive: Callable[[], bool] | None = None) -> Iterator[Event]:
        """The engine's events until the job ends; an engine failure is raised here. ``alive``:
        asked while the job waits and after each event; once it says no (the client left),
        decoding is cancelled and the events end."""
        while True:
            try:
                item = self.items.get(timeout=None if alive is None else ALIVE_POLL_S)
            except queue.Empty:
                if alive():
                    continue
                self.cancel.set()
                return
            if item is _END:
                return
            if isinstance(item, ApiError):
                raise item
            if isinstance(item, MlxspecError):
                raise ApiError(400, str(item), "invalid_request")
            if isinstance(item, BaseException):
                raise ApiError(500, f"decoding failed: {item!r}", "server_error", "server_error")
            yield item
            if alive is not None and not alive():
                self.cancel.set()
                return


@dataclass(frozen=True)
class ModelInfo:
    """What handler threads may read about the loaded model (fixed once loaded)."""

    name: str
    tokenizer: Any
    context_length: int
    vocab_size: int  # token ids a request may send: 0 .. vocab_size - 1
    drafter: str | None
    k: int | str


class Decoder:
    """The one thread that runs MLX: it loads the target, makes the drafter and the K policy, then
    decodes queued jobs one at a time (a long prompt lets those queued behind it run between its
    chunks). The queue is the lock around the engine; keeping every MLX
    call on one long-lived thread also keeps MLX's per-thread state off the short-lived handler
    threads (whose exit-time destructors can abort the process, see ``runtime.wait_for_thread_exit``)."""

    def __init__(self, options: ServeOptions, loaded: Any = None, log: Log | None = None):
        self.jobs: queue.Queue[Job | None] = queue.Queue()
        self.cancelled = 0  # jobs stopped before the engine finished (client gone, stop string)
        self.interrupted_prefills = 0  # of those, stopped in their prompt (between its chunks)
        self.served_between_chunks = 0  # requests decoded between a long prompt's chunks
        self.parallel = 1  # requests decoded together (``_run_slots``)
        self.info: ModelInfo | None = None
        self.prompt_cache: PromptCache | None = None  # the session's, for /health to read
        self._current: Job | None = None
        self._running: dict[int, Job] = {}  # with --parallel N: the jobs its slots decode, by id
        self.slots: Any = None  # with --parallel N: the ``serve.batch.Slots`` scheduler
        # requests that start with a chunk of a prompt being prefilled, held for its cache
        # (``_serve_waiting``; with --parallel N, ``_run_slots``'s ``take``)
        self._waiting: deque[Job] = deque()
        self._ready = threading.Event()
        self._closing = threading.Event()
        self._log: Log = log if log is not None else stderr_line
        self._failure: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(options, loaded), name="mlxspec-decoder",
                                        daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._failure is not None:
            self._thread.join()
            raise self._failure

    @property
    def decoding(self) -> int:
        """Requests decoding now (their prompt or their reply)."""
        return len(self._running) if self.slots is not None else int(self._current is not None)

    def submit(self, job: Job) -> None:
        if self._closing.is_set():
            job.items.put(shutting_down())
            job.items.put(_END)
            return
        self.jobs.put(job)

    def close(self) -> None:
        """Stop after the current step; queued jobs end empty. Waits for the thread to be gone."""

        self._closing.set()
        for job in [self._current, *list(self._running.values())]:
            if job is not None:
                job.cancel.set()
        self.jobs.put(None)
        self._thread.join()
        wait_for_thread_exit(self._thread.native_id)

    def _run(self, options: ServeOptions, loaded: Any) -> None:
        try:
            if (options.parallel or 1) > 1 and options.backend == "mlx" and loaded is None:  # before loading anything
                raise parallel_refused(options.parallel)
            session = Session.open(options.session, loaded, log=self._log).ready()
        except BaseException as e:  # reported by the constructor on the caller's thread
            self._failure = e
            self._ready.set()
            return
        lm, drafter = session.lm, session.drafter
        k = f"tree {options.tree}" if options.tree is not None else "auto" if options.k is None else options.k
        self.info = ModelInfo(lm.name, lm.tokenizer, lm.context_length, lm.config.vocab_size,
                              drafter.name if drafter else None, k)
        self.prompt_cache = session.kept
        # decoding together needs the torch extra's greenlet; without it the default is one at a time
        together = lm.backend != "mlx" and importlib.util.find_spec("greenlet") is not None
        self.parallel = options.parallel or (DEFAULT_PARALLEL if together else 1)
        if self.parallel > 1:
            self._run_slots(session, options)
        else:
            self._ready.set()
            while (job := self._next_job()) is not None:
                self._current = job
                self._decode(job, session)
                self._current = None
        ops_for(lm.model).synchronize()
        while True:  # a job submitted as we stopped
            try:
                job = self.jobs.get_nowait()
            except queue.Empty:
                break
            if job is not None:
                job.items.put(shutting_down())
                job.items.put(_END)

    def _run_slots(self, session: Session, options: ServeOptions) -> None:
        """Decode up to ``options.parallel`` requests together (``serve.batch``): each slot has its
        own drafter and K policy, all share the kept caches. Returns once ``close`` stopped them."""
        if session.lm.backend == "mlx" or importlib.util.find_spec("greenlet") is None:
            self._failure = parallel_refused(self.parallel)
            self._ready.set()
            return
        from mlxspec.serve import batch

        # a packed pass runs eager, and a reply must have the bits it has alone: every pass eager
        session.lm.model.compiled = None
        self.slots = batch.Slots(session.lm.model)
        sessions = [batch.slot_session(session, self.slots, options.draft, options.k, options.tree)
                    for _ in range(self.parallel)]
        self._ready.set()

        def take(block: bool) -> Job | None | object:
            # A request that starts with a chunk of a prompt still being prefilled (a client's
            # retry) waits for it, as with one slot, then starts from the chunks it leaves kept.
            for job in list(self._waiting):
                if not self._behind_a_prefill(job):
                    self._waiting.remove(job)
                    return job
            while True:
                try:
                    job = self.jobs.get(block=block)
                except queue.Empty:
                    return batch.NO_JOB
                if job is None or not self._behind_a_prefill(job):
                    return job
                self._waiting.append(job)

        def decode(job: Job, slot: Session) -> None:
            self._running[id(job)] = job
            try:
                self._decode(job, slot, serves_waiting=False)
            finally:
                del self._running[id(job)]

        self.slots.serve(sessions, take, decode)
        while self._waiting:  # stopped before their turn
            job = self._waiting.popleft()
            job.items.put(shutting_down())
            job.items.put(_END)

    def _behind_a_prefill(self, job: Job) -> bool:
        return any(not other.prefilled and common_prefix(job.ids, other.ids) >= PREFILL_CHUNK
                   for other in self._running.values())

    def _next_job(self) -> Job | None:
        """The next request: first those a long prompt left waiting for its cache, then the queue."""
        return self._waiting.popleft() if self._waiting else self.jobs.get()

    def _serve_waiting(self, session: Session, ids: list[int]) -> None:
        """Decode, each whole, the requests queued behind the long prompt ``ids``, between two of
        its chunks (the engine's ``interrupt``), so that it holds them for a chunk, not for its
        whole length. They do not serve others in turn. One that starts with a chunk of the same
        prompt (a client's retry) waits for it instead, and then starts from its cache. The
        others' caches are their own: a kept cache a request extends is handed over to it, others
        are copied (``PromptCache.take``)."""
        while not self._closing.is_set():
            try:
                other = self.jobs.get_nowait()
            except queue.Empty:
                return
            if other is None:  # close() asked: the main loop stops on it
                self.jobs.put(None)
                return
            if common_prefix(other.ids, ids) >= PREFILL_CHUNK:
                self._waiting.append(other)
                continue
            outer, self._current = self._current, other
            self.served_between_chunks += 1
            try:
                self._decode(other, session, serves_waiting=False)
            finally:
                self._current = outer

    def _cancelled(self, job: Job) -> None:
        self.cancelled += 1
        if self._closing.is_set():
            job.items.put(shutting_down())

    def _decode(self, job: Job, session: Session, serves_waiting: bool = True) -> None:
        if self._closing.is_set():
            job.items.put(shutting_down())
        if job.cancel.is_set() or self._closing.is_set():  # its client left while it queued, or we stop
            job.items.put(_END)
            return

        def between_chunks() -> bool:
            if serves_waiting and not (job.cancel.is_set() or self._closing.is_set()):
                self._serve_waiting(session, job.ids)
            return job.cancel.is_set() or self._closing.is_set()

        # A request that continues a kept conversation prefills only what is new (keep=True). A
        # long prompt lets the requests queued behind it run between its chunks, and is given up
        # there once its client has left or we stop.
        events = session.stream(job.ids, job.params, job.max_tokens, job.seed, keep=True, logprobs=job.logprobs,
                                interrupt=prefill_watch(between_chunks, len(job.ids), self._log))
        try:
            for ev in events:
                job.prefilled = True
                job.items.put(ev)
                if job.cancel.is_set() and not isinstance(ev, Done):
                    self._cancelled(job)
                    break
        except Interrupted:
            self.interrupted_prefills += 1
            self._cancelled(job)
        except Exception as e:  # the handler turns it into an error response
            job.items.put(e)
        finally:
            events.close()
            ops_for(session.lm.model).synchronize()  # target-only decoding leaves one step in flight when stopped early
            job.items.put(_END)

