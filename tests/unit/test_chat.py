"""ChatSession and the REPL loop over a fake engine (a small BPE tokenizer, a simulated KV cache)."""

from __future__ import annotations

import json
import signal
import time
from dataclasses import replace

import pytest

from edgespec.chat import ChatMessage, ChatSession, Notice, SessionTotals
from edgespec.commands.chat import CONTINUATION, PROMPT, LineAssembler, is_command, run_repl, soft_sigint
from edgespec.errors import ContextError, InputError
from edgespec.generate import Chunk, Final, stream
from edgespec.render.chat import totals_table
from edgespec.speculative import LoopStats, TokenEvent

ROLE_TOKENS = {"system": 1001, "user": 1002, "assistant": 1003}
END = 1000

# BPE merges in rank order (a single character's token is its code point; a merge's is 2000 + rank).
# A model may write a word piece by piece that the tokenizer would have merged ("he" "l" "l" "o"
# where "hell" "o" tokenizes it): re-tokenised, such an answer no longer matches what the KV cache
# holds, and only the prefix up to there can be reused, as with a real BPE vocabulary.
MERGES = [("h", "e"), ("l", "l"), ("he", "ll"), ("a", "n"), ("e", "r"), (" ", "w")]
PIECE_IDS = {a + b: 2000 + rank for rank, (a, b) in enumerate(MERGES)}
PIECES = {i: piece for piece, i in PIECE_IDS.items()}


def bpe(text: str) -> list[int]:
    """Byte-pair encoding: merge the best-ranked adjacent pair everywhere, until none is left."""
    ranks = {pair: rank for rank, pair in enumerate(MERGES)}
    parts = list(text)
    while True:
        found = [ranks[pair] for pair in zip(parts, parts[1:]) if pair in ranks]
        if not found:
            return [PIECE_IDS[p] if len(p) > 1 else ord(p) for p in parts]
        pair = MERGES[min(found)]
        merged, i = [], 0
        while i < len(parts):
            if tuple(parts[i : i + 2]) == pair:
                merged.append(parts[i] + parts[i + 1])
                i += 2
            else:
                merged.append(parts[i])
                i += 1
        parts = merged


def piece(token: int) -> str:
    return PIECES.get(token) or chr(token)


class FakeEngine:
    """chat_tokens/stream like Engine's. The prompt is the history tokenised with `bpe`; the answer
    is written one character per token (`canonical`: in bpe's tokens), so the next turn's prompt
    re-tokenises it and may differ from the cache from there on, as with a real model.

    `on_token(i)` runs inside the "decode" of the i-th answer token: a KeyboardInterrupt raised there
    (a second Ctrl-C) leaves the caches not matching their token lists, as llama.cpp's may, and the
    next turn fails unless `reset()` was called in between."""

    def __init__(self, reply: str = "hello world", n_ctx: int = 10_000, *, canonical: bool = False, on_token=None):
        self.reply = reply
        self.reply_tokens = bpe(reply) if canonical else [ord(c) for c in reply]
        self.n_ctx = n_ctx
        self.on_token = on_token or (lambda i: None)
        self.cache: list[int] = []  # what the "KV cache" holds after each generation settles
        self.prompts: list[list[int]] = []
        self.closed = 0
        self.resets = 0
        self.dirty = False  # a decode was interrupted part-way: the caches cannot be trusted

    def reset(self, *, forget_learning=False):
        self.resets += 1
        self.cache = []
        self.dirty = False

    def chat_tokens(self, messages):
        tokens = []
        for m in messages:
            tokens += [ROLE_TOKENS[m.role], *bpe(m.content), END]
        return tokens + [ROLE_TOKENS["assistant"]]

    def stream(self, prompt, sampling, *, max_tokens, stop=()):
        assert not self.dirty, "a turn over caches that an interrupted decode left unknown (no reset)"
        if len(prompt) >= self.n_ctx:
            raise ContextError(f"the prompt is {len(prompt)} tokens but the context holds {self.n_ctx}")
        self.prompts.append(list(prompt))
        self.loop = LoopStats(start=time.perf_counter())
        return stream(self._events(list(prompt), max_tokens), lambda t: piece(t).encode(), lambda: self.loop, mode="off", stop=stop)

    def _events(self, ctx, max_tokens):
        common = 0
        while common < min(len(self.cache), len(ctx) - 1) and self.cache[common] == ctx[common]:
            common += 1
        self.loop.prompt_tokens, self.loop.prompt_cached = len(ctx), common
        try:
            for i, tok in enumerate(self.reply_tokens[:max_tokens]):
                try:
                    self.on_token(i)
                except KeyboardInterrupt:
                    self.dirty = True
                    raise
                ctx.append(tok)
                self.loop.token_times.append(time.perf_counter())
                self.loop.sources.append("target")
                yield TokenEvent(tok, "target", i)
            self.loop.finish_reason = "stop" if len(self.reply_tokens) <= max_tokens else "length"
        finally:
            self.cache = ctx  # settled: the prompt plus what was emitted
            self.closed += 1


