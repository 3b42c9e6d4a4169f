"""The replay harness: recorded greedy answers + a machine's cost table -> what each policy would
have drafted, accepted and cost; and the controller checked against llama.cpp's fixed-length n-gram
modes on the machine kinds the project has seen (tests/data/costs)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from edgespec.costs import CostModel
from edgespec.replay import (EOS, NgramMod, NgramSimple, Recording, RecordedTarget, charged, load_cost_table,
                             replay, replay_fixed, replay_live)

DATA = Path(__file__).parent.parent / "data"
SCRIPTS = Path(__file__).parent.parent.parent / "scripts"
TABLES = sorted((DATA / "costs").glob("*.json"))
RECORDINGS = sorted((DATA / "recordings").glob("*.json"))
# Answers to prompts no policy here was tuned on (scripts/heldout.jsonl, recorded with
# scripts/record_replays.py): a change is judged on them as on the built-in ones, apart.
HELDOUT = sorted((DATA / "recordings-heldout").glob("*.json"))
SETS = {"built-in": RECORDINGS, "held-out": HELDOUT}
FIXED = ("ngram-simple", "ngram-simple-16", "ngram-mod")
# a flat-ish machine: a 64-row batch for 8 single passes
CHEAP = CostModel.from_ms({0: {1: 10.0, 2: 12.0, 4: 14.0, 8: 20.0, 16: 30.0, 32: 50.0, 64: 80.0}})


def text(n: int, seed: int, vocab: int = 500) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(10, vocab) for _ in range(n)]


def copy_recording(n: int = 300) -> Recording:
    doc = text(n, 1)
    return Recording("copy", "copy", tuple(text(20, 2) + doc + text(10, 3)), tuple(doc))


# ---- the pieces ---------------------------------------------------------------------------------
def test_the_recorded_target_answers_the_recording_row_by_row():
    target = RecordedTarget([5, 6, 7], [8, 9, EOS], vocab=10)
    target.decode([5, 6])  # the prefill (not a generation pass)
    rows = target.decode([7, 8, 4], range(3))
    assert rows.argmax(axis=1).tolist() == [8, 9, EOS]
    assert target.passes == [(3, 2)]
    target.trim(4)
    assert target.decode([9], [0]).argmax(axis=1).tolist() == [EOS] and target.passes[-1] == (1, 4)


def test_recordings_are_renumbered_densely_with_an_end():
    rec = Recording("r", "copy", (1000, 7, 1000), (7, 99))
    assert rec.dense() == ([1, 2, 1], [2, 3, EOS])


def test_the_models_end_tokens_are_the_end_wherever_they_appear():
    # a chat prompt quotes a block and closes the user's turn with the model's end token (here 5 and 6)
    rec = Recording("r", "copy", (1000, 7, 5, 8, 6), (7, 99), eog=(5, 6))
    assert rec.dense() == ([1, 2, EOS, 3, EOS], [2, 4, EOS])


def test_a_recording_carries_its_budget_and_keeps_it_when_taken_up():
    data = {"id": "r", "category": "copy", "prompt": [1, 2], "answer": list(range(10, 110)), "max_tokens": 160,
            "eog": [7]}
    rec = Recording.from_json(data)
    assert (rec.max_tokens, rec.eog, rec.budget) == (160, (7,), 160)
    assert [r.max_tokens for r in rec.taken_up(20)] == [140, 120]
    # cut as `-n 64` generates it: the budget is 64 too, and an answer that stopped before keeps its own
    assert (len(rec.cut(64).answer), rec.cut(64).budget) == (64, 64)
    assert rec.cut(300) == rec
    # without one, the answer's own length and its end (what an older recording tells)
    old = Recording.from_json({k: v for k, v in data.items() if k not in ("max_tokens", "eog")})
    assert (old.max_tokens, old.eog, old.budget) == (None, (), 101)


def test_every_stored_recording_carries_its_budget_and_the_models_end_tokens():
    for path in (*RECORDINGS, *HELDOUT):
        data = json.loads(path.read_text())
        rec = Recording.from_json(data)
        assert rec.max_tokens is not None and rec.eog, path.stem
        # an answer that ran out of budget filled it; one that stopped ended before it
        assert (len(rec.answer) == rec.max_tokens) if data["finish"] == "length" else (len(rec.answer) < rec.max_tokens), path.stem
        assert rec.prompt.count(rec.eog[0]) + sum(rec.prompt.count(t) for t in rec.eog[1:]) >= 1, path.stem  # the chat turn's end


def stopping_copy(budget: int | None, n: int = 120) -> Recording:
    """An answer that copies a document and stops where it ends, the prompt going on after it."""
    doc = text(n, 5)
    return Recording("stop", "copy", tuple(text(20, 6) + doc + text(80, 7)), tuple(doc), max_tokens=budget)


def test_fixed_modes_draft_past_an_answer_that_stops_before_its_budget_and_pay_for_it():
    """Live, no policy knows where an answer ends: llama.cpp cuts a draft to the budget left
    (n_predict - produced - 1, n_predict = max_tokens - 1), not to the answer's end."""
    known = replay("ngram-simple", stopping_copy(None), CHEAP)
    live = replay("ngram-simple", stopping_copy(400), CHEAP)
    assert live.tokens == known.tokens == 120
    assert live.drafted > known.drafted and live.ms > known.ms
    assert live.batches[-1][0] == 49  # the last 48-token draft ran on past the answer's end
    # where the budget binds, a draft is cut to it
    rec = stopping_copy(100, n=90)
    first = len(rec.prompt) - 1
    res = replay("ngram-simple", rec, CHEAP)
    cuts = [(rows - 1, 100 - 2 - (depth - first)) for rows, depth in res.batches]
    assert all(drafted <= max(left, 0) for drafted, left in cuts)
    assert any(drafted == left < 48 for drafted, left in cuts)
    assert res.tokens == 90


