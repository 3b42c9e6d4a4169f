"""edgespec bench: prompt files, statistics, verification, and the run loop over fake models."""

from __future__ import annotations

import io
import json

import pytest
from rich.console import Console

from edgespec.bench.prompts import (BenchPrompt, filter_categories, load_prompts, parse_modes, parse_prompts,
                                    runnable_modes, split_list)
from edgespec.bench.results import NEAR_TIE_LOGIT, BenchResult, compare_runs, first_difference, verify_runs
from edgespec.bench.runner import BenchEvent, run_bench
from edgespec.bench.stats import Run, aggregate, measure, median, speedup, speedup_overlaps_one
from edgespec.config import DraftLimits, SpecConfig
from edgespec.costs import CostModel
from edgespec.engine import Engine
from edgespec.errors import InputError
from edgespec.generate import GenerationStats
from edgespec.sampling import SamplingConfig

from .fakes import FakeModel, table_lm


# ---- prompt files -----------------------------------------------------------------------------
def test_parse_good_file_with_optional_fields_comments_and_blank_lines():
    text = "\n".join([
        '{"id": "a", "category": "free", "prompt": "hi"}',
        "",
        "# a comment",
        '{"id": "b", "category": "edit", "prompt": "fix", "system": "be brief", "max_tokens": 32, "extra": 1}',
        '{"id": "c", "category": "copy", "prompt": "go on", "prefill": "def f(x):\\n"}',
    ])
    ps = parse_prompts(text, "set.jsonl")
    assert ps == [BenchPrompt("a", "free", "hi"), BenchPrompt("b", "edit", "fix", "be brief", 32),
                  BenchPrompt("c", "copy", "go on", prefill="def f(x):\n")]


@pytest.mark.parametrize(
    "line, message",
    [
        ('{"id": "b", "category": "x", "prompt": ', "set.jsonl:2: not valid JSON"),
        ('["a", "b"]', "set.jsonl:2: expected a JSON object"),
        ('{"id": "b", "prompt": "p"}', "set.jsonl:2: missing field 'category'"),
        ('{"id": "b"}', "set.jsonl:2: missing fields 'category', 'prompt'"),
        ('{"id": "b", "category": "x", "prompt": "  "}', "set.jsonl:2: 'prompt' must be a non-empty string"),
        ('{"id": 3, "category": "x", "prompt": "p"}', "set.jsonl:2: 'id' must be a non-empty string"),
        ('{"id": "b", "category": "x", "prompt": "p", "max_tokens": 0}', "set.jsonl:2: 'max_tokens' must be a positive integer"),
        ('{"id": "b", "category": "x", "prompt": "p", "max_tokens": "9"}', "set.jsonl:2: 'max_tokens' must be a positive integer"),
        ('{"id": "b", "category": "x", "prompt": "p", "system": 5}', "set.jsonl:2: 'system' must be a non-empty string"),
        ('{"id": "b", "category": "x", "prompt": "p", "prefill": ["a"]}', "set.jsonl:2: 'prefill' must be a non-empty string"),
        ('{"id": "a", "category": "x", "prompt": "p"}', "set.jsonl:2: duplicate id 'a' (first on line 1)"),
    ],
)
def test_parse_errors_name_the_line(line, message):
    text = '{"id": "a", "category": "free", "prompt": "hi"}\n' + line + "\n"
    with pytest.raises(InputError) as exc:
        parse_prompts(text, "set.jsonl")
    assert exc.value.message.startswith(message)
    assert "\n" not in exc.value.message


def test_empty_file_and_unreadable_files(tmp_path):
    with pytest.raises(InputError, match="no prompts"):
        parse_prompts("\n# only a comment\n", "e.jsonl")
    with pytest.raises(InputError, match="cannot read"):
        load_prompts(tmp_path / "missing.jsonl")
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b'{"id": "a", "category": "c", "prompt": "p"}\n{"id": "\xff"}\n')
    with pytest.raises(InputError, match=r"bad.jsonl:2: not valid UTF-8"):
        load_prompts(bad)


