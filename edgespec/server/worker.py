"""One generation at a time: a worker thread owns the Engine; requests wait in a bounded queue.

The Engine is not thread-safe (llama.cpp contexts, KV caches, the controller), so everything that
touches it — tokenizing, generating, closing — runs on this one thread. Each request is a `Job`:
the worker pushes its events (`Started`, then the Engine's `Chunk`s and `Final`, or a `Failed`)
onto the job's asyncio queue from the thread. Cancelling a job (client gone) or shutting down stops
its generation at the next token; closing the Engine's stream leaves the KV caches consistent, so
the next request reuses whatever prefix it shares with them.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from ..errors import BackendError, ContextError, EdgespecError
from ..generate import Final
from ..sampling import SamplingConfig


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


class QueueFull(Exception):
    pass


class Stopping(Exception):
    pass


@dataclass
class Job:
    prepare: Callable[[Any], Sequence[int]]  # engine -> prompt tokens (runs on the worker thread)
    sampling: SamplingConfig
    max_tokens: int
    stop: Sequence[str] = ()
    loop: asyncio.AbstractEventLoop = field(default_factory=asyncio.get_running_loop)
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    cancelled: threading.Event = field(default_factory=threading.Event)

    def cancel(self) -> None:
        self.cancelled.set()

    async def next(self):
        return await self.events.get()

    def emit(self, item) -> None:
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, item)
        except RuntimeError:
            pass  # the event loop is gone (server stopped): nobody is listening


def _failure(err: EdgespecError) -> Failed:
    if isinstance(err, ContextError):
        return Failed(400, err.message, code="context_length_exceeded")
    if isinstance(err, BackendError):
        return Failed(500, err.message, type="server_error")
    return Failed(400, err.message)


class Worker:
    def __init__(self, engine, max_queue: int):
        self.engine = engine
        self.max_queue = max_queue
        self._jobs: queue.Queue[Job] = queue.Queue()
        self._lock = threading.Lock()
        self._waiting = 0
        self.current: Job | None = None  # the job generating now
        self.counts = {"requests": 0, "completed": 0, "cancelled": 0, "failed": 0, "tokens": 0}  # for /health
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="edgespec-generate", daemon=True)
        self._thread.start()

    # ---- called from the event loop (and from signal handlers) ----------------------------
    def submit(self, job: Job) -> int:
        """Queue a job; returns how many are ahead of it. Raises QueueFull or Stopping."""
        with self._lock:
            if self._stopping.is_set():
                raise Stopping()
            ahead = self._waiting + (self.current is not None)
            if ahead > self.max_queue:
                raise QueueFull()
            self._waiting += 1
            self._jobs.put(job)
            return ahead

    @property
    def waiting(self) -> int:
        return self._waiting

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    def shutdown(self) -> None:
        """Stop the current generation at its next token and fail every queued job. Signal-safe."""
        self._stopping.set()

    def join(self, timeout: float | None = None) -> bool:
        self._thread.join(timeout)
        return not self._thread.is_alive()

    # ---- the worker thread ----------------------------------------------------------------
    def _run(self) -> None:
        while True:
            try:
                # Polled, not woken: shutdown() runs in a signal handler and must take no lock.
                job = self._jobs.get(timeout=0.2)
            except queue.Empty:
                if self._stopping.is_set():
                    self._drain()
                    return
                continue
            with self._lock:
                self._waiting -= 1
                self.current = job
                self.counts["requests"] += 1
            try:
                if self._stopping.is_set():
                    job.emit(SHUTTING_DOWN)
                elif job.cancelled.is_set():
                    self.counts["cancelled"] += 1
                    job.emit(CANCELLED)
                else:
                    self._generate(job)
            except Exception as err:  # the thread must outlive any one request
                job.emit(Failed(500, f"internal error: {type(err).__name__}: {err}", type="server_error"))
            finally:
                with self._lock:
                    self.current = None

    def _drain(self) -> None:
        with self._lock:  # submit() checks for stopping and queues under this lock: nothing slips in after
            while True:
                try:
                    job = self._jobs.get_nowait()
                except queue.Empty:
                    return
                job.emit(SHUTTING_DOWN)

    def _generate(self, job: Job) -> None:
        engine, counts = self.engine, self.counts
        try:
            tokens = list(job.prepare(engine))
            items = engine.stream(tokens, job.sampling, max_tokens=job.max_tokens, stop=job.stop)
        except EdgespecError as err:
            counts["failed"] += 1
            job.emit(_failure(err))
            return
        job.emit(Started(len(tokens)))
        end: Failed | Final | None = None
        broken = False
        try:
            for item in items:
                if isinstance(item, Final):
                    end = item
                    break
                counts["tokens"] += len(item.sources)
                if job.cancelled.is_set():
                    end = CANCELLED
                    break
                if self._stopping.is_set():
                    end = SHUTTING_DOWN
                    break
                job.emit(item)
        except EdgespecError as err:
            end = _failure(err)
        except Exception as err:  # never let one request take the server down
            end = Failed(500, f"internal error: {type(err).__name__}: {err}", type="server_error")
            broken = True
        finally:
            items.close()  # stops generation and settles the KV caches
        if broken:
            engine.reset()  # after an unexpected failure the caches may not match their token lists
        if end is None:
            end = Failed(500, "generation ended without a result", type="server_error")
        counts["completed" if isinstance(end, Final) else "cancelled" if end is CANCELLED else "failed"] += 1
        job.emit(end)
