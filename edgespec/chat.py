"""The chat REPL's session, without a terminal: history, turns, commands, context trimming.

`ChatSession` owns the history and talks to an injected engine (anything with `chat_tokens` and
`stream`). The terminal loop that drives it is in commands/chat.py; render/chat.py draws with Rich.
The engine reuses its KV caches across turns by itself: each turn's prompt is the whole history,
and the decoder evaluates only what follows the prefix it already holds.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Mapping, Protocol, Sequence

from .errors import InputError
from .generate import Chunk, Final, GenerationStats, interrupt
from .sampling import SamplingConfig
from .template import ROLES, Message

BLOCK = '"""'  # fences multi-line input (commands/chat.py LineAssembler)

HELP = f"""\
Type a message and press Enter; the answer streams back. Commands:
  /help            this help
  /stats           stats of the last answer, plus session totals
  /reset           clear the history (the system message stays)
  /system [TEXT]   set the system message (clears the cached prompt); no TEXT shows it
  /save FILE       write the history as JSON
  /load FILE       replace the history with one saved by /save
  /exit            leave (or Ctrl-D)
Multi-line input: end a line with \\ to continue it on the next line, or put {BLOCK} on a line
to open a block and {BLOCK} again to close it. A message that starts with / is sent as text
if you double the slash (//etc -> /etc).
Ctrl-C stops the answer being written (it stays in the history, marked interrupted);
at the prompt it clears the line. A second Ctrl-C stops at once, even before the first token."""


@dataclass(frozen=True)
class ChatMessage(Message):
    interrupted: bool = False  # the user stopped this answer part-way


@dataclass(frozen=True)
class Notice:
    """Something the session did on its own (e.g. dropped old turns); shown as one line."""

    text: str


@dataclass(frozen=True)
class CommandResult:
    action: str  # "ok" (print message) | "error" | "help" | "stats" | "exit"
    message: str = ""


# The GenerationStats counters a session adds up as they are, answer after answer.
SUMMED = ("tokens", "prompt_tokens", "prompt_cached", "drafted", "accepted")


@dataclass(frozen=True)
class SessionTotals:
    """What a session's answers add up to; `sums` holds each SUMMED counter under its name."""

    answers: int = 0
    interrupted: int = 0
    # Only answers that produced a token: an empty one adds time and no tokens to the mean speed.
    gen_s: float = 0.0
    sums: Mapping[str, int] = field(default_factory=lambda: dict.fromkeys(SUMMED, 0))

    def plus(self, s: GenerationStats) -> SessionTotals:
        """These totals with one more answer."""
        return SessionTotals(
            answers=self.answers + 1,
            interrupted=self.interrupted + (s.finish_reason == "interrupted"),
            gen_s=self.gen_s + (s.gen_s if s.tokens else 0.0),
            sums={name: n + getattr(s, name) for name, n in self.sums.items()},
        )

    @property
    def tokens_per_s(self) -> float:
        return self.sums["tokens"] / self.gen_s if self.gen_s else 0.0

    @property
    def acceptance_rate(self) -> float:
        drafted = self.sums["drafted"]
        return self.sums["accepted"] / drafted if drafted else 0.0


class ChatEngine(Protocol):
    def chat_tokens(self, messages: Sequence[Message]) -> list[int]: ...

    def stream(self, prompt: Sequence[int], sampling: SamplingConfig, *, max_tokens: int, stop: Sequence[str]) -> Iterator[Chunk | Final]: ...


def _never() -> bool:
    return False


def _context_size(engine) -> int | None:
    """The target's context, for an Engine; None (no trimming) for an engine that does not say."""
    target = getattr(engine, "target", None)
    return getattr(target, "n_ctx", None) or getattr(engine, "n_ctx", None)