def test_builtin_set_covers_free_code_and_grounded_prompts():
    ps = load_prompts(None)
    cats = {p.category for p in ps}
    assert {"free", "code", "edit", "extract"} <= cats
    grounded = [p for p in ps if p.category == "edit"]
    assert grounded and all(p.prompt.count("\n") >= 25 for p in grounded)  # real input to copy from
    assert all(p.max_tokens for p in ps)


def test_category_filter_and_modes():
    ps = [BenchPrompt("a", "free", "x"), BenchPrompt("b", "edit", "y")]
    assert [p.id for p in filter_categories(ps, split_list(["edit"]))] == ["b"]
    assert filter_categories(ps, []) == ps
    with pytest.raises(InputError, match="unknown nope"):
        filter_categories(ps, ["nope"])
    assert parse_modes("ngram, auto") == ["off", "ngram", "auto"]  # the baseline always runs, first
    assert parse_modes("auto,off,auto") == ["off", "auto"]
    with pytest.raises(InputError, match="unknown mode 'fast'"):
        parse_modes("off,fast")
    keep, skipped = runnable_modes(["off", "draft", "ngram", "combined", "auto"], has_draft=False)
    assert keep == ["off", "ngram", "auto"] and [s["mode"] for s in skipped] == ["draft", "combined"]


# ---- statistics -------------------------------------------------------------------------------
def stats(tokens=10, tps=10.0, drafted=0, accepted=0, rounds=None, ttft=100.0, p50=50.0, p95=80.0, mode="off"):
    return GenerationStats(
        mode=mode, prompt_tokens=5, prompt_cached=0, prompt_ms=20.0, tokens=tokens, rounds=rounds or tokens,
        drafted=drafted, accepted=accepted, acceptance_rate=accepted / drafted if drafted else 0.0, accepted_hist={},
        mean_accepted_per_pass=tokens / (rounds or tokens), draft_ms=0.0, verify_ms=0.0, gen_s=tokens / tps,
        tokens_per_s=tps, ttft_ms=ttft, latency_p50_ms=p50, latency_p95_ms=p95, finish_reason="length",
    )


def run(pid, mode, st, rep=0, cat="c", tokens=(1, 2, 3)):
    return Run(pid, cat, mode, rep, st, tuple(tokens))


def test_median_and_speedup():
    assert median([3, 1, 2]) == 2
    assert median([4, 1, 2, 3]) == 2.5
    with pytest.raises(ValueError):
        median([])
    assert speedup(30.0, 15.0) == 2.0
    assert speedup(30.0, None) is None and speedup(0.0, 10.0) is None


def test_measure_takes_medians_over_repeats_and_adds_draft_prefill_to_ttft():
    runs = [run("a", "ngram", stats(tps=t, drafted=8, accepted=a, rounds=r, ttft=f), rep=i)
            for i, (t, a, r, f) in enumerate([(10, 4, 6, 100), (30, 6, 4, 300), (20, 5, 5, 200)])]
    runs[0] = Run("a", "c", "ngram", 0, runs[0].stats, (), extra_prefill_ms=1000.0)
    m = measure(runs)
    assert m.tokens_per_s == 20 and m.repeats == 3
    assert m.accepted == 5 and m.drafted == 8 and m.acceptance_rate == 5 / 8
    assert m.mean_accepted_per_pass == 10 / 5
    assert m.ttft_ms == 300  # 1100, 300, 200 -> 300
    assert m.gen_s == pytest.approx(0.5)


