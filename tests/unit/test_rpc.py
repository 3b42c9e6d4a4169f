"""RPC: --rpc parsing, the socket probe against fake servers, and RPC devices in the plan.

Plan arithmetic (shapes and budgets as in test_plan.py):
  RPC device of 16384 MiB total, 12288 free: budget 12288 - (819.2 + 256) = 11212.8 MiB
  target fully offloaded: 28*146 + 400 + 553 = 5041 MiB; draft fully: 1067 MiB
"""

import socket
import struct
import threading

import pytest

from edgespec.backend import rpc
from edgespec.config import LoadConfig, parse_rpc
from edgespec.errors import ConfigError, InputError
from edgespec.hardware import MiB, GPUInfo
from edgespec.plan import Plan, _assign, _shares, make_plan

from .test_plan import DRAFT, TARGET, gpu, machine, mib

# ---- --rpc ---------------------------------------------------------------------------------


def test_parse_rpc_accepts_llama_cpp_syntax():
    assert parse_rpc(None) == () and parse_rpc("  ") == ()
    assert parse_rpc("10.0.0.2:50052, gpu-box.lan:50053") == ("10.0.0.2:50052", "gpu-box.lan:50053")


@pytest.mark.parametrize("text, message", [
    ("nonsense", "host:port"),
    ("10.0.0.2", "host:port"),
    ("10.0.0.2:", "host:port"),
    ("10.0.0.2:0", "1..65535"),
    ("10.0.0.2:70000", "1..65535"),
    ("a:1,,b:2", "host:port"),
    ("a:1,a:1", "twice"),
    ("[::1]:50052", "host:port"),  # llama.cpp splits at the first ':'; no IPv6 literals
    (",".join(f"h{i}:1" for i in range(17)), "at most 16"),
])
def test_parse_rpc_rejects(text, message):
    with pytest.raises(ConfigError, match=message):
        parse_rpc(text)


def test_load_config_validates_rpc():
    assert LoadConfig(target="t", rpc=("h:1",)).rpc == ("h:1",)
    with pytest.raises(ConfigError, match="--rpc"):
        LoadConfig(target="t", rpc=("h",))


# ---- the probe, against fake servers --------------------------------------------------------


class FakeServer:
    """Answers HELLO and DEVICE_COUNT like ggml's rpc-server, or misbehaves as told."""

    def __init__(self, version=(7, 0, 0), n_devices=1, mode="ok"):
        self.version, self.n_devices, self.mode = version, n_devices, mode
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(1)
        self.endpoint = f"127.0.0.1:{self.sock.getsockname()[1]}"
        self.requests = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        conn, _ = self.sock.accept()
        with conn:
            if self.mode == "silent":
                conn.recv(1024)
                threading.Event().wait(3)
                return
            for _ in range(2):
                head = self._read(conn, 9)
                if not head:
                    return
                cmd, size = struct.unpack("<BQ", head)
                self._read(conn, size)
                self.requests.append((cmd, size))
                if cmd == rpc.CMD_HELLO:
                    reply = bytes([*self.version, 0]) + bytes(rpc.CONN_CAPS_SIZE)
                    if self.mode == "short":
                        reply = reply[:8]
                else:
                    reply = struct.pack("<I", self.n_devices)
                conn.sendall(struct.pack("<Q", len(reply)) + reply)

    @staticmethod
    def _read(conn, n):
        data = b""
        while len(data) < n:
            try:
                chunk = conn.recv(n - len(data))
            except OSError:  # the client gave up on us: what the refusal tests provoke
                return b""
            if not chunk:
                return data
            data += chunk
        return data

    def close(self):
        self.sock.close()


@pytest.fixture
def server(request):
    fake = FakeServer(**getattr(request, "param", {}))
    yield fake
    fake.close()


def test_probe_reads_version_and_devices(server):
    info = rpc.probe(server.endpoint)
    assert info.version == (7, 0, 0) and info.n_devices == 1
    # the wire format ggml-rpc expects: HELLO with 24 capability bytes, then DEVICE_COUNT
    assert server.requests == [(rpc.CMD_HELLO, rpc.CONN_CAPS_SIZE), (rpc.CMD_DEVICE_COUNT, 0)]


