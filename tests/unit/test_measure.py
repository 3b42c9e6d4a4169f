"""Profile measurement that knows its own noise: scripted timings (quiet, busy, one outlier), the
interleaved timing loop on a fake model and a fake clock, the load meter's arithmetic, and the
`edgespec profile` decision to keep a good saved profile when a new measurement is unstable."""

from __future__ import annotations

import json
from collections import namedtuple
from pathlib import Path
from types import SimpleNamespace

import pytest

from edgespec import measure as M
from edgespec import profile_store
from edgespec.measure import Load, Measurement, check_stability, cost_model, summarize

# A quiet CPU's verify costs (ms): t(k) grows with k, a little noise on every repeat.
QUIET_MS = {1: 30.0, 2: 45.0, 3: 50.0, 4: 55.0, 5: 60.0, 6: 66.0, 7: 72.0, 8: 78.0,
            12: 100.0, 16: 120.0, 24: 170.0, 32: 220.0, 48: 320.0, 64: 420.0}
QUIET_NOISE = (1.00, 1.01, 1.02, 1.015, 1.005)
IDLE = (Load(0.05, 0.2, 2, "before"), Load(0.1, 1.9, 2, "during"))


def scripted(base, noise):
    return {k: [ms * f for f in noise] for k, ms in base.items()}


def assess(samples, loads=IDLE):
    cost, spread = {}, {}
    for k, xs in samples.items():
        cost[k], spread[k] = summarize(xs)
    return cost, spread, check_stability(cost, spread, loads)


def test_summarize_keeps_the_fastest_and_the_spread_of_the_median():
    assert summarize([12.0, 10.0, 11.0]) == (10.0, pytest.approx(0.1))
    assert summarize([5.0]) == (5.0, 0.0)
    with pytest.raises(ValueError):
        summarize([])


def test_quiet_timings_are_stable():
    cost, spread, reasons = assess(scripted(QUIET_MS, QUIET_NOISE))
    assert reasons == []
    assert cost == QUIET_MS  # the fastest repeat of each
    assert 0 < spread[1] < M.MAX_T1_SPREAD


def test_one_outlier_neither_moves_the_cost_nor_makes_it_unstable():
    samples = scripted(QUIET_MS, QUIET_NOISE)
    samples[1][2] *= 3.0  # a context switch in the middle of one t(1) repeat
    samples[32][3] *= 2.5
    cost, spread, reasons = assess(samples)
    assert reasons == [] and cost[1] == 30.0 and cost[32] == 220.0


def test_busy_timings_are_unstable_and_say_why():
    # Two busy loops on two cores: every repeat a different, larger slowdown, and the load shows it.
    samples = scripted(QUIET_MS, (1.0, 1.6, 2.3, 1.9, 3.1))
    busy = (Load(1.9, 2.5, 2, "before"), Load(1.8, 3.9, 2, "during"))
    _, _, reasons = assess(samples, busy)
    text = " ".join(reasons)
    assert "other processes used 1.9 of 2 cores before measuring" in text
    assert "t(1) varied by" in text and "t(k) varied by up to" in text
    # the load alone is enough, even when the timings happened to look tight
    _, _, reasons = assess(scripted(QUIET_MS, QUIET_NOISE), busy)
    assert len(reasons) == 2 and all("other processes" in r for r in reasons)


def test_load_average_counts_before_measuring_only():
    quiet_cpu_high_avg = Load(0.1, 4.0, 2, "before")
    assert "load average 4.0 on 2 cores" in M.busy_reason(quiet_cpu_high_avg)
    assert M.busy_reason(Load(0.1, 4.0, 2, "during")) is None  # our own threads raise it while measuring
    assert M.busy_reason(Load(0.4, 1.0, 2, "before")) is None
    assert M.busy_reason(Load(2.5, 1.0, 16, "during")) is None  # 2.5 of 16 cores: under a quarter
    assert M.busy_reason(Load(4.5, 1.0, 16, "during")) is not None


def test_monotonicity_is_checked():
    cost = dict(QUIET_MS)
    cost[12] = 0.45 * cost[8]  # the symptom: a larger batch costing less than half a smaller one
    reasons = check_stability(cost, {k: 0.01 for k in cost})
    assert reasons == [f"t(12) = {cost[12]:.1f} ms is less than half of t(8) = 78.0 ms"]
    mild = {**QUIET_MS, 12: 0.8 * QUIET_MS[8]}  # a dip, not a collapse: allowed
    assert check_stability(mild, {k: 0.01 for k in mild}) == []