class ChatSession:
    def __init__(
        self,
        engine: ChatEngine,
        sampling: SamplingConfig = SamplingConfig(),
        *,
        max_tokens: int = 512,
        stop: Sequence[str] = (),
        system: str | None = None,
        n_ctx: int | None = None,
        auto_trim: bool = True,
    ):
        self.engine = engine
        self.sampling = sampling
        self.max_tokens = max_tokens
        self.stop = tuple(stop)
        self.n_ctx = n_ctx if n_ctx is not None else _context_size(engine)
        self.auto_trim = auto_trim
        self.history: list[ChatMessage] = [ChatMessage("system", system)] if system else []
        self.last_stats: GenerationStats | None = None
        self.totals = SessionTotals()

    # ---- a turn --------------------------------------------------------------------------
    def send(self, text: str, stop_requested: Callable[[], bool] = _never) -> Iterator[Chunk | Final | Notice]:
        """Stream the answer to `text`. When `stop_requested()` turns true the answer ends early."""
        if not text.strip():
            raise InputError("empty message")
        before = list(self.history)
        self.history.append(ChatMessage("user", text))
        try:
            tokens, notice = self._fit()
            stream = self.engine.stream(tokens, self.sampling, max_tokens=self.max_tokens, stop=self.stop)
        except BaseException:
            self.history = before  # a turn that never started leaves no trace
            raise
        if notice:
            try:
                yield notice
            except BaseException:  # closed before the answer began
                stream.close()
                self.history.pop()
                raise
        yield from self._run(stream, stop_requested)

    def _run(self, stream: Iterator[Chunk | Final], stop_requested: Callable[[], bool]) -> Iterator[Chunk | Final]:
        parts: list[str] = []
        done = stopping = False
        try:
            item = next(stream, None)
            while item is not None:
                if isinstance(item, Final):
                    done = True
                    self._finish(item.text, item.finish_reason == "interrupted", item.stats)
                    yield item
                    return
                parts.append(item.text)
                yield item
                if not stopping and stop_requested():
                    stopping = True
                    item = interrupt(stream)
                else:
                    item = next(stream, None)
        except BaseException:  # the consumer closed us, a hard Ctrl-C, or an engine error
            if not done:
                stream.close()  # lets the decoder settle its KV caches
                self._finish("".join(parts), True, None)
            raise
        self._finish("".join(parts), True, None)  # a stream that ended without its Final

    def _finish(self, text: str, interrupted: bool, stats: GenerationStats | None) -> None:
        if interrupted and not text:
            self.history.pop()  # nothing was said: forget the question too
        else:
            self.history.append(ChatMessage("assistant", text, interrupted=interrupted))
        if stats is not None:
            self.last_stats = stats
            self.totals = self.totals.plus(stats)

    # ---- the context ---------------------------------------------------------------------
    def _reserve(self) -> int:
        return min(self.max_tokens, (self.n_ctx or 0) // 4)

    def _fit(self) -> tuple[list[int], Notice | None]:
        """The prompt tokens; drops the oldest turns first if the history outgrew the context."""
        tokens = self.engine.chat_tokens(self.history)
        if not self.auto_trim or self.n_ctx is None or len(tokens) + self._reserve() <= self.n_ctx:
            return tokens, None
        # Trim to half the room, not just below it: trimming changes the prompt's start, so the
        # cached prefix is lost; doing it rarely keeps most turns cheap.
        goal = (self.n_ctx - self._reserve()) // 2
        dropped = 0
        while len(tokens) > goal and self._drop_oldest_turn():
            dropped += 1
            tokens = self.engine.chat_tokens(self.history)
        if not dropped:
            return tokens, None
        turns = "turn" if dropped == 1 else "turns"
        return tokens, Notice(f"context full: dropped the {dropped} oldest {turns} (history now {len(tokens)} of {self.n_ctx} tokens)")

    def _drop_oldest_turn(self) -> bool:
        """Remove the first user message and its answer; never the system message or the new question."""
        start = next((i for i, m in enumerate(self.history) if m.role != "system"), None)
        last_user = max((i for i, m in enumerate(self.history) if m.role == "user"), default=None)
        if start is None or start == last_user:
            return False
        end = next((i for i in range(start + 1, len(self.history)) if self.history[i].role == "user"), len(self.history))
        del self.history[start:end]
        return True

    # ---- commands ------------------------------------------------------------------------
    def handle_command(self, line: str) -> CommandResult:
        name, _, arg = line.strip().partition(" ")
        handler = {
            "/help": lambda a: CommandResult("help", HELP),
            "/?": lambda a: CommandResult("help", HELP),
            "/stats": self._cmd_stats,
            "/reset": self._cmd_reset,
            "/system": self._cmd_system,
            "/save": self._cmd_save,
            "/load": self._cmd_load,
            "/exit": lambda a: CommandResult("exit"),
            "/quit": lambda a: CommandResult("exit"),
        }.get(name.lower())
        if handler is None:
            return CommandResult("error", f"unknown command {name}; /help lists them")
        return handler(arg.strip())

    def _cmd_stats(self, arg: str) -> CommandResult:
        if self.last_stats is None:
            return CommandResult("ok", "no answer yet")
        return CommandResult("stats")

    def _cmd_reset(self, arg: str) -> CommandResult:
        self.reset()
        return CommandResult("ok", "history cleared")

    def _cmd_system(self, arg: str) -> CommandResult:
        if not arg:
            current = self.system
            return CommandResult("ok", f"system message: {current}" if current else "no system message")
        self.set_system(arg)
        return CommandResult("ok", "system message set")

    def _cmd_save(self, arg: str) -> CommandResult:
        if not arg:
            return CommandResult("error", "usage: /save FILE")
        try:
            path = self.save(arg)
        except OSError as err:
            return CommandResult("error", f"cannot save to {arg}: {err.strerror or err}")
        return CommandResult("ok", f"saved {len(self.history)} messages to {path}")

    def _cmd_load(self, arg: str) -> CommandResult:
        if not arg:
            return CommandResult("error", "usage: /load FILE")
        try:
            self.load(arg)
        except InputError as err:
            return CommandResult("error", err.message)
        return CommandResult("ok", f"loaded {len(self.history)} messages from {arg}")

    # ---- history -------------------------------------------------------------------------
    @property
    def system(self) -> str | None:
        return self.history[0].content if self.history and self.history[0].role == "system" else None

    def reset(self) -> None:
        self.history = [m for m in self.history[:1] if m.role == "system"]

    def set_system(self, text: str) -> None:
        rest = self.history[1:] if self.system is not None else self.history
        self.history = [ChatMessage("system", text), *rest]

    def save(self, path: str | Path) -> Path:
        path = Path(path).expanduser()
        data = {"format": "edgespec-chat", "version": 1, "messages": [_message_json(m) for m in self.history]}
        path.write_text(json.dumps(data, ensure_ascii=False, indent=2) + "\n", encoding="utf-8")
        return path

    def load(self, path: str | Path) -> None:
        """Replace the history with a saved one; on any problem raise InputError and change nothing."""
        self.history = read_history(Path(path).expanduser())

    def drop_cache(self) -> None:
        """Forget the models' KV caches (after a hard interrupt they may not match their token lists)."""
        self.engine.reset()


def _message_json(m: ChatMessage) -> dict:
    data = {"role": m.role, "content": m.content}
    if m.interrupted:
        data["interrupted"] = True
    return data


def read_history(path: Path) -> list[ChatMessage]:
    def bad(why: str) -> InputError:
        return InputError(f"cannot load {path}: {why}")

    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise bad("no such file") from None
    except (OSError, UnicodeDecodeError) as err:
        raise bad(getattr(err, "strerror", None) or str(err)) from None
    except json.JSONDecodeError as err:
        raise bad(f"not JSON ({err.msg}, line {err.lineno})") from None
    items = data.get("messages") if isinstance(data, dict) else data  # a bare list is accepted too
    if not isinstance(items, list):
        raise bad('expected {"messages": [...]} as written by /save')
    return [_read_message(item, i, bad) for i, item in enumerate(items)]


def _read_message(item, i: int, bad) -> ChatMessage:
    if not isinstance(item, dict) or not isinstance(item.get("content"), str):
        raise bad(f"message {i + 1} needs a string 'content'")
    role = item.get("role")
    if role not in ROLES:
        raise bad(f"message {i + 1} has role {role!r}; use one of {', '.join(ROLES)}")
    if role == "system" and i != 0:
        raise bad(f"message {i + 1}: a system message can only come first")
    return ChatMessage(role, item["content"], interrupted=bool(item.get("interrupted", False)))