@pytest.mark.parametrize("server, message", [
    ({"version": (6, 0, 0)}, "speaks protocol 6.0.0"),
    ({"version": (7, 1, 0)}, "speaks protocol 7.1.0"),
    ({"n_devices": 0}, "offers no devices"),
    ({"mode": "short"}, "cannot use RPC server"),
], indirect=["server"])
def test_probe_refuses_bad_servers(server, message):
    with pytest.raises(InputError, match=message):
        rpc.probe(server.endpoint)


def test_probe_times_out_on_a_busy_server(server):
    server.mode = "silent"
    with pytest.raises(InputError, match="did not answer within 0.5 s"):
        rpc.probe(server.endpoint, timeout=0.5)


def test_probe_refused_port_names_the_fix():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(InputError, match=rf"cannot use RPC server 127.0.0.1:{port} .*edgespec rpc-server"):
        rpc.probe(f"127.0.0.1:{port}")


def test_connect_refuses_builds_without_rpc(monkeypatch):
    monkeypatch.setattr(rpc.devices, "supports_rpc", lambda: False)
    with pytest.raises(InputError, match="no RPC support"):
        rpc.connect(("127.0.0.1:50052",))


def test_port_in_use_is_a_clear_error():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        with pytest.raises(InputError, match=f"cannot listen on 127.0.0.1:{port}"):
            rpc.check_port_free("127.0.0.1", port)


# ---- RPC devices in the plan -----------------------------------------------------------------


def remote(total_mib=16384, free_mib=12288, index=0, endpoint="10.0.0.2:50052") -> GPUInfo:
    return GPUInfo(endpoint, "RPC", total_mib * MiB, free_mib * MiB, index, endpoint=endpoint)


def test_rpc_device_needs_an_endpoint():
    with pytest.raises(ValueError, match="endpoint"):
        GPUInfo("x", "RPC", MiB, MiB, 0)
    with pytest.raises(ValueError, match="endpoint"):
        GPUInfo("x", "CUDA", MiB, MiB, 0, endpoint="h:1")
    assert remote().label == "RPC0[10.0.0.2:50052]" and remote().remote


def test_cpu_machine_puts_target_on_rpc_and_keeps_draft_local():
    # offload=False: this build has no local GPU backend, but RPC devices still count.
    plan = make_plan(machine([remote()], offload=False), TARGET, DRAFT)
    assert plan.target.n_gpu_layers == 29 and plan.target.tensor_split is None
    assert plan.target.gpu_bytes == {"RPC0[10.0.0.2:50052]": 5041 * MiB}
    assert mib(plan.target.cpu_bytes) == 853  # input 300 + compute 553
    # the draft runs K times a round: a network round trip each time would cost more than the CPU
    assert plan.draft.n_gpu_layers == 0 and plan.draft.gpu_bytes == {}
    assert [d.label for d in plan.devices] == ["RPC0[10.0.0.2:50052]", "CPU"]
    assert not any("without GPU offload" in w for w in plan.warnings)


def test_local_gpu_first_rpc_unused_when_everything_fits():
    # RPC0 heads llama.cpp's device list; the local 8 GiB GPU is device 1.
    # local budget 7014.4: draft 1067, then the whole target 5041 -> nothing left for RPC
    plan = make_plan(machine([remote(), gpu(8192, 7680, index=1)]), TARGET, DRAFT)
    assert plan.draft.n_gpu_layers == 25 and plan.draft.main_gpu == 1
    assert plan.draft.tensor_split == (0.0, 1.0)
    assert plan.target.n_gpu_layers == 29 and plan.target.tensor_split == (0.0, 1.0)
    assert list(plan.target.gpu_bytes) == ["CUDA1"]


