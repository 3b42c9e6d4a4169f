"""generate.stream: token events -> valid UTF-8 text chunks, stop strings, one Final."""

from __future__ import annotations

import random

import pytest

from edgespec.controller import Controller
from edgespec.costs import CostModel
from edgespec.generate import Chunk, Final, complete, stream
from edgespec.sampling import SamplingConfig
from edgespec.drafters import ModelDrafter
from edgespec.speculative import LoopStats, SpecSettings, SpeculativeDecoder, TokenEvent

from .fakes import EOS, FakeModel, plain_greedy, table_lm


def events(pieces, source="target"):
    """One TokenEvent per piece; token ids index `pieces`."""
    return [TokenEvent(i, source if isinstance(source, str) else source[i], 0) for i in range(len(pieces))]


def run(pieces, stop=(), source="target", finish="length"):
    """Stream byte pieces as tokens; return (chunks, final)."""
    items = list(
        stream(
            events(pieces, source),
            lambda t: pieces[t],
            lambda: LoopStats(finish_reason=finish),
            mode="test",
            stop=stop,
        )
    )
    assert isinstance(items[-1], Final) and all(isinstance(c, Chunk) for c in items[:-1])
    return items[:-1], items[-1]


def joined(chunks):
    return "".join(c.text for c in chunks)


# ---- stop strings ------------------------------------------------------------------------------
def test_multi_token_stop_string_cuts_before_it():
    pieces = [b"Hel", b"lo", b" wo", b"rld", b" again"]
    chunks, final = run(pieces, stop=["lo wor"])
    assert final.text == "Hel" == joined(chunks)
    assert final.finish_reason == "stop"
    assert final.tokens == (0, 1, 2, 3)  # generation ended at the token that completed the stop


def test_stop_prefix_is_held_back_until_it_is_decided():
    # "ab" could start the stop "abc": it must not be streamed until "x" shows it is not one.
    pieces = [b"12", b"a", b"b", b"x", b"3"]
    seen = []
    for item in stream(events(pieces), lambda t: pieces[t], LoopStats, mode="test", stop=["abc"]):
        if isinstance(item, Chunk):
            seen.append(item.text)
    assert seen == ["12", "abx", "3"]


def test_stop_string_spanning_chunks_never_leaks_any_part():
    # The stop "<END>" arrives one character per token after text; no emitted chunk may contain
    # any piece of it, and the Final stops right before it.
    text = "result: 42<END> trailing"
    pieces = [ch.encode() for ch in text]
    chunks, final = run(pieces, stop=["<END>"])
    assert final.text == "result: 42" == joined(chunks)
    assert all("<" not in c.text for c in chunks)
    assert final.finish_reason == "stop"


def test_earliest_of_several_stops_wins():
    pieces = [b"one ", b"two ", b"three"]
    _, final = run(pieces, stop=["three", "two"])
    assert final.text == "one "


def test_stop_inside_one_token():
    _, final = run([b"a", b"bSTOPc", b"d"], stop=["STOP"])
    assert final.text == "ab" and final.finish_reason == "stop"


def test_held_back_prefix_is_released_when_generation_ends():
    # The text ends on "<EN", a prefix of the stop: it is part of the answer, not dropped.
    chunks, final = run([b"x", b"<", b"EN"], stop=["<END>"], finish="length")
    assert final.text == "x<EN" == joined(chunks)
    assert final.finish_reason == "length"


def test_empty_stop_strings_are_ignored():
    _, final = run([b"a", b"b"], stop=["", "zz"])
    assert final.text == "ab"