def test_auto_stops_a_copy_at_an_end_token_it_runs_into():
    """A quoted block that closes the user's turn: the copy's next token is the model's end token.
    auto drafts up to it and no further (rows past it could never be part of the answer)."""
    doc = text(200, 8)
    rec = Recording("block", "copy", tuple(text(20, 9) + doc + [7] + text(60, 10)), tuple(doc), eog=(7,), max_tokens=400)
    res = replay("auto", rec, CHEAP)
    assert res.tokens == 200
    # no draft runs past the answer: at most the tokens it has left
    for rows, depth in res.batches:
        left = 200 - (depth - (len(rec.prompt) - 1))
        assert rows - 1 <= left, (rows, depth)
    # the last draft ran to the end token (not drafting it: the target's row before it yields it)
    rows, depth = res.batches[-1]
    assert rows - 1 == 200 - (depth - (len(rec.prompt) - 1)) >= 1
    # llama.cpp's ngram-simple runs on past it, and pays for those rows
    simple = replay("ngram-simple", rec, CHEAP)
    assert simple.drafted > simple.accepted + 1


# What llama.cpp's own loop drafted and kept on the recorded answers (llama-speculative-simple's
# n_drafted / n_accept, the same in every repeat): `scripts/compare_llamacpp --category copy,edit,rename,extract
# --repeats 3 -t 2 --llama-modes ngram-simple,ngram-mod --modes auto` and the held-out copy-heavy prompts,
# 2026-12-07, AMD EPYC Zen 4. Only answers that came out as recorded (a 'length' answer overshoots its
# budget in llama.cpp's last round, and some answers differ at a near-tie): the replay's policies must
# draft what the tool drafts, to the token.
LLAMA_CPP_COUNTS = {
    ("copy-fix-bisect", "ngram-mod"): (512, 364), ("copy-fix-bisect", "ngram-simple"): (480, 387),
    ("copy-hints-difflib", "ngram-mod"): (384, 319), ("copy-hints-difflib", "ngram-simple"): (369, 341),
    ("copy-quote-shlex", "ngram-mod"): (64, 47), ("copy-quote-shlex", "ngram-simple"): (333, 70),
    ("edit-typos", "ngram-mod"): (58, 7), ("edit-typos", "ngram-simple"): (546, 67),
    ("extract-emails", "ngram-simple"): (84, 4), ("hx-extract-formatter", "ngram-simple"): (95, 5),
    ("hx-fix-queue", "ngram-mod"): (64, 1), ("hx-fix-queue", "ngram-simple"): (384, 30),
    ("hx-rename-json", "ngram-mod"): (576, 302), ("hx-rename-json", "ngram-simple"): (816, 392),
    ("hx-sr-textwrap", "ngram-mod"): (267, 145), ("hx-sr-textwrap", "ngram-simple"): (320, 195),
    ("rename-heapq", "ngram-mod"): (320, 141), ("rename-heapq", "ngram-simple"): (384, 213),
}


@pytest.mark.parametrize(("rec_id", "mode"), sorted(LLAMA_CPP_COUNTS))
def test_the_replayed_llama_cpp_modes_draft_and_keep_what_llama_cpp_did(rec_id, mode):
    path = next(p for p in (*RECORDINGS, *HELDOUT) if p.stem == rec_id)
    res = replay(mode, Recording.load(path), CHEAP)
    assert (res.drafted, res.accepted) == LLAMA_CPP_COUNTS[(rec_id, mode)]


def test_ngram_simple_drafts_what_followed_the_latest_twelve_token_match():
    doc = text(100, 4)
    d = NgramSimple()
    ctx = [1] + doc + doc[:12]  # the last 12 tokens occur at 1
    assert d.draft(ctx) == doc[12:60]  # 48 tokens
    assert NgramSimple(12, 16).draft(ctx) == doc[12:28]
    assert d.draft(doc + doc[:12]) == []  # a match at position 0 is llama.cpp's "no match"
    assert d.draft([1] + doc + doc[:11] + [1]) == []  # no 12-token match
    assert NgramSimple(12, 16).draft([1] + doc[:30] + doc[:12]) == doc[12:28]
    assert d.draft([1] + [5, 6, 7] * 30) == []  # the latest match is 3 back: 3 tokens follow it, under 12
    assert d.draft([1] + doc[:14] + doc[:12]) == []  # under n + m + 1 tokens: nothing


