"""Many sequences in one target pass (edgespec.batch): the same tokens as each sequence alone, the
draft lengths chosen for the whole batch, prompts read in chunks between rounds, exact kernels'
row cap, and one sequence's end leaving the others untouched."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from edgespec.backend.model import LoadParams
from edgespec.batch import PREFILL_CHUNK, PREFILL_STEP_S, ROW_TILE, Batcher, prefill_rows
from edgespec.config import SpecConfig
from edgespec.controller import Controller, CostModel, Load, batch_cost, ubatch_sizes
from edgespec.engine import Engine, EngineConfig
from edgespec.sampling import SamplingConfig

from .fake_llama import VOCAB, FakeLlama

GREEDY = SamplingConfig(temperature=0.0)


def copy_lm(seed: int = 0):
    """A language that mostly repeats the context 8 tokens back (n-gram drafts get accepted) with a
    table-driven twist now and then (they get rejected), over the fake's byte vocabulary."""
    rng = np.random.default_rng(seed)
    table = rng.normal(size=(VOCAB,)).astype(np.float32)

    def logits(ctx):
        row = table[np.roll(np.arange(VOCAB), ctx[-1] % 13)].copy()
        if len(ctx) > 8 and (len(ctx) % 11):
            row[ctx[-8]] += 20.0
        return row

    return logits


def engine(n_seq: int, *, mode: str = "auto", exact: bool = False, cost: CostModel | None = None, n_batch: int = 512):
    target = FakeLlama(lm=copy_lm(), n_seq=n_seq, n_batch=n_batch, max_exact_batch=7 if exact else None)
    config = EngineConfig(Path("fake.gguf"), LoadParams(), spec=SpecConfig(mode=mode), cost=cost, exact=exact, n_seq=n_seq)
    return Engine(config, models=(target, None))


def prompts(n: int) -> list[list[int]]:
    rng = np.random.default_rng(7)
    return [[int(t) for t in rng.integers(2, VOCAB, size=20 + 15 * i)] for i in range(n)]