def test_aggregate_pools_time_and_tokens():
    slow = measure([run("a", "off", stats(tokens=10, tps=10))])  # 1 s
    fast = measure([run("b", "off", stats(tokens=30, tps=30))])  # 1 s
    agg = aggregate([slow, fast])
    assert agg.tokens == 40 and agg.gen_s == pytest.approx(2.0) and agg.tokens_per_s == pytest.approx(20.0)
    assert agg.speedup is None and agg.acceptance_rate is None
    spec = [measure([run("a", "ngram", stats(tokens=10, tps=20, drafted=10, accepted=5, rounds=5))]),
            measure([run("b", "ngram", stats(tokens=30, tps=60, drafted=30, accepted=20, rounds=10))])]
    agg2 = aggregate(spec, [slow, fast])
    assert agg2.speedup == pytest.approx(2.0)
    assert agg2.acceptance_rate == pytest.approx(25 / 40)
    assert agg2.mean_accepted_per_pass == pytest.approx(40 / 15)


def test_result_summary_per_category_and_json_shape():
    ps = [BenchPrompt("a", "free", "x"), BenchPrompt("b", "edit", "y"), BenchPrompt("c", "edit", "z")]
    res = BenchResult(modes=["off", "ngram"], prompts=ps)
    speeds = {"a": (20, 19), "b": (20, 40), "c": (10, 30)}
    for pid, (off, ng) in speeds.items():
        cat = "free" if pid == "a" else "edit"
        res.runs.append(run(pid, "off", stats(tps=off), cat=cat))
        res.runs.append(run(pid, "ngram", stats(tps=ng, drafted=10, accepted=5, rounds=5, mode="ngram"), cat=cat))
    assert res.categories() == ["free", "edit"]
    assert res.summary("free")["ngram"].speedup == pytest.approx(19 / 20)
    # edit: off 10 tok in 0.5 s + 10 in 1 s = 20 tok/1.5 s; ngram 20 tok in 0.25 + 1/3 s
    edit = res.summary("edit")
    assert edit["ngram"].speedup == pytest.approx((20 / (0.25 + 1 / 3)) / (20 / 1.5))
    assert edit["off"].speedup == pytest.approx(1.0)
    data = json.loads(json.dumps(res.to_json()))
    assert set(data) == {"config", "modes", "skipped", "notes", "overall", "categories", "prompts", "verify", "profile_stale"}
    assert set(data["categories"]) == {"free", "edit"} and set(data["overall"]) == {"off", "ngram"}
    row = data["prompts"][1]["modes"]["ngram"]
    assert row["speedup"] == 2.0 and row["acceptance_rate"] == 0.5 and row["mean_accepted_per_pass"] == 2.0
    for key in ("tokens_per_s", "ttft_ms", "latency_p50_ms", "latency_p95_ms", "tokens"):
        assert key in row and key in data["overall"]["ngram"]
    assert data["verify"] == {"checked": False, "ok": None, "exact": False, "near_tie_logit": NEAR_TIE_LOGIT,
                              "differences": []}
    assert row["runs"] == [{"repeat": 0, "tokens": 10, "tokens_per_s": 40.0, "speedup": 2.0, "ttft_ms": 100.0,
                            "latency_p50_ms": 50.0, "latency_p95_ms": 80.0, "drafted": 10, "accepted": 5,
                            "rounds": 5, "profile_stale": False, "loop_ms_per_token": 0.0}]


# ---- verification -----------------------------------------------------------------------------
def test_first_difference():
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert first_difference([1, 2, 3], [1, 2]) == 2
    assert first_difference([], []) is None
    assert compare_runs([1, 2], [1, 2, 7]) == (2, None, 7)
    assert compare_runs([4], [5]) == (0, 4, 5)


def test_verify_runs_compares_every_run_to_the_first_plain_run():
    s = stats()
    runs = [
        run("a", "off", s, tokens=(1, 2, 3, 4)),
        run("a", "ngram", s, tokens=(1, 2, 3, 4)),
        run("a", "draft", s, tokens=(1, 2, 9, 4)),
        run("a", "off", s, rep=1, tokens=(1, 2, 3)),
        run("b", "off", s, tokens=(5,)),
        run("b", "auto", s, tokens=(5,)),
    ]
    diffs = verify_runs(runs)
    assert [(d.prompt_id, d.mode, d.repeat, d.position, d.plain_token, d.spec_token) for d in diffs] == [
        ("a", "draft", 0, 2, 3, 9),
        ("a", "off", 1, 3, 4, None),
    ]


