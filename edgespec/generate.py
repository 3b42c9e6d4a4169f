"""From token events to a stream of text chunks and one final result with stats.

Three layers: `SpeculativeDecoder.generate` yields TokenEvents; `stream` turns them into `Chunk`s
(valid UTF-8 text, stop strings honoured) ending with a `Final`; `complete` joins a stream.
"""

from __future__ import annotations

import codecs
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Callable, Iterable, Iterator, Sequence

from .speculative import LoopStats, TokenEvent


@dataclass(frozen=True)
class Chunk:
    text: str
    sources: tuple[str, ...]  # drafter of each token behind this text: "target" | "draft" | "ngram"


@dataclass(frozen=True)
class GenerationStats:
    mode: str
    prompt_tokens: int
    prompt_cached: int
    prompt_ms: float
    tokens: int
    rounds: int
    drafted: int
    accepted: int
    acceptance_rate: float
    accepted_hist: dict[int, int]
    mean_accepted_per_pass: float  # tokens emitted per target pass (1.0 = plain decoding)
    draft_ms: float
    verify_ms: float
    gen_s: float
    tokens_per_s: float
    ttft_ms: float
    latency_p50_ms: float
    latency_p95_ms: float
    k_history: list[int] = field(default_factory=list)
    tokens_by_source: dict[str, int] = field(default_factory=dict)
    finish_reason: str | None = None
    # the generation's time outside the target's passes: drafting, choosing a length, the loop and its
    # stream (where a mode drafts nothing, all it adds to plain decoding, without the passes' noise)
    loop_ms: float = 0.0

    def to_json(self) -> dict:
        data = asdict(self)
        data["accepted_hist"] = {str(k): v for k, v in sorted(self.accepted_hist.items())}
        return data


@dataclass(frozen=True)
class Final:
    text: str
    finish_reason: str  # "stop" (EOS or stop string) | "length" | "interrupted"
    stats: GenerationStats
    tokens: tuple[int, ...] = ()