def test_ngram_mod_drafts_48_or_more_and_forgets_after_five_poor_rounds():
    doc = text(200, 5)
    d = NgramMod()
    d.begin(doc + doc[:23])
    draft = d.draft(doc + doc[:24])
    assert draft == doc[24:88]  # 64 tokens chained through the 24-gram table
    d2 = NgramMod()
    d2.begin(doc[:40] + doc[:23])  # 24-grams at 0..38: the chain from doc[:24] holds 39 tokens
    assert d2.draft(doc[:40] + doc[:24]) == []  # under the 48 minimum
    d3 = NgramMod()
    d3.begin(doc[:60] + doc[:23])
    assert len(d3.draft(doc[:60] + doc[:24])) == 59  # 48 or more: drafted, up to where the table ends
    for _ in range(5):
        d.draft(doc + doc[:24])
        d.accept(2)  # 2 of 64: under a quarter
    assert d.table == {} and d.i_last == 0


def test_plain_costs_one_pass_per_token_at_each_depth():
    rec = copy_recording(50)
    r = replay("plain", rec, CHEAP)
    assert r.tokens == 50 and r.passes == 51 and r.drafted == 0  # the last pass says the answer ended
    depths = [d for _, d in r.batches]
    assert depths == list(range(len(rec.prompt) - 1, len(rec.prompt) + 50))
    deep = CostModel.from_ms({0: {1: 10.0}, 1000: {1: 20.0}})
    assert replay("plain", rec, deep).ms == pytest.approx(sum(10.0 + d / 100.0 for d in depths))


def test_a_verbatim_copy_is_drafted_and_accepted_by_every_ngram_policy():
    rec = copy_recording()
    plain = replay("plain", rec, CHEAP)
    for policy in ("auto", *FIXED):
        r = replay(policy, rec, CHEAP)
        assert r.tokens == 300 and r.acceptance > 0.9, policy
        assert r.ms < plain.ms / 2, policy


def test_unknown_policy_is_refused():
    with pytest.raises(ValueError, match="unknown policy"):
        replay("magic", copy_recording(), CHEAP)


# ---- the stored machine tables --------------------------------------------------------------------
def test_the_machine_tables_load_with_their_measured_points():
    assert [p.stem for p in TABLES] == ["amd-epyc-avx2", "amd-epyc-avx512", "amd-epyc-zen4-avx512",
                                        "amd-epyc-zen4b-avx512", "amd-epyc-zen4c-avx512", "amd-epyc-zen4d-avx512",
                                        "amd-epyc-zen5-avx512", "amd-epyc-zen5b-avx512", "intel-xeon-amx",
                                        "intel-xeon-avx512", "intel-xeon-icelake-avx512"]
    avx2, avx512, zen4, zen4b, zen4c, zen4d, zen5, zen5b, amx, xeon, icelake = (load_cost_table(p) for p in TABLES)
    assert avx2.t1_ms == 70.2 and avx2.v(8) == pytest.approx(6.4, abs=0.01) and avx2.v(64) == pytest.approx(30.5, abs=0.01)
    assert avx2.t_ms(1, 600) == pytest.approx(108.7)  # 9.2 tok/s past 512 cells
    assert avx512.t1_ms == pytest.approx(28.6) and avx512.v(64) == pytest.approx(23.5, abs=0.01)
    assert xeon.v(64) == pytest.approx(12.2, abs=0.01) and xeon.t_ms(16) == 269.5
    # measured at three depths by a profile: t(1) grows 37.6 -> 39.9 -> 53.3 ms from 0 to 512 to 2048 cells
    assert zen4.t1_ms == pytest.approx(37.586) and zen4.t_ms(1, 2048) == pytest.approx(53.26)
    assert zen4.v(8) == pytest.approx(7.87, abs=0.01) and zen4.t_ms(64, 512) == pytest.approx(944.728)
    # another Zen 4 machine two days on: the same shape (8 rows dear, 16 cheaper than 12), faster single passes
    assert zen4b.t1_ms == pytest.approx(28.429) and zen4b.v(8) == pytest.approx(7.81, abs=0.01)
    assert zen4b.t_ms(16) < zen4b.t_ms(12) and zen4b.t_ms(1, 2048) == pytest.approx(40.175)
    # a third one (2026-12-07): the same shape again
    assert zen4c.t1_ms == pytest.approx(26.599) and zen4c.v(8) == pytest.approx(8.01, abs=0.01)
    assert zen4c.t_ms(16) < zen4c.t_ms(12) and zen4c.t_ms(1, 2048) == pytest.approx(39.254)
    # the same machine three hours on: single passes deep in a prompt dearer (46.3 ms at 2048), batches less so
    assert zen4d.t1_ms == pytest.approx(27.587) and zen4d.t_ms(1, 2048) == pytest.approx(46.279)
    assert zen4d.v(16, 2048) < zen4c.v(16, 2048)
    # Zen 5: single passes cheaper (26.0 ms), 16 rows for 7.1 of them
    assert zen5.t1_ms == pytest.approx(25.998) and zen5.v(16) == pytest.approx(7.12, abs=0.01)
    assert zen5.t_ms(1, 2048) == pytest.approx(42.907)
    # another Zen 5 machine two days on: faster single passes (23.7 ms), and at 2048 cells a 64-row batch
    # cheaper than a 48-row one (569.1 against 661.3 ms)
    assert zen5b.t1_ms == pytest.approx(23.719) and zen5b.v(16) == pytest.approx(6.25, abs=0.01)
    assert zen5b.t_ms(64, 2048) < zen5b.t_ms(48, 2048) and zen5b.t_ms(1, 2048) == pytest.approx(36.486)
    # the slower Xeon: a batch grows with the depth faster than a single pass (t(16) 457.7 -> 883.0 ms
    # from 0 to 2048 cells, t(1) 127.4 -> 141.2)
    assert amx.t1_ms == pytest.approx(127.352) and amx.t_ms(16, 2048) == pytest.approx(882.967)
    assert amx.v(64) == pytest.approx(11.71, abs=0.01) and amx.t_ms(1, 512) == pytest.approx(131.424)
    # Ice Lake at 2.8 GHz: 2 rows for 1.55 passes, 4 rows cheaper than 3, 16 cheaper than 12
    assert icelake.t1_ms == pytest.approx(56.672) and icelake.v(2) == pytest.approx(1.55, abs=0.01)
    assert icelake.t_ms(4) < icelake.t_ms(3) and icelake.t_ms(16) < icelake.t_ms(12)
    assert icelake.t_ms(1, 2048) == pytest.approx(77.151)
    for p in TABLES:
        data = json.loads(p.read_text())
        assert data["sources"] and data["known_points"] and data["filled_points"]