# ---- the run loop on fake models --------------------------------------------------------------
class BenchModel(FakeModel):
    def __init__(self, lm, **kw):
        super().__init__(lm, **kw)
        self.resets = 0

    def reset(self):
        self.tokens = []
        self.resets += 1

    def close(self):
        pass

    def token_bytes(self, token):
        return bytes([97 + token])

    def tokenize(self, text, *, special=False, add_bos=False):
        return [1 + (ord(ch) % 7) for ch in text]  # as FakeEngine.chat_tokens reads a message


class FakeEngine(Engine):
    """The real Engine's decoder/stream over fake models (no llama.cpp)."""

    def __init__(self, with_draft=True, lm_seed=3):
        self.config = None
        self.spec = SpecConfig(mode="auto", draft_max=6)
        self.limits = DraftLimits(1, 6)
        self.target = BenchModel(table_lm(lm_seed), n_ctx=512)
        self.draft = BenchModel(table_lm(lm_seed), n_ctx=512) if with_draft else None
        self.cost = CostModel()
        self._controller = None
        self._ngram = None
        self._template = None
        self.controllers = []

    def chat_tokens(self, messages):
        text = "".join(m.content for m in messages)
        return [1 + (ord(ch) % 7) for ch in text]

    def decoder(self, sampling, mode=None, **kw):
        dec = super().decoder(sampling, mode, **kw)
        self.controllers.append(dec.controller)
        return dec


PROMPTS = [BenchPrompt("p1", "free", "abcab"), BenchPrompt("p2", "edit", "hello hello hello", max_tokens=12)]


def test_run_bench_on_fakes_verifies_and_isolates_runs():
    eng = FakeEngine()
    seen = []
    res = run_bench(eng, PROMPTS, ["off", "draft", "ngram", "combined", "auto"], SamplingConfig(),
                        repeats=2, max_tokens=16, verify=True, on_event=seen.append)
    assert res.modes == ["off", "draft", "ngram", "combined", "auto"] and not res.skipped
    assert len(res.runs) == 2 * 2 * 5
    assert res.verified and res.verify_ok, res.differences
    assert all(r.stats.prompt_cached == 0 for r in res.runs)  # every run starts from empty caches
    assert eng.target.tokens == [] and eng.draft.tokens == []
    assert len({id(c) for c in eng.controllers}) == len(eng.controllers)  # a fresh controller each run
    assert all(r.stats.tokens <= (16 if r.prompt_id == "p1" else 12) for r in res.runs)
    assert any(r.extra_prefill_ms > 0 for r in res.runs if r.mode == "draft")
    assert [p.phase for p in seen[:5]] == ["warmup"] * 5
    finished = [p for p in seen if p.phase == "timed" and p.run is not None]
    assert [p.index for p in finished] == list(range(1, 21))
    data = res.to_json()
    assert set(data["overall"]) == set(res.modes) and data["verify"]["ok"] is True
    assert data["overall"]["off"]["speedup"] == 1.0


def test_a_prompts_prefill_is_read_after_the_template_and_generation_goes_on_from_it():
    from edgespec.bench.runner import Runner

    eng = FakeEngine()
    runner = Runner(eng)
    plain, prefilled = BenchPrompt("a", "edit", "abcab"), BenchPrompt("b", "edit", "abcab", prefill="cabca")
    assert runner.tokens(prefilled) == runner.tokens(plain) + eng.target.tokenize("cabca")
    res = run_bench(eng, [plain, prefilled], ["off"], SamplingConfig(), repeats=1, max_tokens=8)
    stats = {r.prompt_id: r.stats for r in res.runs}
    assert stats["b"].prompt_tokens == stats["a"].prompt_tokens + 5 and stats["b"].tokens <= 8


