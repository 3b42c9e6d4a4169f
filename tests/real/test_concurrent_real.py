"""Many requests at once on the real engine (`serve --parallel`): what each request gets does not
depend on what else runs, cancelling one leaves the others whole, priority orders admission,
/metrics adds up, and too many slots for the memory is refused before loading.

smollm2 with one thread keeps these cheap; the engine-level test uses the default kernels to
bound their drift by the near-tie rule.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from edgespec.backend.model import LoadParams
from edgespec.bench.results import NEAR_TIE_LOGIT
from edgespec.config import SpecConfig
from edgespec.engine import Engine, EngineConfig
from edgespec.sampling import SamplingConfig

from .conftest import SMALL, TARGET
from .test_server_real import COUNT, PATIENCE, Server, free_port, wait_until

QUESTIONS = ["Write a haiku about the sea.", "List three prime numbers.", "What is the capital of France?",
             "Name two colours and say why they go together."]


def ask(server: Server, content: str, **extra) -> dict:
    r = httpx.post(f"{server.url}/v1/chat/completions", timeout=PATIENCE,
                   json={"messages": [{"role": "user", "content": content}], "max_tokens": 32, **extra})
    assert r.status_code == 200, r.text
    return r.json()


def text(answer: dict) -> str:
    return answer["choices"][0]["message"]["content"]


def together(server: Server, bodies: list[dict]) -> list[dict]:
    with ThreadPoolExecutor(len(bodies)) as pool:
        return list(pool.map(lambda b: ask(server, **b), bodies))


def metric_totals(server: Server) -> dict:
    families = text_string_to_metric_families(httpx.get(f"{server.url}/metrics", timeout=PATIENCE).text)
    out: dict = {}
    for family in families:
        for s in family.samples:
            key = (s.name, tuple(sorted(s.labels.items())))
            out[key] = out.get(key, 0.0) + s.value
    return out


def total(metrics: dict, name: str, **labels) -> float:
    want = set(labels.items())
    return sum(v for (n, ls), v in metrics.items() if n == name and want <= set(ls))


def test_exact_requests_together_return_what_each_returns_alone_and_metrics_add_up():
    server = Server("-m", SMALL, "-t", "1", "--exact", "-np", "4").wait_ready()
    try:
        alone = [ask(server, q) for q in QUESTIONS]
        both = together(server, [{"content": q} for q in QUESTIONS])
        assert [text(a) for a in both] == [text(a) for a in alone]
        m = metric_totals(server)
        answers = alone + both
        assert total(m, "edgespec_requests_total", outcome="completed") == 8
        assert total(m, "edgespec_generated_tokens_total") == sum(a["usage"]["completion_tokens"] for a in answers)
        assert total(m, "edgespec_prompt_tokens_total") == sum(a["usage"]["prompt_tokens"] for a in answers)
        assert total(m, "edgespec_drafted_tokens_total") == sum(a["edgespec"]["drafted"] for a in answers)
        assert total(m, "edgespec_accepted_tokens_total") == sum(a["edgespec"]["accepted"] for a in answers)
        # the four ran in shared target passes: some decode held more rows than one request's round
        rows, decodes = total(m, "edgespec_rows_per_decode_sum"), total(m, "edgespec_rows_per_decode_count")
        assert decodes > 0 and rows / decodes > 1.0
    finally:
        assert server.stop() == 0, server.output()


def test_seeded_sampling_and_a_cancelled_neighbour_do_not_change_a_request():
    server = Server("-m", SMALL, "-t", "1", "--exact", "-np", "4").wait_ready()
    try:
        seeded = {"content": QUESTIONS[0], "temperature": 0.9, "seed": 11}
        alone = ask(server, **seeded)
        greedy_alone = [ask(server, q) for q in QUESTIONS[1:3]]
        # beside it: two greedy requests and a stream whose client leaves after its first chunk
        left = threading.Event()

        def leaver():
            with httpx.stream("POST", f"{server.url}/v1/chat/completions", timeout=PATIENCE,
                              json={"messages": COUNT, "max_tokens": 200, "stream": True}) as r:
                for line in r.iter_lines():
                    if line.startswith("data: {") and json.loads(line[6:])["choices"][0]["delta"].get("content"):
                        break  # the first text: leave
            left.set()

        before = server.health()["served"]["cancelled"]
        t = threading.Thread(target=leaver)
        t.start()
        results = together(server, [seeded, {"content": QUESTIONS[1]}, {"content": QUESTIONS[2]}])
        t.join(PATIENCE)
        assert left.is_set()
        wait_until(lambda: server.health()["served"]["cancelled"] == before + 1, "the stream was not cancelled")
        assert text(results[0]) == text(alone)
        assert [text(r) for r in results[1:]] == [text(a) for a in greedy_alone]
        again = ask(server, QUESTIONS[3])
        assert again["choices"][0]["finish_reason"] in ("stop", "length")
        assert server.health()["busy_slots"] == 0
    finally:
        assert server.stop() == 0, server.output()


DOCUMENT = ("Here is a list of the planets in order from the sun: Mercury, Venus, Earth, Mars, Jupiter, "
            "Saturn, Uranus, Neptune. Mercury is the smallest and Jupiter the largest. ") * 3


def test_a_document_whose_slot_served_another_request_comes_back_from_the_prompt_cache():
    """One slot: the document's KV is saved to the prompt cache (host memory) while the slot answers
    something else, and the document sent again is restored (cached_tokens) and answered token for
    token as the first time (exact kernels); with --prompt-cache 0 it is read again."""
    doc_q = DOCUMENT + "Which planet is third?"
    for cache, kept in (("1", True), ("0", False)):
        server = Server("-m", SMALL, "-t", "1", "--exact", "-np", "1", "--prompt-cache", cache).wait_ready()
        try:
            first = ask(server, doc_q)
            ask(server, "Write a haiku about the sea.")
            again = ask(server, doc_q)
            cached = again["usage"]["prompt_tokens_details"]["cached_tokens"]
            counts = metric_totals(server)
            saves = total(counts, "edgespec_prompt_cache_saves_total")
            restores = total(counts, "edgespec_prompt_cache_restores_total")
            if kept:
                assert cached >= first["usage"]["prompt_tokens"] - 1, cached
                assert text(again) == text(first)
                assert saves >= 1 and restores == 1
            else:
                assert cached < first["usage"]["prompt_tokens"] // 4, cached  # the chat template's head at most
                assert saves == 0 and restores == 0
        finally:
            assert server.stop() == 0, server.output()


def test_a_better_priority_waiting_behind_a_full_server_is_admitted_first():
    server = Server("-m", SMALL, "-t", "1", "-np", "1", "--queue", "4").wait_ready()
    try:
        order, lock = [], threading.Lock()
        started = threading.Event()

        def hold():
            with httpx.stream("POST", f"{server.url}/v1/chat/completions", timeout=PATIENCE,
                              json={"messages": COUNT, "max_tokens": 120, "stream": True}) as r:
                for _ in r.iter_lines():
                    started.set()

        def waiter(name, priority):
            ask(server, "Say yes.", max_tokens=2, priority=priority)
            with lock:
                order.append(name)

        runner = threading.Thread(target=hold)
        runner.start()
        assert started.wait(PATIENCE)
        threads = []
        for name, priority in (("first", 5), ("second", 5), ("urgent", -1)):
            waiting = server.health()["waiting"]
            threads.append(threading.Thread(target=waiter, args=(name, priority)))
            threads[-1].start()
            wait_until(lambda: server.health()["waiting"] == waiting + 1, "a request did not reach the queue")
        for th in [runner, *threads]:
            th.join(PATIENCE)
        assert order == ["urgent", "first", "second"]
    finally:
        assert server.stop() == 0, server.output()


def test_too_many_slots_for_the_memory_is_one_line_before_loading():
    out = subprocess.run([sys.executable, "-c", "from edgespec.commands import main; main()", "serve", "-m", TARGET,
                          "-np", "64", "-c", "1048576", "--port", str(free_port())],
                         capture_output=True, text=True, timeout=PATIENCE)
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert out.returncode != 0 and len(lines) == 1, out.stderr
    assert "64 parallel sequences" in lines[0] and "--parallel" in lines[0]
    assert "Traceback" not in out.stderr


def test_default_kernels_drift_between_batched_and_alone_only_at_near_ties(model_path):
    """Four sequences in shared batches with llama.cpp's default kernels: where a sequence's tokens
    differ from the same sequence decoded alone, the alone run's choice there was a near tie."""
    params = LoadParams(n_ctx=512, n_threads=2)
    cfg = EngineConfig(model_path(SMALL), params, spec=SpecConfig(mode="ngram"), n_seq=4)
    engine = Engine(cfg)
    try:
        greedy = SamplingConfig(temperature=0.0)
        prompts = [engine.raw_tokens(f"{q}\n") for q in QUESTIONS]
        alone = []
        for p in prompts:
            engine.target.reset()
            dec = engine.decoder(greedy, seq=0, record_margins=True)
            alone.append(([e.token for e in dec.generate(p, 40)], list(dec.stats.margins)))
        engine.target.reset()
        decs = [engine.decoder(greedy, seq=i) for i in range(4)]
        for d, p in zip(decs, prompts):
            d.start(p, 40)
        out = [[] for _ in prompts]
        while not all(d.done for d in decs):
            for i, evs in engine.batcher.step(decs).events.items():
                out[i] += [e.token for e in evs]
        for d in decs:
            d.close()
        for (ref, margins), got in zip(alone, out):
            n = next((i for i, (a, b) in enumerate(zip(ref, got)) if a != b), None)
            if n is None:
                assert len(got) == len(ref) or got[: len(ref)] == ref[: len(got)]
            else:
                assert margins[n] < NEAR_TIE_LOGIT, f"diverged at token {n} with margin {margins[n]:.3f}"
        print("identical to alone:", [a[0] == o for a, o in zip(alone, out)])
    finally:
        engine.close()


