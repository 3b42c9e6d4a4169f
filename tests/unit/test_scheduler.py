"""The server's scheduler over the real Engine on a fake multi-sequence model: priorities with
aging, slots chosen by shared prefix, many requests in one batch, a queued job that leaves, and
what /metrics counts — without HTTP (tests/unit/test_server.py covers the routes)."""

from __future__ import annotations

import asyncio
import time

from prometheus_client.parser import text_string_to_metric_families

from edgespec.generate import Chunk, Final
from edgespec.sampling import SamplingConfig
from edgespec.server import scheduler as sched
from edgespec.server.scheduler import CANCELLED, Job, QueueFull, Scheduler, Started

from .fake_llama import REPLY, FakeEngine

GREEDY = SamplingConfig(temperature=0.0)


def job(text: str, *, priority: int = 0, max_tokens: int = 64, stop=()) -> Job:
    return Job(lambda engine: engine.raw_tokens(text), GREEDY, max_tokens, stop, priority)


async def drain(j: Job, seconds: float = 60.0):
    """Every event of a job up to its end (Final or Failed)."""
    items = []
    while True:
        item = await asyncio.wait_for(j.next(), seconds)
        items.append(item)
        if not isinstance(item, (Started, Chunk)):
            return items


async def until(condition, seconds: float = 60.0):
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.005)


def run(coro):
    return asyncio.run(coro)


def test_many_requests_share_batches_and_each_gets_its_answer():
    async def main():
        engine = FakeEngine(n_seq=4)
        s = Scheduler(engine, max_queue=8)
        try:
            engine.gate.clear()
            jobs = [job(f"question number {i}:") for i in range(4)]
            for j in jobs:
                s.submit(j)
            await until(lambda: engine.waiting.is_set())
            engine.gate.set()
            results = [await drain(j) for j in jobs]
        finally:
            s.shutdown()
            s.join(10)
        for items in results:
            final = items[-1]
            assert isinstance(final, Final) and final.text == REPLY
            assert "".join(i.text for i in items if isinstance(i, Chunk)) == REPLY
        shared = [parts for parts in engine.target.batches if len(parts) > 1]
        assert shared, "the four requests never shared a target pass"
        assert s.counts["completed"] == 4 and s.counts["tokens"] == 4 * len(REPLY)
    run(main())


async def finishing_order(specs: list[tuple[str, int, float]]) -> list[str]:
    """Submit jobs (name, priority, seconds already waited), in that order, behind a one-slot server
    held busy, let it go, and return the names in the order their answers ended: one slot serves
    them one at a time, in admission order."""
    waiting = {}
    for name, priority, waited in specs:
        waiting[name] = job(name, priority=priority)
        waiting[name].submitted -= waited
    engine = FakeEngine(n_seq=1)
    s = Scheduler(engine, max_queue=8)
    order: list[str] = []
    try:
        engine.gate.clear()
        running = job("hold", max_tokens=3)
        s.submit(running)
        await until(lambda: engine.waiting.is_set())
        for j in waiting.values():
            s.submit(j)
        engine.gate.set()

        async def watch(name, j):
            await drain(j)
            order.append(name)

        await asyncio.gather(drain(running), *(watch(n, j) for n, j in waiting.items()))
    finally:
        s.shutdown()
        s.join(10)
    return order


def test_a_better_priority_waiting_behind_a_full_server_is_admitted_first():
    assert run(finishing_order([("a", 5, 0.0), ("b", 5, 0.0), ("urgent", -1, 0.0)])) == ["urgent", "a", "b"]


def test_aging_lets_an_old_request_past_newer_better_ones():
    # the old one waited four levels' worth: ahead of a fresh priority 0
    assert run(finishing_order([("new", 0, 0.0), ("old", 3, 4 * sched.AGING_S)])) == ["old", "new"]


def test_a_queued_job_that_is_cancelled_leaves_the_queue_at_once():
    async def main():
        engine = FakeEngine(n_seq=1)
        s = Scheduler(engine, max_queue=2)
        try:
            engine.gate.clear()
            s.submit(job("running"))
            await until(lambda: engine.waiting.is_set())
            queued = [job("q1"), job("q2")]
            for j in queued:
                s.submit(j)
            try:
                s.submit(job("refused"))
                raise AssertionError("a full queue accepted a job")
            except QueueFull:
                pass
            for j in queued:
                j.cancel()
            assert s.waiting == 0  # no waiting on the held generation
            assert (await j.next()) is CANCELLED
            s.submit(job("admitted now"))  # the place is free again while the first still generates
            assert s.counts["cancelled"] == 2
        finally:
            engine.gate.set()
            s.shutdown()
            s.join(10)
    run(main())