def test_one_noisy_size_among_many_is_tolerated_but_a_noisy_typical_size_is_not():
    # Quiet profiles on a shared 2-vCPU machine: most sizes within ~10%, the worst of 14 at 20-30%.
    quiet = {k: 0.06 for k in QUIET_MS}
    quiet[3], quiet[24] = 0.30, 0.22
    assert check_stability(QUIET_MS, quiet) == []
    drifting = {k: 0.2 for k in QUIET_MS}
    drifting[1] = 0.05
    assert check_stability(QUIET_MS, drifting) == ["t(k) varied by 20% between repeats for a typical k (limit 15%)"]
    collapse = dict(quiet)
    collapse[48] = 0.8
    assert check_stability(QUIET_MS, collapse) == ["t(k) varied by up to 80% between repeats (k = 48; limit 50%)"]


def test_noisy_draft_timing_is_unstable():
    assert check_stability({1: 30.0}, {1: 0.0}, (), draft_spread=0.4)
    assert check_stability({1: 30.0}, {1: 0.0}, (), draft_spread=0.05) == []


def test_cost_model_has_every_measured_k_and_the_verdicts_reach_64():
    cost = cost_model(QUIET_MS, 15.0)
    assert sorted(cost.verify) == [k for k in QUIET_MS if k > 1]
    assert cost.v(64) == pytest.approx(420 / 30) and cost.v(48) == pytest.approx(320 / 30)
    assert cost.v(40) == pytest.approx(320 / 30)  # between measured points: the next one's cost
    assert cost.draft_cost == pytest.approx(0.5)
    m = Measurement(QUIET_MS, None, 40.0, None, cost, k_limit=64, target_spread={k: 0.01 for k in QUIET_MS})
    # a perfect free drafter is best at the longest draft these costs allow
    k, s = M.best_k(0.99, 0.0, cost, m.k_limit)
    assert k > 16 and s > 2.0
    data = json.loads(json.dumps(m.to_json()))
    assert data["stable"] is True and data["unstable_reasons"] == []
    assert data["cost"]["t1_ms"] == 30.0 and data["k_limit"] == 64
    assert data["target_spread"]["64"] == 0.01 and data["kernels"] == "fast"
    assert data["verdicts"]["ngram"]["0.95"]["k"] > 8  # beyond what exact kernels could verify


def test_exact_kernels_time_eight_sizes_at_most():
    assert M.KS_EXACT == tuple(range(1, 9))
    assert M.KS_FAST == (1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 24, 32, 48, 64)


# ---- the timing loop on a fake model and a fake clock -----------------------------------------
class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


class TimedModel:
    """Decoding k tokens advances the fake clock by the scripted cost of k (plus one slow pass)."""

    def __init__(self, clock, slow_call=None):
        self.clock = clock
        self.tokens = []
        self.calls = []
        self.slow_call = slow_call

    def tokenize(self, text):
        return list(range(100))

    def reset(self):
        self.tokens = []

    def decode(self, tokens, logits_for=()):
        tokens = list(tokens)
        self.tokens += tokens
        self.calls.append(len(tokens))
        if len(tokens) in QUIET_MS:
            factor = 3.0 if len(self.calls) == self.slow_call else 1.0
            self.clock.now += QUIET_MS[len(tokens)] / 1000 * factor

    def trim(self, n):
        del self.tokens[n:]


class Steps:
    def __init__(self):
        self.n = 0

    def advance(self, n):
        self.n += n


def test_time_batches_interleaves_sizes_across_repeats():
    clock = FakeClock()
    ks = [1, 2, 8, 64]
    model = TimedModel(clock, slow_call=len(ks) + 2)  # warm-up walk (depth 0: no prefill), then the 2nd timed pass
    steps = Steps()
    samples = M.time_batches(model, ks, 3, steps, clock=clock, min_walk_ms=0)
    batches = [n for n in model.calls if n in ks]
    warmup, timed = batches[: len(ks)], batches[len(ks):]
    assert warmup == ks
    # every repeat walks every size once (not three of one size back to back), alternating direction
    assert timed == ks + ks[::-1] + ks
    assert steps.n == 3 * len(ks)
    assert samples[1] == pytest.approx([30.0, 30.0, 30.0])
    assert samples[2] == pytest.approx([135.0, 45.0, 45.0])  # the slow pass shows in one repeat only
    assert summarize(samples[2])[0] == pytest.approx(45.0)
    assert model.tokens == []