def test_run_bench_without_draft_skips_draft_modes():
    eng = FakeEngine(with_draft=False)
    res = run_bench(eng, PROMPTS[:1], ["off", "draft", "combined", "auto"], SamplingConfig(), max_tokens=8, warmup=False)
    assert res.modes == ["off", "auto"]
    assert [s["mode"] for s in res.skipped] == ["draft", "combined"]
    assert res.notes and "without a draft model" in res.notes[0]


def test_run_bench_sampled_timing_verifies_on_greedy_runs():
    eng = FakeEngine()
    res = run_bench(eng, PROMPTS[:1], ["off", "ngram"], SamplingConfig(temperature=0.8, seed=1),
                        max_tokens=8, verify=True, warmup=False)
    assert len(res.runs) == 2 and res.verified and res.verify_ok


def test_run_bench_reports_a_broken_mode():
    eng = FakeEngine()
    real_stream = Engine.stream

    def broken(self, prompt, sampling=SamplingConfig(), **kw):
        for item in real_stream(self, prompt, sampling, **kw):
            if kw.get("decoder") is not None and kw["decoder"].settings.mode == "ngram" and hasattr(item, "tokens") and item.tokens:
                item = type(item)(item.text, item.finish_reason, item.stats, (*item.tokens[:-1], item.tokens[-1] + 1))
            yield item

    eng.stream = broken.__get__(eng)
    res = run_bench(eng, PROMPTS[:1], ["off", "ngram"], SamplingConfig(), max_tokens=8, verify=True, warmup=False,
                        exact=True)
    assert not res.verify_ok
    d = res.differences[0]
    assert d.mode == "ngram" and d.position == res.runs[0].stats.tokens - 1


def test_run_bench_argument_checks():
    eng = FakeEngine()
    with pytest.raises(InputError, match="--repeats"):
        run_bench(eng, PROMPTS, ["off"], SamplingConfig(), repeats=0)
    with pytest.raises(InputError, match="--max-tokens"):
        run_bench(eng, PROMPTS, ["off"], SamplingConfig(), max_tokens=0)


# ---- rendering and the command's input errors -------------------------------------------------
def test_table_renders_categories_overall_and_verify():
    from edgespec.render.bench import progress_line, render_results

    eng = FakeEngine()
    res = run_bench(eng, PROMPTS, ["off", "ngram", "auto"], SamplingConfig(), max_tokens=8, verify=True, warmup=False)
    res.config = {"target": "t.gguf", "draft": "d.gguf", "threads": 2, "temperature": 0.0, "repeats": 1}
    buf = io.StringIO()
    con = Console(file=buf, width=80)  # not a terminal: the table widens instead of eliding
    render_results(con, con, res)
    out = buf.getvalue()
    assert "…" not in out
    for word in ("free (1)", "edit (1)", "overall (2)", "ngram", "auto", "verify: ok", "2 threads"):
        assert word in out
    line = progress_line(BenchEvent(1, 2, res.runs[1], "p1", "ngram", 0))
    assert line.startswith("[1/2] p1 ngram:") and "tok/s" in line


def test_the_commands_event_lines():
    from edgespec.render.bench import print_event

    eng = FakeEngine()
    seen = []
    run_bench(eng, PROMPTS[:1], ["off", "ngram"], SamplingConfig(temperature=0.8, seed=1), max_tokens=4,
              verify=True, on_event=seen.append)
    buf = io.StringIO()
    for e in seen:
        print_event(Console(file=buf, width=200), e)
    lines = buf.getvalue().splitlines()
    assert lines[0] == "warming up..." and lines.count("warming up...") == 1  # once, not per warm-up run
    assert [line.split(":")[0] for line in lines[1:3]] == ["[1/2] p1 off", "[2/2] p1 ngram"]  # finished timed runs
    assert lines[3:] == ["verify (greedy) 1/2: p1 off", "verify (greedy) 2/2: p1 ngram"]  # sampled: greedy re-runs
    assert len(seen) == 2 + 4 + 2  # warm-ups, timed (start and end), verify starts