def test_a_request_goes_to_the_slot_holding_its_prefix():
    async def main():
        engine = FakeEngine(n_seq=3)
        s = Scheduler(engine, max_queue=8)
        try:
            first = [job("alpha: " + "x" * 40), job("beta: " + "y" * 40)]
            for j in first:
                s.submit(j)
            for j in first:
                await drain(j)
            again = job("beta: " + "y" * 40 + " and more")
            s.submit(again)
            items = await drain(again)
        finally:
            s.shutdown()
            s.join(10)
        final = items[-1]
        assert final.stats.prompt_cached == len("beta: " + "y" * 40)
    run(main())


DOC = "a long document, read once: " + "z" * 60
OTHER = "something else entirely, " + "q" * 30


def serve_in_turn(texts, *, slots: int, cache: int):
    """Each text in turn (one finished before the next is sent); the fake model's KV saves and
    restores, and the responses' stats."""
    async def main():
        engine = FakeEngine(n_seq=slots)
        s = Scheduler(engine, max_queue=8, cache=cache)
        finals = []
        try:
            for text in texts:
                j = job(text)
                s.submit(j)
                finals.append((await drain(j))[-1])
        finally:
            s.shutdown()
            s.join(10)
        return engine.target, finals, s.metrics

    return run(main())


def test_a_reused_slots_prompt_is_kept_in_the_prompt_cache():
    """One slot, two cached prompts: the document's KV is saved to host memory before its slot
    serves another request and restored when the document is sent again, not read again."""
    target, finals, metrics = serve_in_turn([DOC, OTHER, DOC + " again?", OTHER + " too"], slots=1, cache=2)
    assert [s[0] for s in target.saves] == [0, 0, 0]  # the document, OTHER, the document's second answer
    assert [r for r in target.restores] == [(0, target.restores[0][1]), (0, target.restores[1][1])]
    assert target.restores[0][1] >= len(DOC) and finals[2].stats.prompt_cached >= len(DOC)
    assert target.restores[1][1] >= len(OTHER) and finals[3].stats.prompt_cached >= len(OTHER)
    assert finals[1].stats.prompt_cached == 0
    assert not target.copies  # one slot: nothing to copy between sequences
    assert metrics.prompt_cache_restored._value.get() == 2


def test_a_restored_prompt_leaves_the_cache_and_the_least_recently_used_goes_first():
    """With room for one prompt: a restored prompt moves into the slot, so the slot's previous
    content can be saved in its place; a third prompt pushes the oldest out."""
    target, finals, _ = serve_in_turn([DOC, OTHER, DOC, OTHER], slots=1, cache=1)
    assert len(target.saves) == 3 and len(target.restores) == 2
    assert finals[2].stats.prompt_cached >= len(DOC) - 1 and finals[3].stats.prompt_cached >= len(OTHER) - 1
    third = "unlike the others, a third prompt: " + "w" * 30
    target, finals, _ = serve_in_turn([DOC, OTHER, third, DOC], slots=1, cache=1)
    assert not target.restores and finals[3].stats.prompt_cached == 0


def test_no_prompt_cache_keeps_nothing():
    target, finals, _ = serve_in_turn([DOC, OTHER, DOC], slots=1, cache=0)
    assert not target.saves and not target.restores and finals[2].stats.prompt_cached == 0


def test_a_negative_prompt_cache_is_refused():
    import pytest
    with pytest.raises(ValueError):
        Scheduler(FakeEngine(n_seq=2), max_queue=1, cache=-1)