def test_fake_tokenizer_merges_like_bpe():
    assert bpe("hello") == [PIECE_IDS["hell"], ord("o")]
    assert "".join(piece(t) for t in bpe("hello world, answer")) == "hello world, answer"
    assert bpe("ok") == [ord("o"), ord("k")]


def drain(items):
    return [i for i in items]


def final_of(items) -> Final:
    return next(i for i in items if isinstance(i, Final))


# ---- turns and the cache ------------------------------------------------------------------------
def test_turn_streams_and_records_history():
    s = ChatSession(FakeEngine("hi there"), system="be brief")
    items = drain(s.send("hello"))
    assert "".join(i.text for i in items if isinstance(i, Chunk)) == "hi there"
    assert final_of(items).finish_reason == "stop"
    assert [(m.role, m.content) for m in s.history] == [("system", "be brief"), ("user", "hello"), ("assistant", "hi there")]
    assert s.last_stats.tokens == 8 and s.totals.answers == 1


@pytest.mark.parametrize("reply, canonical", [("ok, do it", False), ("hello world", True)])
def test_second_turn_reuses_the_whole_first_turn_when_it_retokenises_the_same(reply, canonical):
    eng = FakeEngine(reply, canonical=canonical)
    s = ChatSession(eng)
    first = final_of(drain(s.send("question one")))
    second = final_of(drain(s.send("question two")))
    assert first.stats.prompt_cached == 0
    # everything up to the end of the first answer was cached; only the new turn was evaluated
    assert second.stats.prompt_cached == len(eng.prompts[0]) + len(bpe(reply))
    assert s.totals.sums["prompt_cached"] == second.stats.prompt_cached and s.totals.answers == 2


def test_second_turn_rereads_an_answer_that_retokenises_differently():
    eng = FakeEngine("hello answer")  # written letter by letter; the prompt merges "hell", "an", "er"
    s = ChatSession(eng)
    drain(s.send("question one"))
    answer_cached = eng.cache[len(eng.prompts[0]) :]
    second = final_of(drain(s.send("question two")))
    assert answer_cached == [ord(c) for c in "hello answer"]
    assert eng.prompts[1][len(eng.prompts[0]) :][:2] == [PIECE_IDS["hell"], ord("o")]
    # the cache is reused up to the first token that differs (here the answer's first), not beyond
    assert second.stats.prompt_cached == len(eng.prompts[0])
    assert s.history[-1] == ChatMessage("assistant", "hello answer")


def test_stop_requested_interrupts_and_keeps_partial_answer():
    eng = FakeEngine("a long answer")
    s = ChatSession(eng)
    seen = []
    items = drain(_collect(s, seen))
    final = final_of(items)
    assert final.finish_reason == "interrupted"
    assert s.history[-1] == ChatMessage("assistant", "a l", interrupted=True)
    assert eng.closed == 1 and eng.cache[-3:] == [ord("a"), ord(" "), ord("l")]
    assert s.totals.interrupted == 1
    # the session goes on, and the next prompt extends the cached one
    nxt = final_of(drain(s.send("more")))
    assert nxt.finish_reason == "stop" and nxt.stats.prompt_cached > 0