def test_cli_reports_a_malformed_prompt_file_in_one_line(tmp_path, capsys):
    from edgespec.commands import main

    f = tmp_path / "p.jsonl"
    f.write_text('{"id": "a", "category": "c", "prompt": "p"}\n{"id": "b", "category": "c"}\n')
    with pytest.raises(SystemExit) as exc:
        main(["bench", "--prompts", str(f)])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err == f"error: {f}:2: missing field 'prompt'"
    with pytest.raises(SystemExit) as exc:
        main(["bench", "--prompts", str(f), "--modes", "off,warp"])
    assert exc.value.code == 2 and "unknown mode 'warp'" in capsys.readouterr().err


def test_cli_has_no_spec_flag():
    from click.testing import CliRunner

    from edgespec.commands import cli

    r = CliRunner().invoke(cli, ["bench", "--help"])
    assert r.exit_code == 0 and "--modes" in r.output and "--spec " not in r.output


# ---- spreads over repeats ---------------------------------------------------------------------
def test_repeats_rotate_the_order_of_modes():
    eng = FakeEngine()
    seen = []
    run_bench(eng, PROMPTS[:1], ["off", "ngram", "auto"], SamplingConfig(), repeats=3, max_tokens=6,
                  warmup=False, on_event=seen.append)
    order = [(p.repeat, p.mode) for p in seen if p.run is not None]
    assert order == [(0, "off"), (0, "ngram"), (0, "auto"), (1, "ngram"), (1, "auto"), (1, "off"),
                     (2, "auto"), (2, "off"), (2, "ngram")]


def test_the_order_of_modes_also_rotates_from_prompt_to_prompt():
    # with two modes and an odd number of repeats, rotating per repeat alone would put one mode
    # first in most repeats; rotating per prompt too mixes the orders inside every repeat
    eng = FakeEngine()
    seen = []
    run_bench(eng, PROMPTS, ["off", "auto"], SamplingConfig(), repeats=3, max_tokens=6,
              warmup=False, on_event=seen.append)
    runs = [(e.repeat, e.prompt_id, e.mode) for e in seen if e.run is not None]
    first = {}
    for rep, pid, mode in runs:
        first.setdefault((rep, pid), mode)
    ids = [p.id for p in PROMPTS]
    assert [[first[rep, pid] for pid in ids] for rep in range(3)] == [["off", "auto"], ["auto", "off"], ["off", "auto"]]
    assert len(runs) == 3 * 2 * 2 and len(set(runs)) == len(runs)


def test_spread_over_repeats_and_speedups_that_overlap_one():
    ps = [BenchPrompt("a", "free", "x")]
    res = BenchResult(modes=["off", "ngram", "draft"], prompts=ps)
    for rep, (off, ng, dr) in enumerate([(10, 9.5, 12), (10, 10.5, 13), (10, 10, 14)]):
        res.runs += [run("a", "off", stats(tps=off), rep=rep), run("a", "ngram", stats(tps=ng), rep=rep),
                     run("a", "draft", stats(tps=dr), rep=rep)]
    spread = res.spread()
    assert spread["ngram"]["speedup"] == pytest.approx((0.95, 1.05))
    assert spread["draft"]["tokens_per_s"] == (12, 14)
    assert speedup_overlaps_one(spread["ngram"]["speedup"]) is True
    assert speedup_overlaps_one(spread["draft"]["speedup"]) is False
    data = json.loads(json.dumps(res.to_json()))
    assert data["overall"]["ngram"]["speedup_overlaps_1"] is True
    assert data["overall"]["draft"]["speedup_overlaps_1"] is False and data["overall"]["off"]["speedup_overlaps_1"] is None
    assert data["overall"]["draft"]["spread"]["speedup"] == [1.2, 1.4]
    assert [r["tokens_per_s"] for r in data["overall"]["draft"]["repeats"]] == [12, 13, 14]
    assert [r["speedup"] for r in data["prompts"][0]["modes"]["ngram"]["runs"]] == [0.95, 1.05, 1.0]  # every repeat
    assert data["prompts"][0]["modes"]["ngram"]["speedup"] == 1.0  # their median

    from edgespec.render.bench import render_results

    buf = io.StringIO()
    con = Console(file=buf, width=80)
    render_results(con, con, res)
    out = buf.getvalue()
    assert "1.00x (0.95–1.05) ≈1" in out and "1.30x (1.20–1.40)" in out and "≈1" not in out.split("draft", 1)[1].split("\n")[0]
    assert "13.0 ±1.0" in out