def test_metrics_parse_and_match_the_responses_stats():
    async def main():
        engine = FakeEngine(n_seq=2)
        s = Scheduler(engine, max_queue=8)
        try:
            jobs = [job("one " * 10), job("two " * 10, max_tokens=7)]
            for j in jobs:
                s.submit(j)
            finals = [(await drain(j))[-1] for j in jobs]
        finally:
            s.shutdown()
            s.join(10)
        families = {f.name: f for f in text_string_to_metric_families(s.metrics.render().decode())}

        def total(name, **labels):
            return sum(x.value for x in families[name].samples
                       if x.name.endswith("_total") and all(x.labels.get(k) == v for k, v in labels.items()))

        assert total("edgespec_requests", outcome="completed") == 2
        assert total("edgespec_generated_tokens") == sum(f.stats.tokens for f in finals)
        assert total("edgespec_prompt_tokens") == sum(f.stats.prompt_tokens for f in finals)
        drafted = sum(f.stats.drafted for f in finals)
        assert sum(total("edgespec_drafted_tokens", drafter=d) for d in ("ngram", "draft")) == drafted
        assert sum(total("edgespec_accepted_tokens", drafter=d) for d in ("ngram", "draft")) == sum(
            f.stats.accepted for f in finals)
        per_pos = sum(x.value for x in families["edgespec_spec_decode_num_draft_tokens_per_pos"].samples
                      if x.name.endswith("_total"))
        assert per_pos == drafted
        ttft = [x for x in families["edgespec_time_to_first_token_seconds"].samples if x.name.endswith("_count")]
        assert ttft[0].value == 2
    run(main())


def test_the_shared_prefix_is_copied_from_a_busy_slot():
    async def main():
        engine = FakeEngine(n_seq=2)
        s = Scheduler(engine, max_queue=8)
        doc = "the same document, read once " * 4
        try:
            engine.target.hold_if = lambda parts: any(want for _, _, want in parts)  # a verify, not a prompt chunk
            engine.gate.clear()
            a = job(doc + "question A", max_tokens=40)
            s.submit(a)
            await until(lambda: engine.waiting.is_set())  # A has read its whole prompt and is answering
            b = job(doc + "question B")
            s.submit(b)  # slot 0 is busy with A (which holds the document): B gets slot 1
            engine.gate.set()
            items = await drain(b)
            await drain(a)
        finally:
            s.shutdown()
            s.join(10)
        assert engine.target.copies and engine.target.copies[0][:2] == (0, 1)
        assert items[-1].stats.prompt_cached >= len(doc) and items[-1].text == REPLY
        assert s.metrics.shared_prefix_tokens._value.get() >= len(doc)
    run(main())


def test_requests_arriving_together_read_their_shared_prefix_once():
    async def main():
        engine = FakeEngine(n_seq=3)
        s = Scheduler(engine, max_queue=8)
        system = "You are a careful assistant who answers in one line. " * 6  # ~330 tokens, shared
        try:
            engine.gate.clear()  # nothing runs until all three are admitted
            jobs = [job(system + f"question {i}?") for i in range(3)]
            for j in jobs:
                s.submit(j)
            await until(lambda: engine.waiting.is_set())
            await until(lambda: s.busy == 3)
            engine.gate.set()
            results = [await drain(j) for j in jobs]
        finally:
            s.shutdown()
            s.join(10)
        prompt_rows = sum(n for parts in engine.target.batches for _, n, w in parts if not w)
        shared = len(engine.raw_tokens(system))
        # the shared part is read once, each question's own end once more each
        assert prompt_rows < shared + 3 * 40, prompt_rows
        assert len(engine.target.copies) == 2 and all(n >= shared for _, _, n in engine.target.copies)
        for items in results:
            assert items[-1].text == REPLY
        cached = sorted(items[-1].stats.prompt_cached for items in results)
        assert cached[0] == 0 and all(c >= shared for c in cached[1:])
        # /metrics counts each request's prompt once, with what it really took from the cache
        assert s.metrics.cached_tokens._value.get() == sum(cached)
    run(main())


def test_a_request_waiting_for_a_reader_that_leaves_reads_its_prompt_itself():
    async def main():
        engine = FakeEngine(n_seq=2)
        s = Scheduler(engine, max_queue=8)
        doc = "a long shared document that both requests begin with. " * 8
        try:
            engine.target.hold_if = lambda parts: any(len(t) > len(w) for _, t, w in parts)  # prompt tokens
            engine.gate.clear()
            a, b = job(doc + "first?"), job(doc + "second?")
            s.submit(a)
            s.submit(b)
            await until(lambda: engine.waiting.is_set() and s.busy == 2)
            a.cancel()  # the reader leaves before its prompt is read
            engine.gate.set()
            items = await drain(b)
        finally:
            s.shutdown()
            s.join(10)
        assert items[-1].text == REPLY
        assert s.counts["cancelled"] == 1 and s.counts["completed"] == 1
    run(main())
