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