def test_sizes_a_table_lacks_are_charged_as_cpu_kernels_run_them_by_default():
    cost = CostModel.from_ms({0: {1: 10.0, 2: 16.0, 3: 21.0, 16: 40.0, 32: 56.0},
                              512: {1: 20.0, 2: 30.0, 3: 38.0, 4: 40.0, 5: 49.0, 16: 60.0, 32: 76.0}})
    lin, tiles = charged(cost, tiles=False), charged(cost)
    # on the line: 17 rows at a sixteenth of the way from 16 to 32; past 32, its slope
    assert cost.t_ms(17) == 56.0 and lin.t_ms(17) == pytest.approx(41.0) and lin.t_ms(48) == pytest.approx(72.0)
    # in tiles: 20 rows on the line, 17 the 16-row batch and one row at t(3) - t(2), 19 three of them
    assert tiles.t_ms(20) == pytest.approx(44.0) and tiles.t_ms(17) == pytest.approx(45.0)
    assert tiles.t_ms(19) == pytest.approx(55.0) and tiles.t_ms(49) == pytest.approx(72.0 + 5.0)
    # where t(5) was measured, the row past a tile costs t(5) - t(4); measured sizes stay as measured
    assert tiles.t_ms(17, 512) == pytest.approx(69.0) and tiles.t_ms(5, 512) == pytest.approx(49.0)
    assert tiles.t_ms(3, 512) == pytest.approx(38.0) and tiles.t_ms(32, 512) == pytest.approx(76.0)
    assert lin.t_ms(8, 256) == pytest.approx((21.0 + 19.0 * 5 / 13 + 49.0 + 11.0 * 3 / 11) / 2)  # and between depths
    rec = copy_recording()
    costs = {name: replay("ngram-simple", rec, cost, charge=c).ms
             for name, c in (("line", lin), ("tiles", tiles), ("staircase", cost))}
    # its 49-row batches: a row more than the line says, less than the 64-row tile the controller assumes
    assert costs["line"] < costs["tiles"] < costs["staircase"]
    assert replay("ngram-simple", rec, cost).ms == costs["tiles"]


def test_rows_past_a_tile_are_charged_from_each_stored_table_itself():
    # every stored table: a row past a multiple of four costs the table's own row-by-row step (t(5) - t(4),
    # else t(3) - t(2)) above the tile's cost, and never less than the line's share
    for path in TABLES:
        cost = load_cost_table(path)
        lin, tiles = charged(cost, tiles=False), charged(cost)
        for depth in (0, *cost.deeper):
            ms = {k: cost.t_ms(k, depth) for k in cost.sizes()} | {1: cost.t_ms(1, depth)}
            step = ms[5] - ms[4] if 5 in ms else ms[3] - ms[2]
            for k in (17, 33, 49, 65):
                expected = max(lin.t_ms(k - 1, depth) + step, lin.t_ms(k, depth))
                assert tiles.t_ms(k, depth) == pytest.approx(expected), (path.stem, depth, k)
                assert tiles.t_ms(k, depth) >= lin.t_ms(k, depth), (path.stem, depth, k)
        # llama.cpp's 48- and 64-token drafts at depth 0: a row past the tile dearer than the line says
        assert tiles.t_ms(49) > lin.t_ms(49) and tiles.t_ms(65) > lin.t_ms(65), path.stem


# ---- the controller against llama.cpp's fixed-length modes, per machine ------------------------------
COPY_HEAVY = {"copy", "rename", "edit", "extract"}
# where little is copied auto is to be "never slower than plain": within this, the noise of a live run
PLAIN_FLOOR = 0.98
LITTLE_TO_COPY = {"free", "code", "rag", "summ"}
_CACHE: dict = {}


def outcomes(table: Path, rec_path: Path) -> dict:
    key = (table, rec_path)
    if key not in _CACHE:
        cost, rec = load_cost_table(table), Recording.load(rec_path)
        _CACHE[key] = {p: replay(p, rec, cost) for p in ("plain", "auto", *FIXED)}
    return _CACHE[key]


def recordings(categories, paths=(*RECORDINGS, *HELDOUT)) -> list[Path]:
    return [p for p in paths if json.loads(p.read_text())["category"] in categories]