def test_rpc_takes_what_the_local_gpu_cannot_hold():
    # local 6 GiB GPU: budget 5632 - (307.2 + 256) = 5068.8; draft 1067 -> 4001.8 for the target:
    # output 400 + compute 553 + 20 layers * 146 = 3873 (21 units). RPC takes the other 8 layers:
    # 8 * 146 + 553 = 1721 MiB. Split in whole units: 8 on RPC0, 21 on CUDA1.
    plan = make_plan(machine([remote(), gpu(6144, 5632, index=1)]), TARGET, DRAFT)
    assert plan.draft.n_gpu_layers == 25
    assert plan.target.n_gpu_layers == 29 and plan.target.tensor_split == (8.0, 21.0)
    assert mib(plan.target.gpu_bytes["CUDA1"]) == 3873 + 0  # unchanged by the RPC extension
    assert mib(plan.target.gpu_bytes["RPC0[10.0.0.2:50052]"]) == 1721
    # the split as llama.cpp applies it (upper_bound on cumulative fractions) gives those counts
    where = _assign(29, 29, plan.target.tensor_split)
    assert where.count(0) == 8 and where.count(1) == 21 and where[-1] == 1  # output stays local


def test_small_rpc_device_takes_the_last_layers_and_the_rest_stays_on_cpu():
    # RPC budget: 2048 - (102.4 + 256) = 1689.6. llama.cpp offloads the *last* units, so the
    # output (400) always goes: 553 + 400 + 5 layers * 146 = 1683 fits, 6 layers (1829) do not.
    plan = make_plan(machine([remote(2048, 2048)], offload=False), TARGET, DRAFT)
    assert plan.target.n_gpu_layers == 6
    assert mib(plan.target.gpu_bytes["RPC0[10.0.0.2:50052]"]) == 1683
    assert _assign(29, 6, (1.0,)) == [None] * 23 + [0] * 6


def test_two_rpc_servers_share_by_room():
    a = remote(4096, 4096, index=0, endpoint="a:1")
    b = remote(2048, 2048, index=1, endpoint="b:1")
    plan = make_plan(machine([a, b], offload=False), TARGET, DRAFT)
    # budgets 3635.2 and 1689.6; 29 units shared 3635.2 : 1689.6 by llama.cpp's split
    used = plan.target.gpu_bytes
    assert set(used) == {"RPC0[a:1]", "RPC1[b:1]"}
    assert used["RPC0[a:1]"] <= 3635.2 * MiB and used["RPC1[b:1]"] <= 1689.6 * MiB
    assert plan.target.n_gpu_layers >= 20


def test_shares_split_whole_units_by_weight():
    assert _shares(8, [3, 1]) == [6, 2]
    assert _shares(5, [1, 1]) == [3, 2]
    assert sum(_shares(29, [7, 5, 3])) == 29


def test_plan_with_rpc_round_trips_json():
    plan = make_plan(machine([remote(), gpu(6144, 5632, index=1)]), TARGET, DRAFT)
    assert Plan.from_json(plan.to_json()) == plan


def test_refusal_counts_rpc_memory():
    from edgespec.errors import PlanError

    with pytest.raises(PlanError, match="on RPC servers"):
        make_plan(machine([remote(1024, 1024)], ram_gib=4, avail_gib=2, offload=False), TARGET, DRAFT)


def test_detection_lists_rpc_devices_first_then_local_gpus(monkeypatch):
    # llama.cpp sees only the RPC device (a build without CUDA); nvidia-smi sees a local GPU.
    from edgespec import hardware

    monkeypatch.setattr(hardware, "_gpus_from_llama", lambda: (remote(),))
    monkeypatch.setattr(hardware, "_gpus_from_nvml", lambda: ())
    monkeypatch.setattr(hardware, "_gpus_from_nvidia_smi", lambda: (gpu(8192, 8000),))
    gpus = hardware._detect_gpus(32 * 1024 * MiB, 28 * 1024 * MiB)
    assert [g.label for g in gpus] == ["RPC0[10.0.0.2:50052]", "CUDA1"]
    # that local GPU is unusable by this build: the plan warns about it, and uses the RPC device
    plan = make_plan(machine(gpus, offload=False), TARGET, DRAFT)
    assert any("without GPU offload" in w and "RTX" in w for w in plan.warnings)
    assert list(plan.target.gpu_bytes) == ["RPC0[10.0.0.2:50052]"]


def test_rpc_servers_change_the_fingerprint():
    base = machine()
    assert machine([remote()]).fingerprint() != base.fingerprint()
    assert machine([remote(endpoint="b:2")]).fingerprint() != machine([remote()]).fingerprint()