def _collect(s, seen):
    for item in s.send("go", stop_requested=lambda: len(seen) >= 3):
        if isinstance(item, Chunk):
            seen.append(item)
        yield item


def test_closing_the_answer_keeps_partial_marked_interrupted():
    eng = FakeEngine("abcdef")
    s = ChatSession(eng)
    gen = s.send("q")
    next(gen), next(gen)
    gen.close()
    assert s.history[-1] == ChatMessage("assistant", "ab", interrupted=True)
    assert eng.closed == 1  # the engine's stream was closed, so its caches settled


def test_interrupt_before_any_text_forgets_the_question():
    s = ChatSession(FakeEngine("abc"), system="sys")
    gen = s.send("q")
    gen.close()  # never started
    assert [m.role for m in s.history] == ["system"]


def test_empty_message_is_refused():
    s = ChatSession(FakeEngine())
    with pytest.raises(InputError):
        drain(s.send("   "))
    assert s.history == []


# ---- the context --------------------------------------------------------------------------------
def test_overflow_drops_oldest_turns_and_says_so():
    eng = FakeEngine("x" * 20, n_ctx=200)
    s = ChatSession(eng, max_tokens=20, system="S")
    items = [item for i in range(8) for item in s.send(f"question number {i}")]
    notices = [i.text for i in items if isinstance(i, Notice)]
    assert notices and all(n.startswith("context full: dropped the") for n in notices)
    assert s.history[0] == ChatMessage("system", "S")  # kept
    assert s.history[-2].content == "question number 7"
    assert all(len(p) + 20 <= 200 for p in eng.prompts)  # every prompt left room for the answer
    assert len(eng.prompts) == 8


def test_overflow_notice_when_trimming():
    eng = FakeEngine("y" * 10, n_ctx=120)
    s = ChatSession(eng, max_tokens=10)
    s.history = [ChatMessage("user", "u" * 40), ChatMessage("assistant", "a" * 40), ChatMessage("user", "v" * 30), ChatMessage("assistant", "b" * 30)]
    items = drain(s.send("new"))
    notice = next(i for i in items if isinstance(i, Notice))
    assert "dropped the 2 oldest turns" in notice.text
    assert [m.content for m in s.history] == ["new", "y" * 10]


def test_too_long_message_is_an_error_and_history_is_intact():
    eng = FakeEngine(n_ctx=50)
    s = ChatSession(eng, max_tokens=10)
    drain(s.send("hi"))
    before = list(s.history)
    with pytest.raises(ContextError):
        drain(s.send("z" * 100))
    assert s.history == before


def test_no_trim_leaves_history_to_the_engine():
    eng = FakeEngine(n_ctx=60)
    s = ChatSession(eng, max_tokens=10, auto_trim=False)
    s.history = [ChatMessage("user", "u" * 30), ChatMessage("assistant", "a" * 30)]
    before = list(s.history)
    with pytest.raises(ContextError):
        drain(s.send("new"))
    assert s.history == before


# ---- commands -----------------------------------------------------------------------------------
def test_command_parsing():
    s = ChatSession(FakeEngine())
    assert s.handle_command("/exit").action == "exit"
    assert s.handle_command("/QUIT").action == "exit"
    assert s.handle_command("/help").action == "help" and "/save FILE" in s.handle_command("/help").message
    assert s.handle_command("/stats").message == "no answer yet"
    assert s.handle_command("/nope").action == "error"
    assert s.handle_command("/save").action == "error"
    assert s.handle_command("/load").action == "error"
    assert is_command("/stats") and not is_command("//etc") and not is_command("/a\nb") and not is_command("hi")