def test_a_walk_times_short_batches_back_to_back_and_keeps_their_fastest_run():
    clock = FakeClock()
    ks = [1, 2, 64]
    # calls: 3 warm-ups (depth 0: no prefill), then walk 1 = k1 x4 (30 ms each, ~120 ms), k2 x3, k64 x1; the
    # 3rd call of walk 1 (k=1) is a hiccup at 3x
    model = TimedModel(clock, slow_call=len(ks) + 3)
    samples = M.time_batches(model, ks, 2, Steps(), clock=clock, min_walk_ms=120)
    timed = [n for n in model.calls[len(ks):]]
    assert timed == [1] * 4 + [2] * 3 + [64] + [64] + [2] * 3 + [1] * 4
    assert samples[1] == pytest.approx([30.0, 30.0])  # the hiccup inside a walk is not its sample
    assert samples[64] == pytest.approx([420.0, 420.0])
    assert M.WALK_MAX_RUNS >= 4


def test_every_timed_run_is_kept_for_the_typical_factor():
    clock = FakeClock()
    ks = [1, 2, 64]
    model = TimedModel(clock, slow_call=len(ks) + 3)  # the same hiccup as above, inside walk 1's k = 1 runs
    runs: dict[int, list[float]] = {}
    M.time_batches(model, ks, 2, Steps(), clock=clock, min_walk_ms=120, runs=runs)
    assert runs[1] == pytest.approx([30.0, 30.0, 90.0, 30.0] + [30.0] * 4)  # warm-ups not counted
    assert len(runs[2]) == 6 and len(runs[64]) == 2


def test_the_typical_factor_is_the_median_sizes_median_run_over_its_fastest():
    runs = {1: [30.0, 33.0, 36.0], 2: [50.0, 60.0, 55.0, 70.0], 8: [100.0, 100.0, 130.0]}
    # 33/30 = 1.10, 57.5/50 = 1.15, 100/100 = 1.0 -> 1.10
    assert M.typical_factor(runs) == pytest.approx(1.10)
    assert M.typical_factor({}) == 1.0
    assert M.typical_factor({1: [30.0]}) == 1.0  # never below the fastest


# ---- the load meter's arithmetic on a fake psutil -----------------------------------------------
CPU = namedtuple("CPU", "user nice system idle iowait irq softirq steal guest guest_nice")
OWN = namedtuple("OWN", "user system children_user children_system")


def test_load_meter_counts_other_processes_only(monkeypatch):
    times = iter([(CPU(10, 0, 5, 100, 1, 0, 0, 0, 0, 0), OWN(1, 0, 0, 0)),
                  # 10 s of wall time: 24 s busy in total, of which 6 s are ours -> 1.8 cores for others
                  (CPU(30, 0, 9, 110, 1, 0, 0, 0, 3, 0), OWN(6, 1, 0, 0))])
    clock = iter([0.0, 10.0])
    fake = SimpleNamespace(cpu_count=lambda logical=True: 2, getloadavg=lambda: (2.5, 1.0, 1.0))
    meter = M.LoadMeter.__new__(M.LoadMeter)
    meter._psutil, meter.cores = fake, 2
    state = {}

    def cpu_times():
        state["pair"] = next(times)
        return state["pair"][0]

    fake.cpu_times = cpu_times
    meter._me = SimpleNamespace(cpu_times=lambda: state["pair"][1])
    monkeypatch.setattr(M.time, "monotonic", lambda: next(clock))
    meter.start()
    load = meter.stop()
    assert load.other_cores == pytest.approx(1.8) and load.load_avg == 2.5 and load.cores == 2
    assert "1.8 of 2 cores during" in M.busy_reason(load)