# Where the harness shows auto losing today (modelled ratios in README, *The replay harness*): kept
# as strict expected failures, so a change that fixes one is seen (and one that breaks another too).
KNOWN_LOSSES = {
    # the answer writes its source's "[0, 1]" as "[0.0, 1.0]" inside a 63-token draft: a 64-row batch for 9
    # tokens, then a 15-token draft that breaks at 3, where small batches are dear (v(2) = 1.97); a loss of
    # this table's depth-0 costs charged at every depth (test_the_reconstructed_avx512_epycs_one_copy_loss_...)
    ("amd-epyc-avx512", "copy-hints-difflib"): "auto 0.92x the best fixed mode (ngram-simple)",
    # a summary's 3-token bets on finds (expected 1.07-1.56x where a 4-row batch is cheap), a third kept;
    # finds counted by how far back they agree (one at run 5 where the 4-gram said 4) moved it 0.986x -> 0.979x
    ("intel-xeon-amx", "summ-raise"): "auto 0.979x plain",
    # weak states drafting 3 tokens into a 4-row batch (v(4) = 1.72 < v(3)) at a pooled record
    # lifted by one lucky 12-token shadow round
    ("intel-xeon-avx512", "rag-objects-quote"): "auto 0.93x plain (27-token answer, 1 of 14 drafted accepted)",
    # held-out answers (recorded 2026-12-06). The answer adds type hints: a 63-token draft of a copied
    # function runs into the next signature, where the answer inserts `: str` (24 of 63 kept), and another
    # into a docstring the answer rewords (3 of 63); ngram-simple's 48-token drafts broke nearer their ends
    ("amd-epyc-zen5-avx512", "hx-hints-shutil"): "auto 0.982x the best fixed mode (ngram-simple)",
    # 3-token bets of weak copy states deep in a 2,000-token document (expected 1.04-1.25x), 7 of 28 kept
    ("intel-xeon-amx", "hx-rag-import"): "auto 0.978x plain (132-token answer)",
    # a summary that quotes a sentence of its document: 19 tokens into the quote the copy is trusted, and at
    # depth 2,008 it bets 15 tokens (as much as a 19-token run may risk: controller.RISK_PER_RUN) where the
    # quote ends 6 on: a 16-row batch for 7 tokens. Before the risk limit it bet 63 on all three Zen 4
    # tables (0.92x, 0.88x, 0.89x; live 0.92x on the third machine, README); now the first two pass.
    ("amd-epyc-zen4c-avx512", "hx-summ-try"): "auto 0.976x plain (one 16-row batch for 7 tokens)",
}
# the same for the geometric mean over a table's copy-heavy answers of one set (the issue asks 1.15x)
KNOWN_SHORT: dict[tuple[str, str], str] = {}


def known(why: str | None) -> list:
    """A known shortfall's marks: a strict expected failure (a fix shows as an unexpected pass)."""
    return [pytest.mark.xfail(strict=True, reason=why)] if why else []


def cases(categories) -> list:
    return [pytest.param(table, rec, marks=known(KNOWN_LOSSES.get((table.stem, rec.stem))), id=f"{rec.stem}-{table.stem}")
            for table in TABLES for rec in recordings(categories)]


@pytest.mark.parametrize(("table", "rec"), cases(COPY_HEAVY))
def test_auto_beats_or_matches_every_fixed_length_ngram_mode_on_copy_heavy_answers(table, rec):
    res = outcomes(table, rec)
    best = min(res[p].ms for p in FIXED)
    assert res["auto"].ms <= best, {p: round(res["plain"].ms / r.ms, 3) for p, r in res.items()}


@pytest.mark.parametrize(("table", "group"), [
    pytest.param(t, g, id=f"{g}-{t.stem}", marks=known(KNOWN_SHORT.get((t.stem, g)))) for g in SETS for t in TABLES])
def test_auto_is_well_ahead_of_the_best_fixed_mode_on_copies_taken_together(table, group):
    import math

    ratios = []
    for rec in recordings(COPY_HEAVY, SETS[group]):
        res = outcomes(table, rec)
        ratios.append(min(res[p].ms for p in FIXED) / res["auto"].ms)
    assert len(ratios) >= 6
    assert math.exp(sum(map(math.log, ratios)) / len(ratios)) >= 1.15, ratios


@pytest.mark.parametrize(("table", "rec"), cases(LITTLE_TO_COPY))
def test_auto_is_never_much_slower_than_plain_where_little_is_copied(table, rec):
    res = outcomes(table, rec)
    assert res["plain"].ms / res["auto"].ms >= PLAIN_FLOOR, {p: round(res["plain"].ms / r.ms, 3) for p, r in res.items()}


# hx-code-duration as greedy decoding answered it on the Zen 4 machine of amd-epyc-zen4d-avx512.json
# (scripts/record_replays.py there, 2026-12-07; it leaves the stored recording at token 23): the answer
# repeats a phrase of its own about 190 tokens back, and drafted as a find that turns into a trusted
# copy at 16 tokens, a 14-token match bet 16 rows and kept 1 (0.976x plain on that profile; live 0.95x).
ZEN4_CODE = DATA / "recordings-zen4" / "hx-code-duration.json"


def test_a_phrase_the_answer_repeats_of_its_own_is_not_bet_on_as_a_copy():
    rec, cost = Recording.load(ZEN4_CODE), load_cost_table(DATA / "costs" / "amd-epyc-zen4d-avx512.json")
    auto, plain = replay("auto", rec, cost), replay("plain", rec, cost)
    assert max(rows for rows, _ in auto.batches) <= 2, [b for b in auto.batches if b[0] > 1]
    assert plain.ms / auto.ms >= 1.0