def random_prompts(seed: int, *sizes: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [[int(t) for t in rng.integers(2, VOCAB, size=n)] for n in sizes]


def fresh_decoders(eng: Engine, n: int) -> list:
    """Decoders for sequences 0..n-1 of an emptied target."""
    eng.target.reset()
    return [eng.decoder(GREEDY, seq=i) for i in range(n)]


def alone(eng: Engine, prompt, max_tokens=60) -> list[int]:
    eng.target.reset()
    dec = eng.decoder(GREEDY, seq=0)
    return [ev.token for ev in dec.generate(prompt, max_tokens)]


def together(eng: Engine, ps, max_tokens=60, stop_after: dict[int, int] | None = None):
    eng.target.reset()
    decs = [eng.decoder(GREEDY, seq=i) for i in range(len(ps))]
    for d, p in zip(decs, ps):
        d.start(p, max_tokens)
    out = [[] for _ in ps]
    while not all(d.done for d in decs):
        res = eng.batcher.step(decs)
        for i, evs in res.events.items():
            out[i] += [e.token for e in evs]
        for i, n in (stop_after or {}).items():
            if len(out[i]) >= n and not decs[i].done:
                decs[i].close()
                decs[i].stats.finish_reason = "cancelled"
    for d in decs:
        d.close()
    return out, decs


# batches nearly as cheap as one row: drafting pays in a full batch too, so the test sees drafts
CHEAP = CostModel(verify={k: 1 + 0.05 * (k - 1) for k in range(2, 65)})


def test_sequences_batched_together_emit_what_each_emits_alone():
    eng = engine(4, cost=CHEAP)
    ps = prompts(4)
    solo = [alone(eng, p) for p in ps]
    both, decs = together(eng, ps)
    assert both == solo
    assert sum(r.drafted for d in decs for r in d.stats.rounds) > 0, "nothing was drafted"
    # rows of different sequences shared decodes
    assert any(len(parts) > 1 for parts in eng.target.batches)


def test_exact_prompt_chunks_do_not_depend_on_what_else_runs():
    # exact kernels: a prompt is read in the same chunks alone or beside others, so its KV is too
    eng = engine(3, exact=True)
    long = [int(t) for t in np.random.default_rng(3).integers(2, VOCAB, size=3 * PREFILL_CHUNK + 5)]
    eng.target.reset()
    a = eng.decoder(GREEDY, seq=0)
    a.start(long, 1)
    while a.prefill_left:
        eng.batcher.step([a])
    chunks_alone = [n for parts in eng.target.batches for s, n, w in parts if s == 0 and not w]
    eng.target.reset()
    eng.target.batches.clear()
    decs = [eng.decoder(GREEDY, seq=i) for i in range(3)]
    for d in decs:
        d.start(long, 1)
    while any(d.prefill_left for d in decs):
        eng.batcher.step(decs)
    for i in range(3):
        assert [n for parts in eng.target.batches for s, n, w in parts if s == i and not w] == chunks_alone


def test_ending_one_sequence_leaves_the_others_exactly_as_they_were():
    eng = engine(3)
    ps = prompts(3)
    solo = [alone(eng, p) for p in ps]
    out, _ = together(eng, ps, stop_after={1: 5})
    assert out[0] == solo[0] and out[2] == solo[2]
    assert out[1] == solo[1][: len(out[1])]


def test_a_long_prompt_is_read_in_chunks_between_the_others_rounds():
    eng = engine(2)
    short, long = [5, 6, 7, 8], [int(t) for t in np.random.default_rng(1).integers(2, VOCAB, size=5 * PREFILL_CHUNK)]
    eng.target.reset()
    a, b = eng.decoder(GREEDY, seq=0), eng.decoder(GREEDY, seq=1)
    a.start(short, 40)
    eng.batcher.step([a])  # a is decoding
    b.start(long, 10)
    emitted = 0
    while b.prefill_left:
        res = eng.batcher.step([a, b])
        emitted += len(res.events.get(0, ()))
        assert res.rows <= PREFILL_CHUNK + a.settings.draft_max + 1
    assert emitted >= 4, "the running sequence kept emitting while the long prompt was read"
    mixed = [parts for parts in eng.target.batches if {0, 1} <= {s for s, _, _ in parts}]
    assert mixed and all(n <= PREFILL_CHUNK for parts in mixed for s, n, _ in parts if s == 1)


def test_exact_kernels_keep_every_decode_within_their_row_limit_and_prompts_apart():
    eng = engine(4, exact=True)
    ps = prompts(4)
    solo = [alone(eng, p) for p in ps]
    eng.target.batches.clear()
    out, _ = together(eng, ps)
    assert out == solo
    verifies = [parts for parts in eng.target.batches if any(w for _, _, w in parts)]
    for parts in verifies:
        assert sum(n for _, n, _ in parts) <= 7
        assert all(w == n for _, n, w in parts), "a prompt chunk shared a verify batch"
    assert any(len(parts) > 1 for parts in verifies)


def test_more_sequences_than_exact_rows_still_all_advance():
    eng = engine(9, exact=True)
    ps = prompts(9)
    out, decs = together(eng, ps, max_tokens=12)
    assert all(d.stats.finish_reason in ("length", "stop") for d in decs)
    assert all(sum(n for _, n, w in parts) <= 7 for parts in eng.target.batches if any(w for _, _, w in parts))


# ---- the choice for the whole batch -----------------------------------------------------------
def test_ubatch_sizes_follow_llamas_equal_split():
    assert ubatch_sizes([1]) == [1]
    assert ubatch_sizes([4, 4, 4, 4]) == [16]
    assert ubatch_sizes([5, 1, 1, 1]) == [4, 4]
    assert ubatch_sizes([13, 1, 1, 1]) == [4, 12]
    assert ubatch_sizes([3, 0, 2]) == [4, 1]
    cost = CostModel(verify={2: 1.5, 4: 2.0, 12: 5.0, 16: 6.0})
    assert batch_cost(cost, [13, 1, 1, 1]) == cost.v(4) + cost.v(12)


def test_one_unified_cache_runs_any_mix_of_rows_as_one_pass():
    assert ubatch_sizes([8, 4, 2, 1], streams=False) == [15]
    assert ubatch_sizes([0, 0], streams=False) == []
    cost = CostModel(verify={2: 1.5, 4: 2.0, 12: 5.0, 16: 6.0})
    assert batch_cost(cost, [13, 1, 1, 1], streams=False) == cost.v(16)
    # a stream each: the same rows are two passes and cost more, so drafts beside others are dearer
    assert batch_cost(cost, [13, 1, 1, 1]) > batch_cost(cost, [13, 1, 1, 1], streams=False)
    c = Controller(CostModel(verify={k: 1 + 0.3 * (k - 1) for k in range(2, 40)}), k_max=16)
    c.estimate("x", 0.9)
    split = c.choose("x", 0.0, 16, load=Load((1, 1, 1), 3.0))
    unified = c.choose("x", 0.0, 16, load=Load((1, 1, 1), 3.0, streams=False))
    assert unified.k >= split.k and unified.expected_speedup > split.expected_speedup


def test_fast_kernels_share_one_kv_cache_and_exact_ones_keep_a_stream_per_sequence():
    assert LoadParams(n_seq=4).unified_kv
    assert not LoadParams(n_seq=4, exact=True).unified_kv
    assert not LoadParams(n_seq=1).unified_kv  # one sequence: nothing to share
    for exact in (False, True):
        eng = engine(4, exact=exact)
        eng.target.reset()
        decs = [eng.decoder(GREEDY, seq=i) for i in range(4)]
        seen = []
        for d, p in zip(decs, prompts(4)):
            d.start(p, 8)
            plan = d.plan
            d.plan = lambda plan=plan, **kw: (seen.append(kw["load"]), plan(**kw))[1]
        for _ in range(3):
            eng.batcher.step(decs)
        # the planner prices each batch as the layout runs it: one pass, or llama.cpp's equal split
        assert seen and {ld.streams for ld in seen if ld is not None} == {exact}


def test_a_step_that_reads_a_prompt_beside_decoding_rows_fills_whole_row_tiles():
    eng = engine(4, n_batch=512)
    rng = np.random.default_rng(9)
    long = [int(t) for t in rng.integers(2, VOCAB, size=700)]
    eng.target.reset()
    decs = [eng.decoder(GREEDY, seq=i) for i in range(4)]
    for i, d in enumerate(decs):
        d.start(long if i == 0 else prompts(4)[i], 40)
    for _ in range(12):
        eng.batcher.step(decs)
    mixed = [parts for parts in eng.target.batches if any(w == 0 for _, _, w in parts) and any(w for _, _, w in parts)]
    assert mixed
    for parts in mixed:
        rows = sum(n for _, n, _ in parts)
        assert rows % ROW_TILE == 0 and rows <= PREFILL_CHUNK + 16, parts
    # what was cut from a chunk is read later, none of it lost
    assert sum(n for parts in eng.target.batches for s, n, w in parts if s == 0 and not w) >= 699 - decs[0].prefill_left


def test_a_prompt_is_read_beside_running_streams_in_steps_of_about_prefill_step_s():
    def machine(t64_ms):  # a profile whose 64-row batch takes t64_ms
        return CostModel.from_ms({0: {1: t64_ms / 20, 16: t64_ms / 3, 64: t64_ms}})

    assert prefill_rows(CostModel(), 512) == PREFILL_CHUNK  # no profile: no scale
    assert prefill_rows(machine(2100.0), 512) == PREFILL_CHUNK  # a slow CPU: never fewer
    rows = prefill_rows(machine(516.0), 512)  # the Zen 5 EPYC: ~124 rows in a second
    assert rows % ROW_TILE == 0 and rows * 516.0 / 64 <= PREFILL_STEP_S * 1000 < (rows + ROW_TILE) * 516.0 / 64
    assert prefill_rows(machine(20.0), 512) == 512  # a GPU: a whole batch
    assert prefill_rows(machine(20.0), 48) == 48
    eng = Engine(EngineConfig(Path("fake.gguf"), LoadParams(), cost=machine(516.0), n_seq=2),
                 models=(FakeLlama(lm=copy_lm(), n_seq=2), None))
    assert eng.batcher.prefill_chunk == rows


def test_alone_the_choice_is_exactly_the_single_sequence_rule():
    cost = CostModel(verify={k: 1 + 0.3 * (k - 1) for k in range(2, 18)})
    a, b = Controller(cost, k_max=16), Controller(cost, k_max=16)
    for alpha_key in ("x", "y"):
        a.estimate(alpha_key, 0.8), b.estimate(alpha_key, 0.8)
    assert a.choose("x", 0.0, 16) == b.choose("x", 0.0, 16, load=Load())


def test_drafts_shrink_as_the_batch_fills_and_stop_where_batching_already_pays():
    # batches cost 0.3 of a pass per extra row: alone an 80% drafter pays; beside three other
    # sequences the rows it would add cost nearly what they bring
    cost = CostModel(verify={k: 1 + 0.3 * (k - 1) for k in range(2, 40)})
    ks = []
    for others in (0, 1, 3, 7):
        c = Controller(cost, k_max=16)
        c.estimate("x", 0.8)
        load = Load((1,) * others, float(others)) if others else None
        ks.append(c.choose("x", 0.0, 16, load=load).k)
    assert ks[0] > 0
    assert ks == sorted(ks, reverse=True)
    assert ks[-1] == 0
    # a near-certain long copy still earns its rows in a full batch
    c = Controller(cost, k_max=16)
    c.estimate("sure", 0.995)
    assert c.choose("sure", 0.0, 16, load=Load((1,) * 7, 7.0)).k >= 8


def test_a_prompt_chunk_in_the_step_does_not_make_drafts_look_cheap():
    # a 64-token prompt chunk in the same pass is work done anyway: judged against it, a few more
    # rows looked nearly free; judged against the decode rows' own pass they are what they are
    cost = CostModel(verify={k: 1 + 0.3 * (k - 1) for k in range(2, 140)})
    for others in (1, 3, 7):
        c = Controller(cost, k_max=16)
        c.estimate("x", 0.8)
        bare = c.choose("x", 0.0, 16, load=Load((1,) * others, float(others)))
        beside = c.choose("x", 0.0, 16, load=Load((1,) * others, float(others), prompt_rows=(64,)))
        assert beside.k <= bare.k
    assert beside.k == 0
    # the chunk still counts in the rows the batch holds (the batch size limit)
    assert Load((1, 1), 2.0, prompt_rows=(64,)).rows == 66
    assert Load(prompt_rows=(64,)).expecting(2).plus(3, 2.5) == Load((1, 1, 3), 4.5, prompt_rows=(64,))


def test_batcher_row_budget_is_never_exceeded():
    eng = engine(4, n_batch=24)
    ps = prompts(4)
    out, _ = together(eng, ps, max_tokens=30)
    assert all(sum(n for _, n, _ in parts) <= 24 for parts in eng.target.batches)


def test_the_session_ngram_drafter_keeps_what_it_learnt_across_turns_until_forgotten():
    eng = engine(1)
    first = prompts(1)[0]
    d1 = eng.decoder(GREEDY)
    answer = [e.token for e in d1.generate(first, 30)]
    learnt = d1.ngram
    assert len(learnt._ctx) > len(first) and learnt._ctx == (first + answer)[: len(learnt._ctx)]
    index = learnt._index  # a drafter that starts again builds a new one
    d2 = eng.decoder(GREEDY)  # the next turn: its prompt extends the last one's context
    assert d2.ngram is learnt
    list(d2.generate(first + answer + [7, 8, 9], 5))
    assert learnt._index is index and learnt._ctx[: len(first) + len(answer)] == first + answer
    list(eng.decoder(GREEDY).generate([9, 8, 7, 6], 3))  # an unrelated prompt: that one starts again
    assert learnt._index is not index
    assert eng.decoder(GREEDY, seq=0).ngram is not learnt  # a server request starts afresh
    eng.reset(forget_learning=True)
    assert eng.decoder(GREEDY).ngram is not learnt


def test_with_nobody_decoding_a_step_reads_a_whole_batch_of_prompt():
    eng = engine(2, n_batch=256)
    long = [int(t) for t in np.random.default_rng(5).integers(2, VOCAB, size=600)]
    eng.target.reset()
    a, b = eng.decoder(GREEDY, seq=0), eng.decoder(GREEDY, seq=1)
    a.start(long, 4)
    b.start(long[:300], 4)
    eng.batcher.step([a, b])
    first = eng.target.batches[0]
    assert sum(n for _, n, _ in first) == 256  # not PREFILL_CHUNK: no stream is waiting on tokens


def test_with_nobody_decoding_short_prompts_are_read_whole_before_a_long_one():
    eng = engine(3, n_batch=256)
    long, short, shorter = random_prompts(6, 600, 90, 40)
    decs = fresh_decoders(eng, 3)
    for d, p in zip(decs, (long, short, shorter)):  # the long one came first
        d.start(p, 4)
    out = eng.batcher.step(decs)
    # whole, each with its first round in the same batch (they emit now); the long one waits
    assert sorted(n - w for _, n, w in eng.target.batches[0]) == [39, 89]
    assert all(w >= 1 for _, _, w in eng.target.batches[0]) and sorted(out.events) == [1, 2]
    assert decs[0].prefill_left == 599 and not decs[1].prefill_left and not decs[2].prefill_left
    eng.batcher.step(decs)  # now two decode: the long prompt is read a chunk at a time beside them
    assert decs[0].prefill_left == 599 - (PREFILL_CHUNK - 2)  # the step holds PREFILL_CHUNK rows in all


def test_beside_running_streams_a_short_prompt_is_read_before_a_long_one_and_emits_as_it_ends():
    eng = engine(3, n_batch=512)
    running, long, short = random_prompts(8, 30, 400, 40)
    decs = fresh_decoders(eng, 3)
    decs[0].start(running, 40)
    eng.batcher.step(decs[:1])  # it decodes from now on
    decs[1].start(long, 4)  # the long prompt came first
    eng.batcher.step(decs[:2])
    assert decs[1].prefill_left == 399 - (PREFILL_CHUNK - 1)
    decs[2].start(short, 4)
    eng.target.batches.clear()
    out = eng.batcher.step(decs)
    rows = {seq: (n, w) for seq, n, w in eng.target.batches[0]}
    assert rows[2][0] - rows[2][1] == 39 and rows[2][1] >= 1  # all of the short prompt, then its round
    assert 2 in out.events and len(out.events[2]) >= 1  # its first token in the step that read its prompt's end
    assert decs[1].prefill_left == 399 - (PREFILL_CHUNK - 1) - (rows[1][0] if 1 in rows else 0)
    assert sum(n - w for n, w in rows.values()) <= PREFILL_CHUNK  # prompt rows stay within the chunk
