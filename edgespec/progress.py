"""Progress: how long-running library work (downloads, hashing, profile measurement) reports how
far it has got. Library code never prints; the CLI passes an implementation (render/common.py
draws one with Rich), and NullProgress reports nothing.

    progress.start(task: str, total: int | None)  # a new task; total in bytes or steps, None if unknown
    progress.advance(n: int)                       # n more of the current task done
    progress.done()                                # the current task ended (success or not)

Tasks are sequential, never nested; every start() is followed by done(), even on error.
Within a Hugging Face download, start() may come more than once (the hub can open a new
bar per attempt); an implementation should treat a new start() as replacing the task.

(A benchmark's per-run reports are events, not progress: bench.runner.BenchEvent.)
"""

from __future__ import annotations

from typing import Protocol


class Progress(Protocol):
    def start(self, task: str, total: int | None) -> None: ...

    def advance(self, n: int) -> None: ...

    def done(self) -> None: ...


class NullProgress:
    """Reports nothing."""

    def start(self, task: str, total: int | None) -> None:
        pass

    def advance(self, n: int) -> None:
        pass

    def done(self) -> None:
        pass
