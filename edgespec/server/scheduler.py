"""Many generations at once: one engine thread runs every admitted request in shared target batches.

The Engine is not thread-safe (llama.cpp contexts, KV caches), so everything that touches it —
tokenizing, prefilling, decoding, closing — runs on this one thread. Requests (`Job`s) wait in an
admission queue ordered by priority (lower first, as vLLM) with aging, so a steady stream of urgent
requests cannot starve an old one. A job is admitted to a free slot (one KV sequence of the
engine): the slot whose cached prefix it shares most, so a continued chat or a re-edited file
reuses its KV. A slot about to be reused first saves what it holds to the prompt cache in host
memory (`cache` prompts, least recently used dropped first), so a document or file whose slot has
since served someone else is not read again when it comes back (backend.model.SavedSeq: kept as a
KV sequence of its own it would slow every pass of the others). Requests that arrive together and
begin alike (a system prompt, a document) read that prefix once: the later ones wait for the
first to read it, then copy it. Each step, `engine.batcher` gives
every slot still reading its prompt a chunk of it and every decoding slot its round, all in one
target pass; each slot's tokens go through its own `TextStream` (stop strings, UTF-8) to its job's
asyncio queue (`Started`, `Chunk`s, then `Final` or
`Failed`). A job cancelled while queued leaves the queue at once; one cancelled in a slot (client
gone) or a shutdown ends at the next step, within one prompt chunk, its slot's KV kept as a prefix
of what it emitted.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from ..drafters import common_prefix_len
from ..errors import BackendError, ContextError, EdgespecError
from ..generate import Chunk, Final, TextStream
from ..sampling import SamplingConfig
from ..speculative import SpeculativeDecoder
from .metrics import Metrics


@dataclass(frozen=True)
class Started:
    prompt_tokens: int


@dataclass(frozen=True)
class Failed:
    status: int
    message: str
    type: str = "invalid_request_error"
    code: str | None = None


SHUTTING_DOWN = Failed(503, "the server is shutting down", type="server_error", code="shutting_down")
# Every job ends with a Final or a Failed, so no handler waits forever; nobody reads this one.
CANCELLED = Failed(499, "the client closed the request", code="cancelled")

# Aging: a waiting request's priority improves by one level per AGING_S seconds waited, so a
# request behind a steady stream of more urgent ones is still served, at most this many seconds
# per level of difference later.
AGING_S = 10.0
# How often an idle engine thread looks for work. Signal handlers cannot safely take a lock or
# wake a condition, so the thread polls; this bounds the latency a new request waits when idle.
IDLE_POLL_S = 0.02


# A prefix another slot holds is copied into a new request's slot when it is this much longer than
# what that slot holds itself: a copy shares cells of the unified cache (or, with a KV stream per
# sequence, copies a stream in one go), reading a prompt chunk is a batch of target passes, but a
# few tokens are not worth a whole stream's copy.
MIN_SHARED_PREFIX = 16


class QueueFull(Exception):
    pass


class Stopping(Exception):
    pass


@dataclass(eq=False)  # a job is itself, not its fields (it is looked up in the queue)
class Job:
    prepare: Callable[[Any], Sequence[int]]  # engine -> prompt tokens (runs on the engine thread)
    sampling: SamplingConfig
    max_tokens: int
    stop: Sequence[str] = ()
    priority: int = 0  # lower is served first
    loop: asyncio.AbstractEventLoop = field(default_factory=asyncio.get_running_loop)
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    cancelled: threading.Event = field(default_factory=threading.Event)
    submitted: float = field(default_factory=time.monotonic)
    on_cancel: Callable[["Job"], None] | None = None  # set by the scheduler: leave the queue at once

    def cancel(self) -> None:
        self.cancelled.set()
        if self.on_cancel is not None:
            self.on_cancel(self)

    async def next(self):
        return await self.events.get()

    def emit(self, item) -> None:
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, item)
        except RuntimeError:
            pass  # the event loop is gone (server stopped): nobody is listening

    def rank(self, now: float) -> float:
        return self.priority - (now - self.submitted) / AGING_S


def failure(err: EdgespecError) -> Failed:
    if isinstance(err, ContextError):
        return Failed(400, err.message, code="context_length_exceeded")
    if isinstance(err, BackendError):
        return Failed(500, err.message, type="server_error")
    return Failed(400, err.message)


def internal(err: Exception) -> Failed:
    """An error no request caused: the request fails, the server goes on."""
    return Failed(500, f"internal error: {type(err).__name__}: {err}", type="server_error")


@dataclass
class _Active:
    job: Job
    slot: int
    decoder: SpeculativeDecoder
    text: TextStream
    tokens: Sequence[int] = ()  # the prompt
    last_token: float | None = None  # perf_counter() of the latest token; None until the first
    # The slot of a request still reading a prompt that begins as this one's does: this one waits
    # for it to read that prefix once, then takes it from its KV (None: not waiting).
    waits_for: int | None = None
    shared: int = 0  # how many tokens of the prompt that request reads for this one


class Scheduler:
    """Admission queue + slots + the engine thread. The server's only way to the engine."""

    def __init__(self, engine, max_queue: int, *, metrics: Metrics | None = None, cache: int = 0):
        self.engine = engine
        self.max_queue = max_queue
        self.n_slots = engine.n_seq  # a slot is a KV sequence of the engine
        if cache < 0:
            raise ValueError(f"a prompt cache of {cache} prompts")
        self.cache_size = cache
        self._cache: list = []  # SavedSeq of finished prompts, least recently used first
        self.metrics = metrics or Metrics()
        self._lock = threading.Lock()
        self._queue: list[Job] = []  # waiting, in arrival order (ranked when admitted)
        self._active: list[_Active] = []
        self._free = list(range(self.n_slots))
        self._admitting = 0  # taken from the queue, not yet in a slot (counted as busy by submit)
        self._seq = itertools.count()
        self.counts = {"requests": 0, "completed": 0, "cancelled": 0, "failed": 0, "tokens": 0}  # for /health
        self._stopping = False  # a plain flag: shutdown() runs in a signal handler and takes no lock
        self._thread = threading.Thread(target=self._run, name="edgespec-generate", daemon=True)
        self._thread.start()

    # ---- called from the event loop (and from signal handlers) ----------------------------
    def submit(self, job: Job) -> int:
        """Queue a job; returns how many requests are ahead of it. Raises QueueFull or Stopping."""
        with self._lock:
            if self._stopping:
                raise Stopping()
            free = self.n_slots - len(self._active) - self._admitting
            beyond = len(self._queue) + 1 - free  # requests that would wait for a slot, this one included
            if beyond > self.max_queue:
                raise QueueFull()
            job.on_cancel = self._dequeue
            self._queue.append(job)
            self.metrics.queue_depth.set(len(self._queue))
            return max(0, beyond - 1)

    def _dequeue(self, job: Job) -> None:
        with self._lock:
            if job in self._queue:
                self._queue.remove(job)
                self.counts["requests"] += 1
                self.counts["cancelled"] += 1
                self.metrics.finished("cancelled")
                self.metrics.queue_depth.set(len(self._queue))
                job.emit(CANCELLED)

    @property
    def waiting(self) -> int:
        return len(self._queue)

    @property
    def running(self) -> list[Job]:
        """The jobs in slots now."""
        return [a.job for a in list(self._active)]

    @property
    def busy(self) -> int:
        return len(self._active)

    @property
    def stopping(self) -> bool:
        return self._stopping

    def shutdown(self) -> None:
        """Stop every generation at its next step and fail every queued job. Signal-safe."""
        self._stopping = True

    def join(self, timeout: float | None = None) -> bool:
        self._thread.join(timeout)
        return not self._thread.is_alive()

    # ---- the engine thread ----------------------------------------------------------------
    def _run(self) -> None:
        while True:
            if self._stopping:
                self._stop_all()
                return
            self._admit()
            self._reap_cancelled()
            if not self._active:
                time.sleep(IDLE_POLL_S)
                continue
            try:
                self._step()
            except Exception as err:  # the thread must outlive any one batch
                self._fail_all(err)

    def _next_job(self) -> Job | None:
        with self._lock:
            if not self._queue or not self._free:
                return None
            now = time.monotonic()
            job = min(self._queue, key=lambda j: (j.rank(now), j.submitted))
            self._queue.remove(job)
            self._admitting += 1
            self.metrics.queue_depth.set(len(self._queue))
            self.counts["requests"] += 1
            return job

    def _admit(self) -> None:
        while (job := self._next_job()) is not None:
            if not self._start(job):
                with self._lock:
                    self._admitting -= 1

    def _start(self, job: Job) -> bool:
        """Tokenize, pick and fill a slot, begin the generation; False: the job failed (its one line sent)."""
        try:
            tokens = list(job.prepare(self.engine))
            slot = self._best_slot(tokens)
            self._share_prefix(slot, tokens)
            decoder = self.engine.decoder(job.sampling, seq=slot)
            decoder.start(tokens, job.max_tokens)
        except EdgespecError as err:
            self._end(job, failure(err), "failed")
            return False
        except Exception as err:
            self._end(job, internal(err), "failed")
            return False
        self._free.remove(slot)
        active = _Active(job, slot, decoder, TextStream(self.engine.target.token_bytes, job.stop), tokens)
        self._wait_for_a_reader(active)
        with self._lock:  # submit() counts slots as active + admitting: never both, never neither
            self._active.append(active)
            self._admitting -= 1
        self.metrics.busy_slots.set(len(self._active))
        if active.waits_for is None:
            self.metrics.prompt(len(tokens), decoder.stats.prompt_cached)
        job.emit(Started(len(tokens)))
        return True

    def _wait_for_a_reader(self, a: _Active) -> None:
        """Requests that arrive together often begin alike (a system prompt, a shared document): when
        one already in a slot is still reading a prompt that shares MIN_SHARED_PREFIX more tokens
        with this one than its slot holds, this one waits for that prefix to be read, then copies
        it (_start_waiting) instead of reading it a second time beside it."""
        held = len(self.engine.target.seq(a.slot).tokens)
        readers = [(common_prefix_len(r.tokens[:-1], a.tokens[:-1]), r.slot) for r in self._active
                   if r.waits_for is None and r.decoder.prefill_left and not r.decoder.done]
        n, slot = max(readers, default=(0, None))
        if slot is not None and n >= held + MIN_SHARED_PREFIX:
            a.waits_for, a.shared = slot, n

    def _start_waiting(self) -> None:
        """Requests whose reader has read their shared prefix (or is gone) take it and start reading."""
        target = self.engine.target
        reading = {r.slot: r for r in self._active if r.waits_for is None}
        for a in list(self._active):
            if a.waits_for is None:
                continue
            reader = reading.get(a.waits_for)
            if reader is not None and reader.decoder.prefill_left and not reader.decoder.done \
                    and common_prefix_len(target.seq(reader.slot).tokens, a.tokens) < a.shared:
                continue
            a.waits_for = None
            try:
                self._share_prefix(a.slot, a.tokens)
                a.decoder.start(a.tokens, a.job.max_tokens)
            except Exception as err:  # noqa: BLE001 - the request fails, the others go on
                self._release(a)
                self._end(a.job, failure(err) if isinstance(err, EdgespecError) else internal(err), "failed")
                continue
            self.metrics.prompt(len(a.tokens), a.decoder.stats.prompt_cached)

    def _best_slot(self, tokens: Sequence[int]) -> int:
        """The free slot whose KV shares the longest prefix with this prompt; then, with a prompt
        cache to keep what it holds, the lowest (with a KV stream per sequence llama.cpp runs
        consecutive sequence ids in one pass, so busy slots packed low batch best), else the emptiest."""
        target = self.engine.target

        def then(s: int) -> int:
            return -s if self.cache_size else -len(target.seq(s).tokens)

        return max(self._free, key=lambda s: (common_prefix_len(target.seq(s).tokens, tokens), then(s)))

    def _stash(self, slot: int, tokens: Sequence[int]) -> None:
        """Before the slot is reused, save what it holds to the prompt cache when the new prompt
        would overwrite MIN_SHARED_PREFIX tokens or more that neither another slot nor the cache
        holds; the least recently used saved prompt makes room."""
        target = self.engine.target
        held = list(target.seq(slot).tokens)
        if not self.cache_size or len(held) - common_prefix_len(held, tokens) < MIN_SHARED_PREFIX:
            return
        holders = [target.seq(s).tokens for s in range(self.engine.n_seq) if s != slot] + [c.tokens for c in self._cache]
        if any(common_prefix_len(h, held) == len(held) for h in holders):
            return
        # a saved prompt that is a prefix of this one is held twice once this one is saved
        self._cache = [c for c in self._cache if common_prefix_len(c.tokens, held) < c.n_tokens]
        del self._cache[: max(0, len(self._cache) + 1 - self.cache_size)]
        self._cache.append(target.seq(slot).save())
        self.metrics.prompt_cache_saved.inc()

    def _share_prefix(self, slot: int, tokens: Sequence[int]) -> None:
        """When another slot (free or busy) or the prompt cache holds a longer prefix of this prompt
        than the chosen slot, take that prefix's KV instead of reading it again (the same system
        prompt, document or file sent by several clients, or sent again). What the slot held goes to
        the prompt cache first."""
        target = self.engine.target
        own = common_prefix_len(target.seq(slot).tokens, tokens[:-1])
        donors = [(common_prefix_len(target.seq(s).tokens, tokens[:-1]), s, None)
                  for s in range(self.engine.n_seq) if s != slot]
        donors += [(common_prefix_len(c.tokens, tokens[:-1]), -1, c) for c in self._cache]
        n, donor, saved = max(donors, key=lambda d: (d[0], d[2] is None), default=(0, slot, None))
        useful = n >= own + MIN_SHARED_PREFIX
        if useful and saved is not None:
            # it moves into the slot (which saves it again, answer and all, when it is reused),
            # leaving room for what the slot holds now
            self._cache.remove(saved)
        self._stash(slot, tokens)
        if not useful:
            return
        if saved is None:
            target.seq(slot).copy_prefix(target.seq(donor), n)
        elif target.seq(slot).restore(saved, n):
            self.metrics.prompt_cache_restored.inc()
        else:  # no room for it in the cache's cells now: the prompt is read instead
            self._cache.append(saved)
            return
        self.metrics.shared_prefix_tokens.inc(n - own)

    def _step(self) -> None:
        self._start_waiting()
        active = [a for a in self._active if a.waits_for is None]
        if not active:
            return
        result = self.engine.batcher.step([a.decoder for a in active])
        self.metrics.rows_per_decode.observe(result.rows)
        now = time.perf_counter()
        for i, a in enumerate(active):
            for ev in result.events.get(i, ()):
                self.counts["tokens"] += 1
                chunk = a.text.feed(ev)
                if a.last_token is None:
                    self.metrics.ttft.observe(time.monotonic() - a.job.submitted)
                else:
                    self.metrics.inter_token.observe(now - a.last_token)
                a.last_token = now
                if a.text.stopped:
                    break
                if chunk is not None:
                    a.job.emit(chunk)
            if a.text.stopped or a.decoder.done:
                self._finish(a)

    def _finish(self, a: _Active) -> None:
        self._release(a)
        items = a.text.finish(a.decoder.stats, a.decoder.settings.mode, None)
        final = items[-1]
        assert isinstance(final, Final)
        self.metrics.completed(final.stats, a.decoder.stats.rounds)
        self.counts["completed"] += 1
        for item in items:
            a.job.emit(item)

    def _release(self, a: _Active) -> None:
        """The slot's generation is over: its KV keeps a prefix of what was emitted, for reuse."""
        self._active.remove(a)
        try:
            a.decoder.close()
        finally:
            self._free.append(a.slot)
            self.metrics.busy_slots.set(len(self._active))

    def _reap_cancelled(self) -> None:
        for a in [a for a in self._active if a.job.cancelled.is_set()]:
            self._release(a)
            self.counts["cancelled"] += 1
            self.metrics.finished("cancelled")
            a.job.emit(CANCELLED)

    def _end(self, job: Job, failed: Failed, outcome: str) -> None:
        self.counts[outcome] += 1
        self.metrics.finished(outcome)
        job.emit(failed)

    def _end_active(self, failed: Failed) -> None:
        """End every generation in a slot with `failed` (the batch broke, or the server stops)."""
        for a in list(self._active):
            try:
                self._release(a)
            except Exception:
                pass  # a cache that cannot be settled is reset below or freed with the engine
            self._end(a.job, failed, "failed")

    def _fail_all(self, err: Exception) -> None:
        self._end_active(failure(err) if isinstance(err, EdgespecError) else internal(err))
        if not isinstance(err, EdgespecError):
            self.engine.reset()  # after an unexpected failure the caches may not match their token lists

    def _stop_all(self) -> None:
        self._end_active(SHUTTING_DOWN)
        with self._lock:  # submit() checks for stopping and queues under this lock: nothing slips in after
            queued, self._queue = self._queue, []
        for job in queued:
            self.counts["requests"] += 1
            self._end(job, SHUTTING_DOWN, "failed")