# ---- the profile command keeps a good profile when a new one is unstable ------------------------
def _measurement(stable: bool, t1: float, depths: dict | None = None) -> dict:
    ms = {k: v * t1 / 30.0 for k, v in QUIET_MS.items()}
    loads = IDLE if stable else (Load(1.9, 3.0, 2, "before"), Load(1.9, 3.5, 2, "during"))
    noise = QUIET_NOISE if stable else (1.0, 1.6, 2.3, 1.9, 3.1)
    samples = scripted(ms, noise)
    cost, spread = {}, {}
    for k, xs in samples.items():
        cost[k], spread[k] = summarize(xs)
    return Measurement(cost, 12.0, 40.0, 0.8, cost_model(cost, 12.0, depths), 64, spread, 0.01, "fast", 5, loads,
                       tuple(check_stability(cost, spread, loads)), depths or {}).to_json()


@pytest.fixture
def fake_profile_cli(tmp_path, monkeypatch):
    """`edgespec profile` with the planning and the timing replaced by scripted results."""
    from pathlib import Path

    from edgespec.commands import profile as cmd

    from .test_profile_store import HW

    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path))
    resolved = SimpleNamespace(
        hardware=HW, rpc=(), target_path=Path("/m/target.gguf"), draft_path=Path("/m/draft.gguf"),
        choice=SimpleNamespace(target="target", draft="draft"),
    )
    plan = SimpleNamespace(to_json=lambda: {}, warnings=[])
    monkeypatch.setattr(cmd, "_plan", lambda kw, spec: (resolved, plan))
    script = []
    forced = []

    def fake_measure(resolved, plan, quiet, exact, force=False):
        forced.append(force)
        item = script.pop(0)
        if isinstance(item, Exception):
            raise item
        return item

    monkeypatch.setattr(cmd, "_measure", fake_measure)

    def run(*args, measurement):
        from edgespec.commands import main

        script.append(measurement)
        try:
            main(["profile", "--json", *args])
        except SystemExit as exc:
            return exc.code
        return 0

    return run


def _costs_used(kernels="fast"):
    from edgespec.session import _cost

    from .test_profile_store import HW

    return _cost(profile_store.load_profile(HW, "target.gguf", "draft.gguf"), kernels)[0]