def test_a_prompts_speedup_is_taken_within_each_repeat_not_across_a_drifting_machine():
    # summ-raise's seven repeats on a Zen 4 machine whose speed fell by a fifth over ten minutes
    # (2026-12-07; auto drafted nothing): the medians of the two modes come from different repeats
    off = (29.3, 26.4, 27.2, 27.7, 23.6, 24.2, 23.7)
    auto = (29.5, 25.4, 27.1, 22.6, 23.8, 21.8, 23.6)
    res = BenchResult(modes=["off", "auto"], prompts=[BenchPrompt("a", "summ", "x")])
    for rep, (o, a) in enumerate(zip(off, auto)):
        res.runs += [run("a", "off", stats(tps=o), rep=rep), run("a", "auto", stats(tps=a), rep=rep)]
    cell = json.loads(json.dumps(res.to_json()))["prompts"][0]["modes"]["auto"]
    paired = sorted(a / o for o, a in zip(off, auto))
    assert cell["speedup"] == pytest.approx(paired[3], abs=1e-4) and cell["speedup"] > 0.99
    assert cell["tokens_per_s"] / res.cell("a", "off").tokens_per_s < 0.91  # the ratio of medians it replaced


def test_the_json_gives_each_runs_loop_time_per_token():
    # both modes ran the same 100 single passes (auto drafted nothing): their tok/s differ by what the
    # machine did, their loop time (GenerationStats.loop_ms) by what auto's drafting and choosing cost
    from dataclasses import replace

    res = BenchResult(modes=["off", "auto"], prompts=[BenchPrompt("a", "free", "x")])
    res.runs += [run("a", "off", replace(stats(tokens=100, tps=25.0), verify_ms=3980.0, loop_ms=20.0)),
                 run("a", "auto", replace(stats(tokens=100, tps=26.0, mode="auto"), verify_ms=3800.0, loop_ms=46.0))]
    runs = {m: c["runs"][0] for m, c in json.loads(json.dumps(res.to_json()))["prompts"][0]["modes"].items()}
    assert (runs["off"]["loop_ms_per_token"], runs["auto"]["loop_ms_per_token"]) == (0.2, 0.46)


# ---- verify with fast kernels: divergences judged by the plain run's margin ------------------
class Drift:
    """Tokens cycle 1..7; after a 4, the runner-up is `margin` behind the winner. Rows of a batch of
    more than one (a verify batch) drift by `drift` towards the runner-up, as fast kernels do."""

    def __init__(self, margin: float, drift: float):
        self.margin, self.drift, self.batched = margin, drift, False

    def __call__(self, ctx):
        import numpy as np

        last = ctx[-1]
        nxt, alt = last % 7 + 1, (last + 1) % 7 + 1
        out = np.full(8, -5.0, dtype=np.float32)
        out[nxt] = 5.0
        out[alt] = 5.0 - (self.margin if last == 4 else 4.0)
        if self.batched and last == 4:
            out[alt] += self.drift
        return out


class DriftModel(BenchModel):
    def decode(self, tokens, logits_for=()):
        tokens = list(tokens)
        self.lm.batched = len(tokens) > 1
        try:
            return super().decode(tokens, logits_for)
        finally:
            self.lm.batched = False