def test_totals_add_up_the_answers_and_time_only_those_with_tokens():
    s = ChatSession(FakeEngine("hi there"))
    answer = final_of(drain(s.send("hello"))).stats
    empty = replace(answer, tokens=0, prompt_cached=3, drafted=4, accepted=1, gen_s=9.0, finish_reason="interrupted")
    t = SessionTotals().plus(replace(answer, drafted=4, accepted=3, gen_s=2.0)).plus(empty)
    assert (t.answers, t.interrupted, t.gen_s) == (2, 1, 2.0)
    assert t.sums == {"tokens": 8, "prompt_tokens": 2 * answer.prompt_tokens, "prompt_cached": 3, "drafted": 8, "accepted": 4}
    assert (t.tokens_per_s, t.acceptance_rate) == (4.0, 0.5)
    rows = list(zip(*(c.cells for c in totals_table(t).columns)))
    assert rows[1:3] == [("tokens generated", "8"), ("mean speed", "4.00 tok/s")] and rows[-1] == ("drafted / accepted", "4/8 (50%)")
    assert SessionTotals().tokens_per_s == SessionTotals().acceptance_rate == 0.0


def test_stats_after_an_answer():
    s = ChatSession(FakeEngine())
    drain(s.send("q"))
    assert s.handle_command("/stats").action == "stats"


def test_system_and_reset():
    s = ChatSession(FakeEngine())
    assert s.handle_command("/system").message == "no system message"
    s.handle_command("/system  be terse ")
    assert s.system == "be terse"
    drain(s.send("q"))
    s.handle_command("/system be kind")
    assert [m.role for m in s.history] == ["system", "user", "assistant"] and s.system == "be kind"
    assert s.handle_command("/reset").action == "ok"
    assert s.history == [ChatMessage("system", "be kind")]


def test_save_load_round_trip(tmp_path):
    s = ChatSession(FakeEngine("partial answer"), system="sys")
    drain(s.send("q1"))
    gen = s.send("q2 with <|im_end|> inside")
    next(gen)
    gen.close()
    path = tmp_path / "h.json"
    assert s.handle_command(f"/save {path}").action == "ok"
    data = json.loads(path.read_text())
    assert data["messages"][-1] == {"role": "assistant", "content": "p", "interrupted": True}
    t = ChatSession(FakeEngine())
    assert t.handle_command(f"/load {path}").action == "ok"
    assert t.history == s.history


@pytest.mark.parametrize(
    "content, why",
    [
        (None, "no such file"),
        ("{not json", "not JSON"),
        ('{"messages": 3}', "expected"),
        ('[{"role": "robot", "content": "x"}]', "role 'robot'"),
        ('[{"role": "user"}]', "string 'content'"),
        ('[{"role": "user", "content": "x"}, {"role": "system", "content": "y"}]', "only come first"),
        (b"\xff\xfe", "cannot load"),
    ],
)
def test_bad_load_is_one_error_and_history_intact(tmp_path, content, why):
    s = ChatSession(FakeEngine())
    drain(s.send("keep me"))
    before = list(s.history)
    path = tmp_path / "bad.json"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)
    result = s.handle_command(f"/load {path}")
    assert result.action == "error" and why in result.message and "\n" not in result.message
    assert s.history == before


def test_bare_list_loads(tmp_path):
    path = tmp_path / "h.json"
    path.write_text('[{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]')
    s = ChatSession(FakeEngine())
    s.load(path)
    assert s.history == [ChatMessage("user", "a"), ChatMessage("assistant", "b")]


def test_save_error_is_reported(tmp_path):
    s = ChatSession(FakeEngine())
    result = s.handle_command(f"/save {tmp_path}/missing/dir/h.json")
    assert result.action == "error" and "cannot save" in result.message


# ---- multi-line input ---------------------------------------------------------------------------
def test_backslash_continues():
    a = LineAssembler()
    assert a.feed("first\\") is None and a.pending
    assert a.feed("second") == "first\nsecond" and not a.pending


def test_triple_quote_block():
    a = LineAssembler()
    assert a.feed('"""') is None
    assert a.feed("line one\\") is None  # a backslash inside a block is kept as text
    assert a.feed("") is None
    assert a.feed('end"""') == "line one\\\n\nend"
    assert a.feed('"""inline"""') == "inline"
    assert a.feed('"""start') is None and a.feed('"""') == "start\n"


# ---- the loop -----------------------------------------------------------------------------------
class RecordingView:
    def __init__(self):
        self.events = []

    def __getattr__(self, name):
        return lambda *args: self.events.append((name, *args))