def test_profile_busy_run_keeps_the_quiet_profile_and_exits_1(fake_profile_cli, capsys):
    assert fake_profile_cli(measurement=_measurement(True, 30.0)) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["saved"] == "saved" and out["measurement"]["stable"] is True
    quiet_v8 = _costs_used().v(8)

    code = fake_profile_cli(measurement=_measurement(False, 60.0))
    captured = capsys.readouterr()
    assert code == 1
    assert json.loads(captured.out)["saved"] == "kept"
    err = captured.err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: profile unstable (other processes used 1.9 of 2 cores")
    assert "kept the saved profile's costs" in err[0] and "--force" in err[0]
    assert _costs_used().v(8) == pytest.approx(quiet_v8)  # what prompt/chat/bench will use
    from .test_profile_store import HW

    for draft in ("draft.gguf", None):  # the target-only record keeps it too
        stored = profile_store.load_profile(HW, "target.gguf", draft)["data"]
        assert set(stored) == {"models", "plan", "measurements"}  # the cost table is stored once
        assert stored["measurements"]["fast"]["cost"]["t1_ms"] == 30.0

    # --force saves the unstable one, marked, and runs use it
    assert fake_profile_cli("--force", measurement=_measurement(False, 60.0)) == 0
    assert json.loads(capsys.readouterr().out)["saved"] == "forced"
    stored = profile_store.load_profile(HW, "target.gguf", "draft.gguf")["data"]["measurements"]["fast"]
    assert stored["forced"] is True and stored["stable"] is False and stored["cost"]["t1_ms"] == 60.0


def test_profile_unstable_first_run_is_stored_but_not_used(fake_profile_cli, capsys):
    code = fake_profile_cli(measurement=_measurement(False, 60.0))
    captured = capsys.readouterr()
    assert code == 1 and "estimated costs" in captured.err
    assert json.loads(captured.out)["saved"] == "unstable"
    assert _costs_used() is None  # prior costs until a stable profile exists
    assert fake_profile_cli(measurement=_measurement(True, 30.0)) == 0
    assert _costs_used() is not None


def test_profile_show_renders_spreads_and_stability(fake_profile_cli, capsys):
    from edgespec.commands import main

    fake_profile_cli(measurement=_measurement(True, 30.0))
    capsys.readouterr()
    main(["profile", "--show"])
    out = capsys.readouterr().out
    assert "fast kernels" in out and "spread" in out and "+1.0%" in out and "stable" in out
    rows = [line.split("│")[1].strip() for line in out.splitlines() if line.count("│") == 5]
    assert rows[:14] == [str(k) for k in QUIET_MS]  # in batch-size order, as measured


def test_profile_shows_the_depth_tables_and_runs_use_them(fake_profile_cli, capsys):
    from edgespec.commands import main

    deep = {512: {k: v + 20.0 for k, v in QUIET_MS.items()}}
    assert fake_profile_cli(measurement=_measurement(True, 30.0, deep)) == 0
    capsys.readouterr()
    main(["profile", "--show"])
    out = capsys.readouterr().out
    assert "ms at context depth 0: t(1) 30.0, t(8) 78.0, t(16) 120.0, t(64) 420.0; 512: t(1) 50.0, t(8) 98.0" in out
    used = _costs_used()
    assert used.t_ms(1, 512) == pytest.approx(50.0) and used.v(8, 256) == pytest.approx(88.0 / 40.0)


def test_profile_on_a_busy_machine_stops_before_measuring(fake_profile_cli, capsys):
    fake_profile_cli(measurement=_measurement(True, 30.0))
    capsys.readouterr()
    busy = M.MeasurementAborted(["other processes used 1.9 of 2 cores before measuring"], [Load(1.9, 3.0, 2, "before")])
    code = fake_profile_cli(measurement=busy)
    captured = capsys.readouterr()
    assert code == 1
    err = captured.err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: profile not measured, the machine is busy (other processes used 1.9")
    assert "kept the saved profile's costs" in err[0]
    data = json.loads(captured.out)
    assert data["saved"] == "aborted" and data["measurement"]["aborted"] is True
    assert _costs_used().v(8) == pytest.approx(78 / 30)


def test_measure_stores_how_much_slower_a_typical_pass_is_than_the_fastest(monkeypatch):
    from edgespec.backend.model import LoadParams

    clock = FakeClock()

    class JitteryModel(TimedModel):
        """Every third pass 30% slower than QUIET_MS (the fastest runs stay QUIET_MS's)."""

        max_exact_batch = None

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def decode(self, tokens, logits_for=()):
            super().decode(tokens, logits_for)
            if len(self.calls) % 3 == 0 and len(list(tokens)) in QUIET_MS:
                self.clock.now += 0.3 * QUIET_MS[len(list(tokens))] / 1000

    class QuietMeter:
        def sample(self):
            return Load(0.0, 0.1, 2, "before")

        def start(self):
            pass

        def stop(self, when="during"):
            return Load(0.0, 0.1, 2, when)

    monkeypatch.setattr(M, "LlamaModel", lambda path, params: JitteryModel(clock))
    monkeypatch.setattr(M, "load_params", lambda spec, plan: LoadParams(n_ctx=256))
    monkeypatch.setattr(M, "time_ngram", lambda: 1.0)
    plan = SimpleNamespace(target=None, draft=None)
    m = M.measure(Path("target.gguf"), None, plan, ks=[1, 2, 8], repeats=3, load_meter=QuietMeter(), clock=clock)
    assert m.target_ms[8] == pytest.approx(QUIET_MS[8])  # the tables: fastest runs
    assert 1.0 < m.cost.typical <= 1.3  # a third of the runs were 30% slower
    assert m.to_json()["cost"]["typical"] == pytest.approx(m.cost.typical)


def test_measure_refuses_a_busy_machine_before_loading_anything(monkeypatch):
    class BusyMeter:
        def sample(self):
            return Load(1.9, 3.0, 2, "before")

    with pytest.raises(M.MeasurementAborted) as exc:
        M.measure(Path("/nonexistent/target.gguf"), None, plan=None, load_meter=BusyMeter())
    assert exc.value.reasons == ["other processes used 1.9 of 2 cores before measuring"]


def test_time_batches_can_stop_after_a_walk():
    clock = FakeClock()
    model = TimedModel(clock)
    walks = []

    def after():
        walks.append(1)
        if len(walks) == 2:
            raise M.MeasurementAborted(["busy (stopped early)"])

    with pytest.raises(M.MeasurementAborted):
        M.time_batches(model, [1, 2, 4], 5, Steps(), clock=clock, after_walk=after)
    assert len(walks) == 2


# ---- batch costs at several context depths ---------------------------------------------------------
class DeepModel(TimedModel):
    """t(k) grows with the tokens in the KV cache: single passes by 20 ms per 512 tokens, batches by 10."""

    def decode(self, tokens, logits_for=()):
        tokens = list(tokens)
        depth = len(self.tokens)
        self.tokens += tokens
        self.calls.append((depth, len(tokens)))
        if len(tokens) in QUIET_MS:
            self.clock.now += (QUIET_MS[len(tokens)] + (20.0 if len(tokens) == 1 else 10.0) * depth / 512) / 1000


def test_depths_follow_the_plans_context():
    assert M.depths_for(32768, 64) == [0, 512, 2048]
    assert M.depths_for(1024, 64) == [0, 512, 959]  # the plan's context is smaller than 2048 + a batch
    assert M.depths_for(512, 64) == [0, 447]
    assert M.depths_for(2048 + 65, 64) == [0, 512, 2048]
    assert M.depths_for(40, 64) == [0]


def test_time_depths_shares_one_prefill_and_times_each_depth():
    clock = FakeClock()
    model = DeepModel(clock)
    samples = M.time_depths(model, [1, 8], [0, 512, 2048], 2, Steps(), clock=clock, min_walk_ms=0)
    prefills = [c for c in model.calls if c[1] not in (1, 8)]
    assert prefills == [(0, 512), (512, 1536)]  # the deeper depth only adds what it needs
    assert {d for d, n in model.calls if n in (1, 8)} == {0, 512, 2048}
    assert len(samples[0][1]) == 2 and len(samples[512][1]) == M.DEEP_REPEATS
    assert samples[2048][1][0] == pytest.approx(30.0 + 80.0)
    assert samples[2048][8][0] == pytest.approx(78.0 + 40.0)
    assert len(model.tokens) == 2048
    table = M.cost_model({k: xs[0] for k, xs in samples[0].items()}, None,
                         {d: {k: xs[0] for k, xs in samples[d].items()} for d in (512, 2048)})
    assert table.t_ms(1, 1024) == pytest.approx(30.0 + 40.0)
    assert table.v(8, 2048) == pytest.approx(118.0 / 110.0) and table.v(8, 0) == pytest.approx(78.0 / 30.0)


def test_deeper_depths_are_skipped_when_they_would_overrun_the_budget():
    clock = FakeClock()
    model = DeepModel(clock)
    # one walk over [1, 64] at depth 0 takes 0.45 s: a deeper depth (1 + DEEP_REPEATS walks) needs ~1.8 s
    samples = M.time_depths(model, [1, 64], [0, 512, 2048], 1, Steps(), clock=clock, min_walk_ms=0, budget_s=2.5)
    assert set(samples) == {0, 512}
    clock = FakeClock()
    samples = M.time_depths(DeepModel(clock), [1, 64], [0, 512], 1, Steps(), clock=clock, min_walk_ms=0, budget_s=0.1)
    assert set(samples) == {0}


def test_a_measurement_stores_its_depth_tables_and_judges_each_depth():
    deep = {512: {k: v * 1.2 for k, v in QUIET_MS.items()}}
    m = Measurement(QUIET_MS, None, 40.0, None, cost_model(QUIET_MS, None, deep), k_limit=64,
                    target_spread={k: 0.01 for k in QUIET_MS}, depth_ms=deep,
                    depth_spread={512: {k: 0.02 for k in QUIET_MS}})
    data = m.to_json()
    assert data["depths"]["512"]["target_ms"]["1"] == pytest.approx(36.0)
    assert data["cost"]["depths"]["512"]["t1_ms"] == pytest.approx(36.0)
    from edgespec.costs import CostModel

    assert CostModel.from_json(data["cost"]).t_ms(8, 512) == pytest.approx(78.0 * 1.2)
    assert M.check_stability(deep[512], {1: 0.3}) != []  # the same rules, applied per depth by measure()