# The AVX-512 EPYC table is a reconstruction (its t(1) and v(64) from the brief, the rest of its shape from
# an old test table) with one depth: its costs at 0 cells are charged at every depth. The Zen 4 tables were
# measured on that machine kind (t(1) 26.6-28.4 ms and v(64) 24.3-27.9 at 0 cells on three of them, the
# reconstruction's 28.6 and 23.5) at three depths, and on every one of them a 64-row batch grows less with
# the depth than a single pass does (README, *The replay harness*: without their deeper tables five of the
# six AVX-512 EPYC tables lose copy-hints-difflib too).
ZEN4_TABLES = ("amd-epyc-zen4-avx512", "amd-epyc-zen4b-avx512", "amd-epyc-zen4c-avx512", "amd-epyc-zen4d-avx512")


def with_measured_growth(base: CostModel, measured: list[CostModel], depths=(512, 2048)) -> CostModel:
    """`base` at 0 cells, and at each depth its t(k) times the median over `measured` of t(k, depth) / t(k, 0)."""
    import statistics

    sizes = [1, *sorted(base.sizes())]
    ms = {0: {k: base.t_ms(k) for k in sizes}}
    for d in depths:
        ms[d] = {k: base.t_ms(k) * statistics.median(m.t_ms(k, d) / m.t_ms(k) for m in measured) for k in sizes}
    return CostModel.from_ms(ms)


def test_the_reconstructed_avx512_epycs_one_copy_loss_is_its_missing_depths():
    recon = load_cost_table(DATA / "costs" / "amd-epyc-avx512.json")
    zen4 = [load_cost_table(DATA / "costs" / f"{t}.json") for t in ZEN4_TABLES]
    grown = with_measured_growth(recon, zen4)
    assert recon.depths() == [0] and grown.depths() == [0, 512, 2048]
    assert grown.t_ms(1) == recon.t_ms(1) and grown.t_ms(1, 2048) > 1.3 * recon.t_ms(1)
    assert grown.v(64, 2048) < recon.v(64)  # a large batch dearer at depth, but less so than a single pass
    # without depths it is a known loss (KNOWN_LOSSES: 0.92x); with them auto is ahead
    rec = Recording.load(DATA / "recordings" / "copy-hints-difflib.json")
    auto, best = replay("auto", rec, grown).ms, min(replay(p, rec, grown).ms for p in FIXED)
    assert auto <= best, round(best / auto, 3)


# Prompts that end inside the answer (Recording.taken_up: a "continue", an editor's half-written
# file), every TAKEN_UP_EVERY tokens: there the copy is already long when decoding starts, and a
# drafter that judged it by the four tokens that found it ramped up from a fresh find (geometric
# means 1.00-1.38x of the best fixed mode, README *The replay harness*; 1.10-1.45x since).
TAKEN_UP_EVERY = 64


# Tables where the cuts' geometric mean is under the 1.1 asserted below (none since the replay cuts
# drafts by the budget, not the answer's end: the third Zen 4 machine's 1.085x -> 1.112x)
KNOWN_TAKEN_UP_SHORT: dict[str, str] = {}


@pytest.mark.parametrize("table", [pytest.param(t, id=t.stem, marks=known(KNOWN_TAKEN_UP_SHORT.get(t.stem)))
                                   for t in TABLES])
def test_answers_taken_up_inside_a_copy_are_drafted_as_the_long_copies_they_are(table):
    cost = load_cost_table(table)
    copies, few = [], []
    for path in (*RECORDINGS, *HELDOUT):
        rec = Recording.load(path)
        for later in rec.taken_up(TAKEN_UP_EVERY):
            auto = replay("auto", later, cost).ms
            if rec.category in COPY_HEAVY:
                copies.append(min(replay(p, later, cost).ms for p in FIXED) / auto)
            else:
                few.append(replay("plain", later, cost).ms / auto)
    assert len(copies) >= 50 and len(few) >= 8
    assert geomean(copies) >= 1.1, sorted(copies)[:5]
    assert geomean(few) >= PLAIN_FLOOR, sorted(few)[:5]


def test_an_answer_is_taken_up_from_every_nth_token_leaving_room_for_a_long_draft():
    rec = Recording("r", "copy", (1, 2), tuple(range(10, 110)))
    later = rec.taken_up(20)
    assert [r.id for r in later] == ["r@20", "r@40"]  # from 60 on fewer than MIN_LEFT = 48 are left
    assert later[0].prompt == (1, 2, *range(10, 30)) and later[0].answer == tuple(range(30, 110))
    assert rec.taken_up(200) == []
    with pytest.raises(ValueError):
        rec.taken_up(0)


def test_every_known_loss_names_a_stored_table_and_recording():
    assert {t for t, _ in KNOWN_LOSSES} | {t for t, _ in KNOWN_SHORT} | set(KNOWN_TAKEN_UP_SHORT) <= {p.stem for p in TABLES}
    assert {r for _, r in KNOWN_LOSSES} <= {p.stem for p in (*RECORDINGS, *HELDOUT)}
    assert {g for _, g in KNOWN_SHORT} <= set(SETS)