def scripted(lines):
    """A read() that replays lines; an exception instance is raised instead of returned."""
    prompts = []

    def read(prompt):
        prompts.append(prompt)
        if not lines:
            raise EOFError
        item = lines.pop(0)
        if isinstance(item, BaseException):
            raise item
        return item

    return read, prompts


def test_repl_turns_commands_and_ctrl_d():
    s = ChatSession(FakeEngine("ok"))
    view = RecordingView()
    read, prompts = scripted(["hello", "/stats", "/bogus", "two\\", "lines", "//slash"])
    assert run_repl(s, view, read) == 0  # Ctrl-D (EOF) leaves with status 0
    kinds = [e[0] for e in view.events]
    assert kinds.count("answer_end") == 3 and "stats" in kinds and "error" in kinds
    assert [m.content for m in s.history if m.role == "user"] == ["hello", "two\nlines", "/slash"]
    assert prompts[:5] == [PROMPT, PROMPT, PROMPT, PROMPT, CONTINUATION]


def test_repl_ctrl_c_at_prompt_clears_the_line():
    s = ChatSession(FakeEngine("ok"))
    read, _ = scripted(["half a thought\\", KeyboardInterrupt(), "fresh", "/exit"])
    assert run_repl(s, RecordingView(), read) == 0
    assert [m.content for m in s.history if m.role == "user"] == ["fresh"]


def test_repl_error_in_a_turn_keeps_the_session():
    s = ChatSession(FakeEngine("ok", n_ctx=30), max_tokens=4)
    view = RecordingView()
    read, _ = scripted(["x" * 40, "short", "/exit"])
    assert run_repl(s, view, read) == 0
    errors = [e for e in view.events if e[0] == "error"]
    assert len(errors) == 1 and "context" in errors[0][1]
    assert [m.content for m in s.history] == ["short", "ok"]


def test_first_ctrl_c_is_a_flag_the_second_interrupts():
    import os
    import signal

    before = signal.getsignal(signal.SIGINT)
    with soft_sigint() as sigint:
        os.kill(os.getpid(), signal.SIGINT)
        assert sigint.hits == 1
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.1)  # the handler runs at the next bytecode boundary
    assert signal.getsignal(signal.SIGINT) is before


def test_drop_cache_resets_both_models():
    eng = FakeEngine()
    eng.cache = [1, 2, 3]
    ChatSession(eng, n_ctx=100).drop_cache()
    assert eng.resets == 1 and eng.cache == []


def test_second_ctrl_c_inside_a_decode_resets_the_engine_and_the_next_turn_rereads_the_history():
    fired = []

    def hard_interrupt(i):
        if i == 3 and not fired:  # the first Ctrl-C raises the flag, the second lands inside this decode
            fired.append(i)
            signal.raise_signal(signal.SIGINT)  # (the handler runs before raise_signal returns)
            signal.raise_signal(signal.SIGINT)

    eng = FakeEngine("ok then", on_token=hard_interrupt)
    s = ChatSession(eng)
    view = RecordingView()
    read, _ = scripted(["first", "second", "/exit"])
    before = signal.getsignal(signal.SIGINT)
    assert run_repl(s, view, read) == 0
    assert signal.getsignal(signal.SIGINT) is before
    assert eng.resets == 1 and not eng.dirty
    notices = [e[1] for e in view.events if e[0] == "notice"]
    assert any(n.startswith("stopped at once: the model caches were cleared") for n in notices)
    # the partial answer stays in the history; the next turn reads all of it again (nothing cached)
    assert s.history[1] == ChatMessage("assistant", "ok ", interrupted=True)
    assert eng.prompts[1][: len(eng.prompts[0])] == eng.prompts[0]
    assert [f.stats.prompt_cached for f in (e[1] for e in view.events if e[0] == "answer_end") if f] == [0, 0]


def test_closing_at_the_trim_notice_leaves_no_dangling_question():
    s = ChatSession(FakeEngine("y", n_ctx=120), max_tokens=10)
    s.history = [ChatMessage("user", "u" * 70), ChatMessage("assistant", "a" * 40)]
    gen = s.send("new")
    assert isinstance(next(gen), Notice)
    gen.close()
    assert s.history == []  # the old turn was trimmed, the new question withdrawn
