import dataclasses
import json

import pytest

import edgespec
from edgespec import profile_store
from edgespec.errors import EdgespecError
from edgespec.hardware import GiB, GPUInfo, HardwareInfo

HW = HardwareInfo(
    os="Linux", cpu_model="Test CPU", physical_cores=8, logical_cores=16, cpu_features=("AVX2",),
    ram_total=32 * GiB, ram_available=20 * GiB, swap_total=0,
    gpus=(GPUInfo("RTX 4090", "CUDA", 24 * GiB, 20 * GiB, 0),),
    gpu_offload_supported=True, rpc_supported=False, llama_cpp_version="0.3.36",
)
DATA = {"draft_k": 5, "tokens_per_s": 41.5, "acceptance": [0.8, 0.6]}


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path))
    return tmp_path


def test_save_then_load(home):
    path = profile_store.save_profile(DATA, hw=HW, target_sha_or_name="abc123", draft="def456")
    assert path.parent == home / "profiles" and path.suffix == ".json"
    stored = json.loads(path.read_text())
    assert stored["edgespec_version"] == edgespec.__version__
    assert stored["llama_cpp_version"] == "0.3.36"
    assert stored["fingerprint"] == HW.fingerprint()
    assert stored["created"]
    record = profile_store.load_profile(HW, "abc123", "def456")
    assert record["data"] == DATA and record["warnings"] == []


def test_no_temp_files_left_and_overwrite(home):
    profile_store.save_profile(DATA, hw=HW, target_sha_or_name="t", draft=None)
    profile_store.save_profile({"v": 2}, hw=HW, target_sha_or_name="t", draft=None)
    files = list((home / "profiles").iterdir())
    assert len(files) == 1 and files[0].suffix == ".json"
    assert profile_store.load_profile(HW, "t", None)["data"] == {"v": 2}


def test_pairs_are_kept_apart():
    profile_store.save_profile({"v": 1}, hw=HW, target_sha_or_name="t", draft="d1")
    profile_store.save_profile({"v": 2}, hw=HW, target_sha_or_name="t", draft="d2")
    assert profile_store.load_profile(HW, "t", "d1")["data"] == {"v": 1}
    assert profile_store.load_profile(HW, "t", "d2")["data"] == {"v": 2}
    assert profile_store.load_profile(HW, "t", None) is None


def test_free_memory_does_not_make_it_stale():
    profile_store.save_profile(DATA, hw=HW, target_sha_or_name="t", draft=None)
    busier = dataclasses.replace(HW, ram_available=2 * GiB)
    assert profile_store.load_profile(busier, "t", None)["data"] == DATA


def test_stale_when_hardware_or_versions_change(monkeypatch):
    profile_store.save_profile(DATA, hw=HW, target_sha_or_name="t", draft=None)
    assert profile_store.load_profile(dataclasses.replace(HW, ram_total=64 * GiB), "t", None) is None
    assert profile_store.load_profile(dataclasses.replace(HW, llama_cpp_version="0.3.37"), "t", None) is None
    monkeypatch.setattr(edgespec, "__version__", "9.9.9")
    assert profile_store.load_profile(HW, "t", None) is None


def test_stale_when_stored_llama_version_differs():
    path = profile_store.save_profile(DATA, hw=HW, target_sha_or_name="t", draft=None)
    record = json.loads(path.read_text())
    record["llama_cpp_version"] = "0.2.0"
    path.write_text(json.dumps(record))
    assert profile_store.load_profile(HW, "t", None) is None


@pytest.mark.parametrize("content", ["{not json", "", "[1, 2]", '{"data": 3}', "\xff\xfe"])
def test_corrupt_file_is_absent_not_a_crash(content):
    path = profile_store.profile_path(HW, "t", None)
    path.parent.mkdir(parents=True)
    path.write_bytes(content.encode("latin-1"))
    assert profile_store.load_profile(HW, "t", None) is None
    assert profile_store.latest_profile() is None


def test_latest_profile_picks_newest_and_reports_damage(home):
    old = profile_store.save_profile({"v": "old"}, hw=HW, target_sha_or_name="a", draft=None)
    record = json.loads(old.read_text())
    record["created"] = "2000-01-01T00:00:00+00:00"
    old.write_text(json.dumps(record))
    profile_store.save_profile({"v": "new"}, hw=HW, target_sha_or_name="b", draft=None)
    (home / "profiles" / "broken.json").write_text("{")
    latest = profile_store.latest_profile()
    assert latest["data"] == {"v": "new"} and latest["target"] == "b"
    assert len(latest["warnings"]) == 1 and "broken.json" in latest["warnings"][0]


def test_latest_profile_without_any():
    assert profile_store.latest_profile() is None


def test_unwritable_home_is_a_clear_error(home, monkeypatch):
    blocker = home / "file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("EDGESPEC_HOME", str(blocker))
    with pytest.raises(EdgespecError, match="EDGESPEC_HOME"):
        profile_store.save_profile(DATA, hw=HW, target_sha_or_name="t", draft=None)