def test_a_prefix_copied_from_another_sequence_decodes_as_if_read(model_path):
    """KV copied between sequences' streams (what a server does for a prompt another slot holds)
    gives, with exact kernels, the very tokens of reading that prefix itself."""
    params = LoadParams(n_ctx=512, n_threads=2, exact=True, n_seq=2)
    engine = Engine(EngineConfig(model_path(SMALL), params, spec=SpecConfig(mode="off"), exact=True, n_seq=2))
    try:
        greedy = SamplingConfig(temperature=0.0)
        doc = engine.raw_tokens("Here is a short list of fruits: apple, banana, cherry, date, elderberry, fig.\n")
        prompt = doc + engine.raw_tokens("The third fruit is")
        reading = engine.decoder(greedy, seq=0)
        read = [e.token for e in reading.generate(prompt, 16)]
        engine.target.seq(1).copy_prefix(engine.target.seq(0), len(doc))
        copied = engine.decoder(greedy, seq=1)
        out = [e.token for e in copied.generate(prompt, 16)]
        assert copied.stats.prompt_cached == len(doc)
        assert out == read
    finally:
        engine.close()


def test_a_prefix_saved_to_host_memory_decodes_as_if_read(model_path):
    """A sequence's KV saved out of the context (the prompt cache) and restored into another
    sequence after its own was overwritten gives, with exact kernels, the very tokens of reading
    the prefix; with the default kernels (one unified cache) any difference is a near tie."""
    for exact in (True, False):
        params = LoadParams(n_ctx=512, n_threads=2, exact=exact, n_seq=2)
        engine = Engine(EngineConfig(model_path(SMALL), params, spec=SpecConfig(mode="off"), exact=exact, n_seq=2))
        try:
            m = engine.target
            greedy = SamplingConfig(temperature=0.0)
            doc = engine.raw_tokens("Here is a short list of fruits: apple, banana, cherry, date, elderberry, fig.\n")
            prompt = doc + engine.raw_tokens("The third fruit is")
            reading = engine.decoder(greedy, seq=0, record_margins=True)
            read = [e.token for e in reading.generate(prompt, 16)]
            saved = m.seq(0).save()
            assert saved.tokens == tuple(m.seq(0).tokens)
            m.seq(0).trim(2)
            m.seq(0).decode(engine.raw_tokens("Something else entirely, written over the document."))
            m.seq(1).decode(engine.raw_tokens("What the other sequence held before."))
            assert m.seq(1).restore(saved, len(doc))
            assert m.seq(1).tokens == doc
            restored = engine.decoder(greedy, seq=1)
            out = [e.token for e in restored.generate(prompt, 16)]
            assert restored.stats.prompt_cached == len(doc)
            if exact:
                assert out == read
            else:
                n = next((i for i, (a, b) in enumerate(zip(read, out)) if a != b), None)
                assert n is None or reading.stats.margins[n] < NEAR_TIE_LOGIT
        finally:
            engine.close()