def test_the_held_out_answers_are_of_the_held_out_prompts_and_not_the_built_in_ones():
    prompts = SCRIPTS / "heldout.jsonl"
    ids = {json.loads(line)["id"] for line in prompts.read_text().splitlines() if line.strip()}
    assert {p.stem for p in HELDOUT} == ids and len(ids) == 9
    assert not {p.stem for p in HELDOUT} & {p.stem for p in RECORDINGS}
    assert len(recordings(COPY_HEAVY, HELDOUT)) == 6 and len(recordings(LITTLE_TO_COPY, HELDOUT)) == 3


# ---- a saved profile on a machine that has moved since (live timing on a scripted clock) --------------
LATER = DATA / "costs-later" / "intel-xeon-amx-17h.json"  # the amx machine's profile seven hours on
NOISE = 0.08  # each pass +-8% (log-normal): a real run's passes are never the profile's to the millisecond


def geomean(xs) -> float:
    import math

    return math.exp(sum(map(math.log, xs)) / len(xs))


def live_against(profile: CostModel, machine: CostModel) -> dict[str, list[tuple[float, float]]]:
    """Per group of recordings, (auto choosing from `profile` without live timing, with it) as
    ratios to the machine's reference: the best fixed mode on copies, plain elsewhere."""
    out: dict[str, list[tuple[float, float]]] = {"copy": [], "few": []}
    charge = charged(machine)
    for path in RECORDINGS:
        rec = Recording.load(path)
        copy = rec.category in COPY_HEAVY
        ref = min(replay(p, rec, machine).ms for p in FIXED) if copy else replay("plain", rec, machine).ms
        fixed = replay("auto", rec, profile, charge=charge).ms
        live = replay_live(rec, profile, machine, noise=NOISE).ms
        out["copy" if copy else "few"].append((ref / fixed, ref / live))
    return out


@pytest.mark.parametrize("table", TABLES, ids=[t.stem for t in TABLES])
def test_live_timing_on_the_profiled_machine_changes_next_to_nothing(table):
    cost = load_cost_table(table)
    for group, pairs in live_against(cost, cost).items():
        fixed, live = geomean([f for f, _ in pairs]), geomean([x for _, x in pairs])
        assert live >= 0.985 * fixed, (group, fixed, live)


def test_a_profile_that_drifted_is_corrected_where_little_is_copied():
    # the amx Xeon's morning profile on the same machine seven hours later: single passes a third
    # faster, batches less so (v(16) 3.6 -> 4.2). Without live timing the old shape drafts in prose
    # and summaries that no longer pay (0.991x plain since echoes are judged apart, 0.987x before).
    morning, later = load_cost_table(TABLES[[t.stem for t in TABLES].index("intel-xeon-amx")]), load_cost_table(LATER)
    res = live_against(morning, later)
    few_fixed, few_live = geomean([f for f, _ in res["few"]]), geomean([x for _, x in res["few"]])
    assert few_fixed < 1.0 and few_live >= PLAIN_FLOOR and few_live >= few_fixed + 0.01, (few_fixed, few_live)
    copy_fixed, copy_live = geomean([f for f, _ in res["copy"]]), geomean([x for _, x in res["copy"]])
    # copies: near the tolerance of the test above (with HISTORY_MIN_RUNS the profile-only run's
    # edit-var-to-let went 1.84x -> 2.08x and live timing's did not; with drafts cut by the budget,
    # edit-rename's 1.87x -> 1.91x and copy-fix-bisect's 1.28x -> 1.23x: 1.65% apart over the twelve)
    assert copy_live >= 0.98 * copy_fixed and copy_live >= 1.15, (copy_fixed, copy_live)


def test_a_decoder_that_drafts_every_round_still_learns_what_single_passes_cost():
    # the AVX2 EPYC's profile (deep in a prompt a 2-row batch costs 1.02 single passes there) on the
    # AVX-512 EPYC (1.97): drafting one token every round never times a single pass to compare with,
    # unless a close call gives way to one (timing.SHAPE_ANCHOR)
    avx2, avx512 = (load_cost_table(DATA / "costs" / f"{n}.json") for n in ("amd-epyc-avx2", "amd-epyc-avx512"))
    rec = Recording.load(DATA / "recordings" / "rag-with-own-words.json")
    plain = replay("plain", rec, avx512).ms
    assert plain / replay("auto", rec, avx2, charge=charged(avx512)).ms < 0.75
    for seed in range(3):
        assert plain / replay_live(rec, avx2, avx512, noise=NOISE, seed=seed).ms >= 0.95


def _replay_compare(tmp_path, table: str, recordings, *args: str):
    """scripts/replay_compare on one stored table (copied into its own folder) and `recordings`: a
    folder, or recording names copied from the built-in set into one."""
    import shutil
    import subprocess
    import sys

    tables = tmp_path / "t"
    tables.mkdir(exist_ok=True)
    shutil.copy(DATA / "costs" / f"{table}.json", tables)
    if not isinstance(recordings, Path):
        folder = tmp_path / "r"
        folder.mkdir(exist_ok=True)
        for name in recordings:
            shutil.copy(DATA / "recordings" / f"{name}.json", folder)
        recordings = folder
    return subprocess.run([sys.executable, str(SCRIPTS / "replay_compare"), "--tables", str(tables),
                           "--recordings", str(recordings), *args], capture_output=True, text=True)


