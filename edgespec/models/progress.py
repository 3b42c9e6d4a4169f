"""The progress protocol model fetching reports through (library code never prints; the CLI
passes an implementation):

    progress.start(task: str, total: int | None)  # a new task; total in bytes, None if unknown
    progress.advance(n: int)                       # n more bytes of the current task done
    progress.done()                                # the current task ended (success or not)

Tasks are sequential, never nested; every start() is followed by done(), even on error.
Within a Hugging Face download, start() may come more than once (the hub can open a new
bar per attempt); an implementation should treat a new start() as replacing the task.
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