def test_a_prefix_shared_in_the_unified_cache_decodes_as_if_read_and_leaves_its_source_whole(model_path):
    """Default kernels keep all sequences in one KV cache: a copied prefix is the same cells shared,
    so the copy reads the very K/V its source computed. What the destination held before is
    dropped, and trimming or overwriting the copy leaves the source's cells alone."""
    params = LoadParams(n_ctx=512, n_threads=2, n_seq=3)
    engine = Engine(EngineConfig(model_path(SMALL), params, spec=SpecConfig(mode="off"), n_seq=3))
    try:
        m = engine.target
        assert m.unified_kv
        greedy = SamplingConfig(temperature=0.0)
        doc = engine.raw_tokens("Here is a short list of fruits: apple, banana, cherry, date, elderberry, fig.\n")
        prompt = doc + engine.raw_tokens("The third fruit is")
        reading = engine.decoder(greedy, seq=0, record_margins=True)
        read = [e.token for e in reading.generate(prompt, 16)]
        m.seq(2).decode(engine.raw_tokens("Something else entirely, held before the copy."))
        m.seq(2).copy_prefix(m.seq(0), len(doc))
        assert m.seq(2).tokens == doc
        copied = engine.decoder(greedy, seq=2)
        out = [e.token for e in copied.generate(prompt, 16)]
        assert copied.stats.prompt_cached == len(doc)
        n = next((i for i, (a, b) in enumerate(zip(read, out)) if a != b), None)
        assert n is None or reading.stats.margins[n] < NEAR_TIE_LOGIT
        # the source still answers from its own cells after the copy was trimmed and rewritten
        m.seq(2).trim(3)
        m.seq(2).decode(engine.raw_tokens("Overwriting the shared part."))
        again = engine.decoder(greedy, seq=0)
        assert [e.token for e in again.generate(prompt, 16)] == read
        assert again.stats.prompt_cached == len(prompt) - 1
    finally:
        engine.close()


def test_one_decode_of_several_sequences_is_the_same_in_any_part_order(model_path):
    """decode_parts lays a batch out in sequence order (llama.cpp runs consecutive sequence ids of a
    batch in one pass): the parts' order changes neither the logits nor which rows each part gets."""
    params = LoadParams(n_ctx=256, n_threads=2, n_seq=3)
    engine = Engine(EngineConfig(model_path(SMALL), params, spec=SpecConfig(mode="off"), n_seq=3))
    try:
        m = engine.target
        texts = [m.tokenize(t, special=False) for t in ("The sky is", "One, two, three,", "def add(a, b):")]
        runs = []
        for order in ((0, 1, 2), (2, 0, 1)):
            m.reset()
            outs = m.decode_parts([(m.seq(i), texts[i], range(len(texts[i]))) for i in order])
            runs.append({i: np.array(o) for i, o in zip(order, outs)})
        for i in range(3):
            assert runs[0][i].shape == (len(texts[i]), m.n_vocab)
            assert np.array_equal(runs[0][i], runs[1][i])
        assert not np.array_equal(runs[0][0][-1], runs[0][1][-1])
    finally:
        engine.close()