@pytest.mark.parametrize("seed", range(40))
def test_any_split_of_the_text_gives_the_same_answer(seed):
    """However the bytes are cut into tokens, the answer is the text up to the first stop."""
    rng = random.Random(seed)
    alphabet = ["a", "b", "<", "/", "s", ">", " ", "é", "中", "🙂"]
    text = "".join(rng.choice(alphabet) for _ in range(rng.randint(5, 60)))
    stops = ["</s>", "a<", "🙂b"][: rng.randint(0, 3)]
    data = text.encode()
    cuts = sorted(rng.sample(range(1, len(data)), min(len(data) - 1, rng.randint(0, len(data) // 2))))
    pieces = [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)])]
    chunks, final = run(pieces, stop=stops)
    hits = [text.find(s) for s in stops if s in text]
    expected = text[: min(hits)] if hits else text
    assert final.text == expected == joined(chunks)
    assert final.finish_reason == ("stop" if hits else "length")
    for c in chunks:
        assert c.text and "\ufffd" not in c.text
        for s in stops:
            assert s not in c.text


# ---- UTF-8 -------------------------------------------------------------------------------------
@pytest.mark.parametrize("char", ["é", "中", "🙂"])
def test_character_split_across_tokens_is_emitted_whole(char):
    data = char.encode()
    pieces = [b"x"] + [data[i : i + 1] for i in range(len(data))] + [b"y"]
    chunks, final = run(pieces)
    assert final.text == f"x{char}y" == joined(chunks)
    for c in chunks:
        c.text.encode("utf-8")  # never a lone surrogate
        assert "\ufffd" not in c.text


def test_partial_character_is_not_streamed_early():
    data = "🙂".encode()
    pieces = [b"a" + data[:2], data[2:], b"b"]
    texts = []
    for item in stream(events(pieces), lambda t: pieces[t], LoopStats, mode="test"):
        if isinstance(item, Chunk):
            texts.append(item.text)
    assert texts == ["a", "🙂", "b"]


def test_stop_string_after_a_split_character():
    data = "é".encode()
    pieces = [data[:1], data[1:] + b"EN", b"D!"]
    _, final = run(pieces, stop=["END"])
    assert final.text == "é"


def test_invalid_bytes_become_replacement_characters_not_a_stall():
    # 0xff can never start a UTF-8 character: it is replaced at once, and the text after it is
    # streamed with the token that brings it, not held back as if a character were unfinished.
    pieces = [b"ok", b"\xff", b"go", b"!"]
    chunks, final = run(pieces)
    assert final.text == "ok\ufffdgo!" == joined(chunks)
    assert [c.text for c in chunks] == ["ok", "\ufffd", "go", "!"]


def test_a_character_cut_by_max_tokens_is_dropped_not_shown_as_a_replacement():
    # the budget ran out inside a character: its first bytes are not text yet
    pieces = [b"ab", "中".encode()[:2]]
    chunks, final = run(pieces, finish="length")
    assert final.text == "ab" == joined(chunks)


def test_truncated_character_at_the_end_of_an_answer_is_flushed():
    # the model itself ended inside a character: what it wrote is shown, as U+FFFD
    pieces = [b"ab", "中".encode()[:2]]
    chunks, final = run(pieces, finish="stop")
    assert final.text == "ab\ufffd" == joined(chunks)


# ---- sources, interruption, closing ------------------------------------------------------------
def test_chunks_carry_the_source_of_each_token_behind_them():
    pieces = [b"a", b"b", b"c"]
    chunks, _ = run(pieces, source=["target", "draft", "ngram"])
    assert [s for c in chunks for s in c.sources] == ["target", "draft", "ngram"]


def test_sources_of_held_back_tokens_stay_with_their_text():
    pieces = [b"x", b"<", b"y"]  # "<" is held back (could start "<e>") until "y"
    chunks, _ = run(pieces, stop=["<e>"], source=["target", "draft", "ngram"])
    assert [(c.text, c.sources) for c in chunks] == [("x", ("target",)), ("<y", ("draft", "ngram"))]


def test_keyboard_interrupt_ends_with_interrupted_and_keeps_the_text():
    def gen():
        yield TokenEvent(0, "target", 0)
        yield TokenEvent(1, "target", 0)
        raise KeyboardInterrupt

    pieces = [b"he", b"llo"]
    items = list(stream(gen(), lambda t: pieces[t], LoopStats, mode="test"))
    final = items[-1]
    assert final.finish_reason == "interrupted"
    assert final.text == "hello" == joined(items[:-1])


def test_closing_the_stream_closes_the_generator():
    closed = []

    def gen():
        try:
            for i in range(100):
                yield TokenEvent(i % 2, "target", 0)
        finally:
            closed.append(True)

    pieces = [b"a", b"b"]
    s = stream(gen(), lambda t: pieces[t], LoopStats, mode="test", stop=["abab"])
    final = complete(s)
    assert closed == [True]
    assert final.text == "" and final.finish_reason == "stop"


# ---- with the real decoder ---------------------------------------------------------------------
def test_eos_the_draft_model_proposes_ends_text_there():
    """The draft model proposes EOS and the target agrees: text stops before EOS, KV settled."""
    vocab_bytes = {t: bytes([ord("a") + t]) for t in range(8)}
    vocab_bytes[EOS] = b"<EOS>"
    base = table_lm(7)
    prompt = [3, 5, 2, 6]
    eos_at = len(prompt) + 5

    def lm(ctx):
        out = base(ctx).copy()
        out[EOS] = 1e9 if len(ctx) == eos_at else -1e9
        return out

    target, draft = FakeModel(lm), FakeModel(lm)
    ctl = Controller(CostModel(draft_cost=0.1), k_min=8, k_max=8, allow_off=False, learn_timing=False)
    dec = SpeculativeDecoder(target, SamplingConfig(), ctl, SpecSettings(mode="draft", draft_max=8),
                             drafter=ModelDrafter(draft, SamplingConfig()))
    items = list(stream(dec.generate(prompt, 50), lambda t: vocab_bytes[t], lambda: dec.stats, mode="draft"))
    final = items[-1]
    expected = plain_greedy(lm, prompt, 50)
    assert len(expected) == 5
    assert list(final.tokens) == expected
    assert final.text == "".join(vocab_bytes[t].decode() for t in expected) == joined(items[:-1])
    assert "<EOS>" not in final.text
    assert final.finish_reason == "stop" and final.stats.finish_reason == "stop"
    # the draft model proposed EOS after 5 tokens (8 allowed): the draft stopped before it, all 5 were
    # kept and the target's own row yielded the end
    assert dec.stats.rounds[0].drafted == 5 and dec.stats.rounds[0].accepted == 5
    assert final.stats.tokens == 5
    assert "draft" in {s for c in items[:-1] for s in c.sources}
    for m in (target, draft):
        assert m.tokens == (prompt + expected)[: len(m.tokens)]


# ---- the loop's own time -------------------------------------------------------------------------
@pytest.mark.parametrize(("mode", "budget"), [("off", 12), ("off", 5), ("ngram", 12)])
def test_loop_time_is_the_generations_time_outside_the_targets_passes(mode, budget):
    # a clock that moves only in the target's passes: everything else the loop does takes no time, so
    # the loop's time is none, whether the answer ended at its end token (a last pass that emitted
    # nothing, after the last token) or at the budget
    from edgespec.drafters import NgramDrafter
    from edgespec.generate import summarize
    from edgespec.replay import EOS as END, ScriptedClock, TimedTarget
    from edgespec.speculative import Mode

    answer = [5, 6, 7, 8, 5, 6, 7, 8, 5, 6, END]  # repeats itself: the n-gram drafter has drafts to make
    clock = ScriptedClock()
    target = TimedTarget([1, 2, 5, 6, 7, 8, 3], answer, 10, clock=clock, noise=0.0, seed=0,
                         charge=CostModel.from_ms({0: {1: 40.0, 2: 48.0, 4: 55.0, 8: 70.0, 16: 110.0}}))
    ctl = Controller(CostModel(verify={2: 1.2, 4: 1.4, 8: 1.75, 16: 2.75}), k_max=8, priors={"ngram": 0.9})
    dec = SpeculativeDecoder(target, SamplingConfig(), ctl, SpecSettings(mode=Mode(mode), draft_max=8),
                             ngram=NgramDrafter(1, 3), clock=clock)
    tokens = [e.token for e in dec.generate([1, 2, 5, 6, 7, 8, 3], budget)]
    assert tokens == answer[:min(budget, 10)]
    stats = summarize(dec.stats, mode, len(tokens), dec.stats.finish_reason)
    assert stats.loop_ms == pytest.approx(0.0, abs=1e-6)
    assert (stats.drafted > 0) == (mode == "ngram")
    # the pass that found the end is in the passes' time but after the last token
    after = 40.0 if budget > len(tokens) and stats.rounds and dec.stats.rounds[-1].accepted == 0 else 0.0
    assert stats.verify_ms == pytest.approx(stats.gen_s * 1000 + after)