def _percentile(values: Sequence[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def summarize(st: LoopStats, mode: str, n_tokens: int, finish_reason: str | None) -> GenerationStats:
    rounds = st.rounds
    drafted = sum(r.drafted for r in rounds)
    accepted = sum(r.accepted for r in rounds)
    first = st.token_times[0] if st.token_times else None
    end = st.token_times[-1] if st.token_times else time.perf_counter()
    gen_start = st.start + st.prompt_s
    gen_s = max(end - gen_start, 1e-9)
    verify_s = sum(r.verify_s for r in rounds)
    # a last round that found only the end of the answer ran after its last token, outside gen_s
    after_end = rounds[-1].verify_s if rounds and st.finish_reason == "stop" and rounds[-1].accepted == 0 else 0.0
    # Tokens accepted together arrive together: spread each round's time over its tokens.
    latencies = []
    prev = gen_start
    for t in st.token_times:
        latencies.append((t - prev) * 1000)
        prev = t
    per_token: list[float] = []
    i = 0
    for r in rounds:
        n = r.accepted + 1
        chunk = latencies[i : i + n]
        if chunk:
            per_token.extend([sum(chunk) / len(chunk)] * len(chunk))
        i += n
    return GenerationStats(
        mode=mode,
        prompt_tokens=st.prompt_tokens,
        prompt_cached=st.prompt_cached,
        prompt_ms=st.prompt_s * 1000,
        tokens=n_tokens,
        rounds=len(rounds),
        drafted=drafted,
        accepted=accepted,
        acceptance_rate=accepted / drafted if drafted else 0.0,
        accepted_hist=dict(Counter(r.accepted for r in rounds if r.drafted)),
        # the pass that produced the end-of-answer token produced output too, though it is not text
        mean_accepted_per_pass=(n_tokens + (st.finish_reason == "stop")) / len(rounds) if rounds else 0.0,
        draft_ms=sum(r.draft_s for r in rounds) * 1000,
        verify_ms=verify_s * 1000,
        gen_s=gen_s,
        tokens_per_s=n_tokens / gen_s if n_tokens else 0.0,
        ttft_ms=((first - st.start) * 1000) if first else 0.0,
        latency_p50_ms=_percentile(per_token, 0.5),
        latency_p95_ms=_percentile(per_token, 0.95),
        k_history=[r.k for r in rounds],
        tokens_by_source=dict(Counter(st.sources)),
        finish_reason=finish_reason,
        loop_ms=(gen_s - (verify_s - after_end)) * 1000 if n_tokens else 0.0,
    )


class _Utf8:
    """Incremental decoder: emits only complete characters (a character may span tokens); bytes
    that can never be UTF-8 become U+FFFD at once instead of holding back the text after them."""

    def __init__(self):
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, data: bytes) -> str:
        return self._decoder.decode(data)

    def flush(self) -> str:
        return self._decoder.decode(b"", final=True)


def _held_back(text: str, stops: Sequence[str]) -> int:
    """How many trailing characters could still be the start of a stop string."""
    hold = 0
    for stop in stops:
        for n in range(min(len(stop) - 1, len(text)), 0, -1):
            if text.endswith(stop[:n]):
                hold = max(hold, n)
                break
    return hold


class TextStream:
    """Token events in, text chunks out, pushed one event at a time (a batch scheduler feeds many);
    `stream` below is the same over an iterator. Holds back text that could still begin a stop
    string, and the bytes of a character not yet complete."""

    def __init__(self, token_bytes: Callable[[int], bytes], stop: Sequence[str] = ()):
        self.token_bytes = token_bytes
        self.stops = [s for s in stop if s]
        self.utf8 = _Utf8()
        self.text = ""  # everything emitted so far
        self.pending = ""  # decoded but held back (possible stop-string prefix)
        self.pending_src: list[str] = []
        self.tokens: list[int] = []
        self.stopped = False  # a stop string was found: the generation should end

    def feed(self, ev: TokenEvent) -> Chunk | None:
        self.tokens.append(ev.token)
        self.pending += self.utf8.feed(self.token_bytes(ev.token))
        self.pending_src.append(ev.source)
        stops = self.stops
        hit = min((i for i in (self.pending.find(s) for s in stops) if i >= 0), default=-1)
        if hit >= 0:
            self.pending = self.pending[:hit]
            self.stopped = True
            return None
        keep = _held_back(self.pending, stops)
        out, self.pending = self.pending[: len(self.pending) - keep], self.pending[len(self.pending) - keep :]
        if not out:
            return None
        self.text += out
        chunk = Chunk(out, tuple(self.pending_src))
        self.pending_src = []
        return chunk

    def finish(self, loop: LoopStats, mode: str, finish: str | None) -> list[Chunk | Final]:
        """The held-back text (when the answer ended by itself) and the Final."""
        if self.stopped:
            finish = "stop"
        if finish is None:
            finish = loop.finish_reason or "stop"
            if finish != "length":
                # cut by max_tokens, a character whose bytes are not all there is dropped
                # rather than shown as U+FFFD
                self.pending += self.utf8.flush()
        out: list[Chunk | Final] = []
        if self.pending:
            self.text += self.pending
            out.append(Chunk(self.pending, tuple(self.pending_src)))
            self.pending = ""
        out.append(Final(self.text, finish, summarize(loop, mode, len(self.tokens), finish), tuple(self.tokens)))
        return out


def stream(
    events: Iterable[TokenEvent],
    token_bytes: Callable[[int], bytes],
    stats: Callable[[], LoopStats],
    *,
    mode: str,
    stop: Sequence[str] = (),
) -> Iterator[Chunk | Final]:
    """Text chunks as tokens are accepted, then one Final. Closing the stream stops generation."""
    text = TextStream(token_bytes, stop)
    finish = None
    it = iter(events)
    try:
        for ev in it:
            chunk = text.feed(ev)
            if text.stopped:
                break
            if chunk is not None:
                yield chunk
    except KeyboardInterrupt:
        finish = "interrupted"
    finally:
        close = getattr(it, "close", None)
        if close:
            close()  # lets the decoder settle its KV caches
    yield from text.finish(stats(), mode, finish)


def interrupt(chunks: Iterator[Chunk | Final]) -> Chunk | Final | None:
    """Ask a paused `stream` to stop where it is, as a Ctrl-C inside it would: it settles its caches
    and hands back the rest (a held-back chunk, then its Final with finish_reason "interrupted").
    For a Ctrl-C that lands in the consumer, between two items. None: it was already past its end."""
    try:
        return chunks.throw(KeyboardInterrupt())
    except (KeyboardInterrupt, StopIteration):
        return None


def complete(chunks: Iterable[Chunk | Final]) -> Final:
    """Drain a stream; return its Final."""
    final = None
    for item in chunks:
        if isinstance(item, Final):
            final = item
    assert final is not None, "a stream always ends with a Final"
    return final