class DriftEngine(FakeEngine):
    def __init__(self, margin, drift):
        super().__init__()
        self.target = DriftModel(Drift(margin, drift), n_ctx=512)
        self.draft = BenchModel(Drift(margin, 0.0), n_ctx=512)

    def chat_tokens(self, messages):
        return [1, 2, 3, 4, 5, 6, 7, 1, 2]


def verify_drift(margin, drift, exact=False):
    return run_bench(DriftEngine(margin, drift), PROMPTS[:1], ["off", "draft"], SamplingConfig(),
                         max_tokens=12, verify=True, warmup=False, exact=exact)


def test_verify_passes_a_divergence_at_a_near_tie():
    res = verify_drift(margin=0.1, drift=0.3)
    assert len(res.differences) == 1
    d = res.differences[0]
    assert d.mode == "draft" and d.plain_token == 5 and d.spec_token == 6
    assert d.margin == pytest.approx(0.1) and d.near_tie()
    assert res.verify_ok
    data = res.to_json()["verify"]
    assert data["ok"] is True and data["differences"][0]["margin"] == pytest.approx(0.1)
    assert data["differences"][0]["near_tie"] is True

    from edgespec.render.bench import render_verify

    buf = io.StringIO()
    render_verify(Console(file=buf, width=200), res)
    assert "verify: ok" in buf.getvalue() and "plain top-2 margin 0.100" in buf.getvalue()


def test_verify_fails_a_divergence_at_a_wide_margin():
    res = verify_drift(margin=2.0, drift=3.0)
    d = res.differences[0]
    assert d.margin == pytest.approx(2.0) and not d.near_tie()
    assert not res.verify_ok and res.failing_differences() == [d]
    assert res.to_json()["verify"]["differences"][0]["near_tie"] is False


def test_verify_with_exact_kernels_fails_any_divergence():
    res = verify_drift(margin=0.1, drift=0.3, exact=True)
    assert len(res.differences) == 1 and res.differences[0].margin is None  # no margins needed
    assert not res.verify_ok


def test_verify_without_drift_finds_nothing():
    res = verify_drift(margin=0.1, drift=0.0)
    assert res.differences == [] and res.verify_ok


def test_cli_verify_exits_1_on_a_wide_margin_divergence(tmp_path, monkeypatch, capsys):
    from pathlib import Path
    from types import SimpleNamespace

    from edgespec.commands import bench as cmd
    from edgespec.commands import main

    f = tmp_path / "p.jsonl"
    f.write_text('{"id": "cycle", "category": "free", "prompt": "count"}\n')
    engines = []

    def fake_open(kw, spec, quiet=False):
        place = SimpleNamespace(threads=2)
        resolved = SimpleNamespace(plan=SimpleNamespace(target=place, draft=place, n_ctx=512),
                                   target_path=Path("t.gguf"), draft_path=Path("d.gguf"))
        return resolved, engines.pop(0)

    monkeypatch.setattr(cmd, "open_engine", fake_open)
    args = ["bench", "--prompts", str(f), "--modes", "off,draft", "--verify", "--json", "-q", "--no-warmup", "-n", "12"]

    engines.append(DriftEngine(margin=2.0, drift=3.0))
    with pytest.raises(SystemExit) as exc:
        main(args)
    captured = capsys.readouterr()
    assert exc.value.code == 1
    data = json.loads(captured.out)
    assert data["verify"]["ok"] is False and data["config"]["repeats"] == 3
    assert {d["margin"] for d in data["verify"]["differences"]} == {2.0}
    assert captured.err.strip() == "error: verify: 3 run(s) differ from plain decoding where it was not a near-tie"

    engines.append(DriftEngine(margin=0.1, drift=0.3))
    main(args)  # near-ties only: passes
    assert json.loads(capsys.readouterr().out)["verify"]["ok"] is True

    engines.append(DriftEngine(margin=0.1, drift=0.3))
    with pytest.raises(SystemExit) as exc:
        main([*args, "--exact"])  # exact kernels: any difference fails
    assert exc.value.code == 1