def test_costs_are_kept_per_kernel_kind():
    from edgespec.profile_store import saved_costs
    from edgespec.session import _cost

    exact = {"t1_ms": 35.7, "verify": [1.0, 2.0]}
    old_record = {"data": {"cost": exact}}  # before "costs": measured with exact kernels
    assert saved_costs(old_record) == {"exact": exact}
    assert saved_costs({"data": {"cost": exact, "kernels": "fast"}}) == {"fast": exact}
    assert saved_costs(None) == {} and saved_costs({"data": {}}) == {}
    both = {"data": {"costs": {"exact": exact, "fast": {"t1_ms": 30.0}}}}
    assert saved_costs(both)["fast"] == {"t1_ms": 30.0}
    # a run with fast kernels and only an exact profile gets estimated costs and says why
    cost, warnings = _cost(old_record, "fast")
    assert cost is None and "`edgespec profile`" in warnings[0]
    # and an --exact run with only fast costs is told to measure with --exact
    cost, warnings = _cost({"data": {"costs": {"fast": {"verify": {}}}}}, "exact")
    assert cost is None and "`edgespec profile --exact`" in warnings[0]
    assert _cost(None, "fast") == (None, ())


# ---- one stored measurement per kernel kind; stable ones win ------------------------------------
def _m(t1, stable=True):
    return {"target_ms": {"1": t1}, "cost": {"verify": {"2": 1.5}, "draft_cost": 0.4, "t1_ms": t1},
            "stable": stable, "unstable_reasons": [] if stable else ["busy"]}


def test_older_layouts_are_read_as_measurements():
    from edgespec.profile_store import saved_measurements

    full = {"target_ms": {"1": 35.7}, "cost": {"verify": {}}, "k_limit": 6}
    old = {"data": {"costs": {"exact": {"verify": {"2": 2.0}}, "fast": {"verify": {"2": 1.4}}},
                    "cost": {"verify": {"2": 1.4}}, "kernels": "fast", "measurement": {**full, "cost": {"verify": {"2": 1.4}}}}}
    ms = saved_measurements(old)
    assert ms["fast"]["k_limit"] == 6 and ms["fast"]["cost"] == {"verify": {"2": 1.4}}
    assert ms["exact"] == {"cost": {"verify": {"2": 2.0}}}  # only its costs were kept
    assert saved_measurements({"data": {"cost": {"verify": {}}}}) == {"exact": {"cost": {"verify": {}}}}
    assert saved_measurements(None) == {} and saved_measurements({"data": {"measurements": "junk"}}) == {}


def test_merge_keeps_the_other_kind_and_prefers_stable():
    from edgespec.profile_store import merge_measurement, saved_costs

    record = {"data": {"measurements": {"exact": _m(40.0), "fast": _m(30.0)}}}
    # stable: replaces this kind only
    ms, what = merge_measurement(record, "fast", _m(31.0))
    assert what == "saved" and ms["fast"]["cost"]["t1_ms"] == 31.0 and ms["exact"]["cost"]["t1_ms"] == 40.0
    # unstable: the saved stable one stays
    ms, what = merge_measurement(record, "fast", _m(90.0, stable=False))
    assert what == "kept" and ms["fast"]["cost"]["t1_ms"] == 30.0
    # unstable and forced: stored and marked
    ms, what = merge_measurement(record, "fast", _m(90.0, stable=False), force=True)
    assert what == "forced" and ms["fast"]["forced"] is True
    assert saved_costs({"data": {"measurements": ms}})["fast"]["t1_ms"] == 90.0
    # unstable with nothing usable before: stored (for --show) but not used
    ms, what = merge_measurement({"data": {"measurements": {"exact": _m(40.0)}}}, "fast", _m(90.0, stable=False))
    assert what == "unstable" and ms["fast"]["stable"] is False
    assert set(saved_costs({"data": {"measurements": ms}})) == {"exact"}
    # a later stable measurement replaces an unstable one
    ms2, what = merge_measurement({"data": {"measurements": ms}}, "fast", _m(30.0))
    assert what == "saved" and "forced" not in ms2["fast"]


def test_a_profile_run_is_stored_for_the_target_and_the_pair_and_says_what_it_did():
    data = {"models": {"target": "t", "draft": "d"}, "plan": {}}
    first = profile_store.store_profile_run(HW, target="t", draft="d", data=data, kind="fast", measurement=_m(30.0))
    assert first.decision == "saved" and first.usable and first.problem("fast", []) is None
    for draft in (None, "d"):
        stored = profile_store.load_profile(HW, "t", draft)["data"]
        assert stored["measurements"]["fast"]["cost"]["t1_ms"] == 30.0 and stored["plan"] == {}
    assert first.path == profile_store.profile_path(HW, "t", "d")  # the pair's file
    busy = profile_store.store_profile_run(HW, target="t", draft="d", data=data, kind="fast",
                                           measurement=_m(90.0, stable=False))
    assert busy.decision == "kept" and busy.usable
    assert busy.problem("fast", ["busy"]).startswith("profile unstable (busy): kept the saved profile's costs")
    aborted = profile_store.store_profile_run(HW, target="t", draft="d", data=data, kind="exact", measurement=None,
                                              aborted=True)
    assert aborted.decision == "aborted" and not aborted.usable
    assert "runs use estimated costs" in aborted.problem("exact", ["load"])
    assert profile_store.load_profile(HW, "t", "d")["data"]["measurements"]["fast"]["cost"]["t1_ms"] == 30.0
    alone = profile_store.store_profile_run(HW, target="t", draft=None, data=data, kind="fast", measurement=None)
    assert alone.decision is None and alone.usable and alone.path == profile_store.profile_path(HW, "t", None)