def test_replay_compare_prints_a_profile_used_on_another_machine(tmp_path):
    run = _replay_compare(tmp_path, "intel-xeon-amx", ("copy-fix-bisect", "summ-raise"), "--machine", str(LATER))
    assert run.returncode == 0, run.stderr
    out = run.stdout
    assert "## intel-xeon-amx used on intel-xeon-amx-17h" in out
    header = next(line for line in out.splitlines() if line.startswith("| recording"))
    assert header.split(" | ")[2:5] == ["plain", "auto", "auto-live"]
    assert "geometric mean of auto-live / best fixed on copy-heavy recordings" in out
    rows = [line for line in out.splitlines() if line.startswith("| summ-raise")]
    assert len(rows) == 1 and len(rows[0].split(" | ")) == len(header.split(" | "))


def test_replay_compare_reads_every_folder_of_recordings_it_is_given(tmp_path):
    run = _replay_compare(tmp_path, "intel-xeon-amx", DATA / "recordings", "--recordings", str(DATA / "recordings-heldout"))
    assert run.returncode == 0, run.stderr
    rows = {line.split(" | ")[0][2:] for line in run.stdout.splitlines() if line.startswith("| ") and "---" not in line}
    assert {p.stem for p in (*RECORDINGS, *HELDOUT)} <= rows
    (tmp_path / "none").mkdir()
    empty = _replay_compare(tmp_path, "intel-xeon-amx", tmp_path / "none")
    assert empty.returncode == 2 and "no recordings (*.json) in" in empty.stderr and "Traceback" not in empty.stderr


def test_replay_compare_charges_sizes_a_table_lacks_in_tiles_or_on_the_line(tmp_path):
    def tok_s(charge: str) -> dict[str, float]:
        run = _replay_compare(tmp_path, "amd-epyc-avx512", ("copy-hints-difflib",), "--charge", charge)
        assert run.returncode == 0, run.stderr
        out = run.stdout
        header = next(line for line in out.splitlines() if line.startswith("| recording")).split(" | ")
        row = next(line for line in out.splitlines() if line.startswith("| copy-hints-difflib")).split(" | ")
        return {name: float(cell.split()[0]) for name, cell in zip(header[2:-1], row[2:-1])}

    tiles, line = tok_s("tiles"), tok_s("linear")
    cost = load_cost_table(tmp_path / "t" / "amd-epyc-avx512.json")
    rec = Recording.load(tmp_path / "r" / "copy-hints-difflib.json")
    assert tiles["ngram-simple"] == pytest.approx(replay("ngram-simple", rec, cost).tokens_per_s, abs=0.05)
    assert line["ngram-simple"] == pytest.approx(
        replay("ngram-simple", rec, cost, charge=charged(cost, tiles=False)).tokens_per_s, abs=0.05)
    assert line["ngram-simple"] > tiles["ngram-simple"] and line["plain"] == tiles["plain"]  # its 49-row batches
    bad = _replay_compare(tmp_path, "amd-epyc-avx512", ("copy-hints-difflib",), "--charge", "stairs")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr


def test_replay_compare_takes_each_answer_up_from_every_nth_token(tmp_path):
    run = _replay_compare(tmp_path, "amd-epyc-avx2", ("edit-rename",), "--start-every", "50")
    assert run.returncode == 0, run.stderr
    rec = Recording.load(tmp_path / "r" / "edit-rename.json")
    rows = [line.split(" | ")[0][2:] for line in run.stdout.splitlines() if line.startswith("| edit-rename")]
    assert rows == [r.id for r in rec.taken_up(50)] and len(rows) >= 2
    assert f"of {len(rows)} below 1.00x" in run.stdout
    bad = _replay_compare(tmp_path, "amd-epyc-avx2", ("edit-rename",), "--start-every", "0")
    assert bad.returncode == 2 and "--start-every must be at least 1" in bad.stderr and "Traceback" not in bad.stderr


def test_the_taken_up_held_out_prompts_are_the_held_out_ones_cut_at_a_line_end_past_the_middle():
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_taken_up_prompts", SCRIPTS / "make_taken_up_prompts.py")
    make = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make)
    assert make.cut([b"a\n"] * 100) == 50
    assert make.cut([b"a"] * 60 + [b"\n"] + [b"b"] * 39) is None  # no line end leaving 48 to generate
    assert make.cut([b"a"] * 30 + [b"\n"] + [b"b"] * 69) is None  # none from the middle on
    heldout = {json.loads(line)["id"]: json.loads(line) for line in (SCRIPTS / "heldout.jsonl").read_text().splitlines()
               if line.strip()}
    rows = [json.loads(line) for line in (SCRIPTS / "heldout-taken-up.jsonl").read_text().splitlines() if line.strip()]
    assert len(rows) == len(recordings(COPY_HEAVY, HELDOUT)) == 6
    for row in rows:
        pid, start = row["id"].split("@")
        rec = Recording.load(DATA / "recordings-heldout" / f"{pid}.json")
        assert row["prompt"] == heldout[pid]["prompt"] and row["category"] == heldout[pid]["category"]
        assert len(rec.answer) // 2 <= int(start) <= len(rec.answer) - 48 and row["prefill"].endswith("\n")
        assert row["max_tokens"] == len(rec.answer) - int(start)
