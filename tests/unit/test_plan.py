"""Planner tests on scripted machines. Sizes are in MiB; the hand arithmetic is in the comments.

Shared numbers (f16 KV, n_ubatch 512):
  compute allowance, both models: 152064 vocab * 4 B * 512 = 297 MiB, + 256 MiB = 553 MiB
  target (7B-shaped Q4, 28 layers of 130 MiB, input 300 + output 400 = 4340 MiB of weights):
    KV per layer at 8192 = 8192 * 4 kv-heads * (128*2 + 128*2) B = 16 MiB  -> unit 146 MiB
    fully on GPU: 28*146 + 400 + 553 = 5041; its CPU part: input 300 + compute 553 = 853
  draft (0.5B-shaped, 24 layers of 12 MiB, tied 130 MiB embedding/output):
    KV per layer at 8192 = 8192 * 2 * (64*2 + 64*2) B = 4 MiB -> unit 16 MiB
    fully on GPU: 24*16 + 130 + 553 = 1067; its CPU part: 130 (tied) + 553 = 683
  GPU budget = free - (5% of total + 256); RAM budget = available - max(1 GiB, 10% of total)
"""

import dataclasses
import json
from types import SimpleNamespace

import pytest

from edgespec.errors import ConfigError, ModelFileError, PlanError
from edgespec.hardware import GiB, MiB, GPUInfo, HardwareInfo, apple_working_set
from edgespec.plan import (
    DeviceUse, ModelShape, Plan, compute_bytes, kv_bytes, make_plan,
)

TARGET = ModelShape(
    name="qwen7b-q4", n_layers=28, layer_bytes=(130 * MiB,) * 28, nonlayer_bytes=700 * MiB,
    output_bytes=400 * MiB, n_head_kv=4, head_dim_k=128, head_dim_v=128, n_ctx_train=32768,
    n_embd=3584, n_vocab=152064,
)
DRAFT = ModelShape(
    name="qwen0.5b", n_layers=24, layer_bytes=(12 * MiB,) * 24, nonlayer_bytes=130 * MiB,
    output_bytes=130 * MiB, n_head_kv=2, head_dim_k=64, head_dim_v=64, n_ctx_train=32768,
    n_embd=896, n_vocab=152064,
)


def machine(gpus=(), ram_gib=32, avail_gib=28, offload=True, cores=8) -> HardwareInfo:
    return HardwareInfo(
        os="Linux", cpu_model="Test", physical_cores=cores, logical_cores=2 * cores,
        cpu_features=("AVX2",), ram_total=ram_gib * GiB, ram_available=avail_gib * GiB,
        swap_total=0, gpus=tuple(gpus), gpu_offload_supported=offload, rpc_supported=False,
        llama_cpp_version="0.3.36",
    )


def gpu(total_mib, free_mib, index=0, name="RTX", backend="CUDA", unified=False) -> GPUInfo:
    return GPUInfo(name, backend, total_mib * MiB, free_mib * MiB, index, unified_memory=unified)


def mib(n: int) -> float:
    return n / MiB


def test_shared_numbers():
    assert compute_bytes(TARGET) == 553 * MiB
    assert kv_bytes(TARGET, 8192) == 28 * 16 * MiB
    assert kv_bytes(DRAFT, 8192) == 24 * 4 * MiB


def test_no_gpu_everything_on_cpu():
    plan = make_plan(machine(), TARGET, DRAFT)
    assert plan.n_ctx == 8192 and plan.warnings == ()
    assert plan.target.n_gpu_layers == 0 and plan.draft.n_gpu_layers == 0
    assert plan.target.gpu_bytes == {} and plan.target.tensor_split is None
    # target: 300 input + 553 compute + 28*146 + 400 = 5341; draft: 130 + 553 + 24*16 + 130 = 1197
    assert mib(plan.target.cpu_bytes) == 5341 and mib(plan.draft.cpu_bytes) == 1197
    # both on the CPU, run one after the other: each gets every physical core
    assert plan.target.threads == 8 and plan.draft.threads == 8
    assert [d.label for d in plan.devices] == ["CPU"]


def test_gpu_present_but_build_without_offload():
    plan = make_plan(machine([gpu(8192, 7680)], offload=False), TARGET, DRAFT, n_gpu_layers=10)
    assert plan.target.n_gpu_layers == 0 and plan.draft.n_gpu_layers == 0
    assert any("without GPU offload" in w for w in plan.warnings)


def test_one_8gb_gpu_fits_both():
    # budget 7680 - (409.6 + 256) = 7014.4; draft 1067 -> 5947.4 left >= 5041: target fully too
    plan = make_plan(machine([gpu(8192, 7680)]), TARGET, DRAFT)
    assert plan.n_ctx == 8192 and plan.warnings == ()
    assert plan.draft.n_gpu_layers == 25 and plan.target.n_gpu_layers == 29
    assert {k: mib(v) for k, v in plan.target.gpu_bytes.items()} == {"CUDA0": 5041}
    assert mib(plan.draft.gpu_bytes["CUDA0"]) == 1067
    assert mib(plan.target.cpu_bytes) == 853
    assert plan.target.tensor_split is None
    # the draft lives on the GPU: 2 threads feed it; the target keeps every physical core
    assert plan.draft.threads == 2 and plan.target.threads == 8
    cuda = plan.devices[0]
    assert cuda == DeviceUse("CUDA0", 8192 * MiB, (5041 + 1067) * MiB, (7680 - 6108) * MiB)


def test_one_6gb_gpu_partial_target():
    # budget 5632 - (307.2 + 256) = 5068.8; after the draft 4001.8;
    # output 400 + compute 553 + (k-1)*146 <= 4001.8 -> k-1 = 20 -> ngl 21 (20 layers + output)
    plan = make_plan(machine([gpu(6144, 5632)]), TARGET, DRAFT, n_ctx=8192)
    assert plan.draft.n_gpu_layers == 25
    assert plan.target.n_gpu_layers == 21
    assert mib(plan.target.gpu_bytes["CUDA0"]) == 400 + 553 + 20 * 146
    # CPU: input 300 + compute 553 + 8 layers * 146
    assert mib(plan.target.cpu_bytes) == 300 + 553 + 8 * 146
    assert plan.warnings == ()


def test_context_shrinks_before_target_leaves_gpu():
    # Same 6 GB GPU, context left to the planner. At 8192: ngl 21 (above).
    # At 4096: units 138, draft 24*14+130+553 = 1019 -> 4049.8 left -> (k-1) <= 22.4 -> ngl 23.
    # At 2048: units 134, draft 24*13+130+553 = 995 -> 4073.8 left -> (k-1) <= 23.3 -> ngl 24.
    plan = make_plan(machine([gpu(6144, 5632)]), TARGET, DRAFT)
    assert plan.n_ctx == 2048
    assert plan.target.n_gpu_layers == 24
    assert any("context reduced from 8192 to 2048" in w for w in plan.warnings)


def test_explicit_context_is_kept():
    plan = make_plan(machine([gpu(6144, 5632)]), TARGET, DRAFT, n_ctx=8192)
    assert plan.n_ctx == 8192 and not any("context reduced" in w for w in plan.warnings)


def test_one_24gb_gpu_fits_both_fully():
    plan = make_plan(machine([gpu(24576, 23552)]), TARGET, DRAFT)
    assert plan.n_ctx == 8192
    assert plan.target.n_gpu_layers == 29 and plan.draft.n_gpu_layers == 25
    assert plan.warnings == ()


def test_two_gpus_split_in_proportion_to_free_memory():
    # A: 12288 free - (1228.8 + 256) = 10803.2; B: 6144 - (614.4 + 256) = 5273.6.
    # Draft on A (most free): 10803.2 - 1067 = 9736.2 left.
    # split = 9736.2 / 15009.8 = 0.6487, 0.3513; unit j of 29 goes to A while j/29 < 0.6487,
    # i.e. j = 0..18: 19 layers on A, 9 layers + output on B.
    hw = machine([gpu(24576, 12288, 0, "A"), gpu(12288, 6144, 1, "B")])
    plan = make_plan(hw, TARGET, DRAFT, n_ctx=8192)
    assert plan.target.n_gpu_layers == 29
    assert plan.target.tensor_split == pytest.approx((0.6487, 0.3513), abs=1e-4)
    assert {k: mib(v) for k, v in plan.target.gpu_bytes.items()} == {
        "CUDA0": 19 * 146 + 553, "CUDA1": 9 * 146 + 400 + 553,
    }
    assert plan.draft.main_gpu == 0 and plan.draft.tensor_split == (1.0, 0.0)
    assert list(plan.draft.gpu_bytes) == ["CUDA0"]


def test_draft_goes_to_gpu_with_most_free_memory():
    hw = machine([gpu(12288, 4096, 0, "small"), gpu(24576, 20480, 1, "big")])
    plan = make_plan(hw, TARGET, DRAFT, n_ctx=8192)
    assert plan.draft.main_gpu == 1 and plan.draft.tensor_split == (0.0, 1.0)
    assert list(plan.draft.gpu_bytes) == ["CUDA1"]


def test_apple_unified_16gb():
    # Metal may use ~2/3 of 16 GiB = 10922.7 MiB; budget min(10922.7 - 1075.2, RAM 12288 - 1638.4)
    # Both models fully on the GPU: 5041 + 1067 = 6108; CPU parts 853 + 683 = 1536.
    metal = GPUInfo("Apple M2 GPU", "Metal", 16 * GiB, apple_working_set(16 * GiB), 0, unified_memory=True)
    plan = make_plan(machine([metal], ram_gib=16, avail_gib=12), TARGET, DRAFT)
    assert plan.n_ctx == 8192
    assert plan.target.n_gpu_layers == 29 and plan.draft.n_gpu_layers == 25
    cpu = plan.devices[-1]
    # one pool: what Metal takes comes out of the same RAM the CPU parts use
    assert cpu.label == "CPU" and cpu.headroom == 12 * GiB - (6108 + 1536) * MiB


def test_apple_unified_memory_is_counted_once():
    # 8 GiB Mac, 6 GiB available: RAM budget 6144 - 1024 = 5120 MiB for everything.
    # Even at 2048 the pair needs (28*134 + 400 + 553) + 995 on the GPU + 1536 on the CPU = 7236.
    # Counting Metal's ~4796 MiB on top of the RAM would wrongly make it fit.
    metal = GPUInfo("Apple M1 GPU", "Metal", 8 * GiB, apple_working_set(8 * GiB), 0, unified_memory=True)
    with pytest.raises(PlanError):
        make_plan(machine([metal], ram_gib=8, avail_gib=6), TARGET, DRAFT)
    discrete = dataclasses.replace(metal, backend="CUDA", unified_memory=False)
    make_plan(machine([discrete], ram_gib=8, avail_gib=6), TARGET, DRAFT)  # fits when separate


def test_machine_too_small_refuses_with_an_alternative():
    # 4 GiB RAM, 3 available: 2048 MiB usable; the target alone needs 5005 MiB even at 2048.
    # Room for weights: 2048 - (553 compute + 28*4 KV) = 1383 MiB ~ 1.4 GiB.
    with pytest.raises(PlanError) as err:
        make_plan(machine(ram_gib=4, avail_gib=3), TARGET)
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith("qwen7b-q4 needs ~4.9 GiB at context 2048")
    assert "smaller quant of qwen7b-q4 whose weights are under ~1.4 GiB" in message
    # with the draft too (1125 MiB more at 2048) there is room for ~258 MiB of target weights
    with pytest.raises(PlanError, match=r"qwen7b-q4 \+ qwen0.5b need ~6.0 GiB.*under ~0.3 GiB"):
        make_plan(machine(ram_gib=4, avail_gib=3), TARGET, DRAFT)


def test_refusal_names_q4_k_m_when_parameter_count_known():
    q8 = dataclasses.replace(TARGET, name="qwen7b-q8", layer_bytes=(260 * MiB,) * 28,
                             nonlayer_bytes=1000 * MiB, output_bytes=550 * MiB, n_params=7_600_000_000)
    with pytest.raises(PlanError, match=r"a Q4_K_M of qwen7b-q8 \(needs ~[0-9.]+ GiB"):
        make_plan(machine(ram_gib=8, avail_gib=6), q8)


def test_refusal_suggests_smaller_context_kv_type_and_no_draft():
    # CPU only, 10 GiB RAM with 8.5 available: budget 8704 - 1024 = 7680 MiB.
    # At 32768: KV 28*64 + 24*16 = 2176 -> the pair needs 6538 - 544 + 2176 = 8170: refused.
    # 16384 needs 7082, q8_0 KV needs 7150, the target alone 6685: all three fit.
    hw = HardwareInfo("Linux", "Test", 8, 16, (), 10 * GiB, int(8.5 * GiB), 0)
    with pytest.raises(PlanError) as err:
        make_plan(hw, TARGET, DRAFT, n_ctx=32768)
    message = str(err.value)
    assert "a context of 16384 tokens" in message
    assert "KV cache type q8_0" in message
    assert "without the draft model" in message


def test_kv_type_changes_kv_bytes_by_the_right_ratio():
    f16 = make_plan(machine(), TARGET, DRAFT, n_ctx=8192)
    q8 = make_plan(machine(), TARGET, DRAFT, n_ctx=8192, type_k="q8_0", type_v="q8_0")
    q4 = make_plan(machine(), TARGET, DRAFT, n_ctx=8192, type_k="q4_0", type_v="q4_0")
    f32 = make_plan(machine(), TARGET, DRAFT, n_ctx=8192, type_k="f32", type_v="f32")
    assert q8.target.kv_bytes / f16.target.kv_bytes == pytest.approx(34 / 32 / 2)
    assert q4.target.kv_bytes / f16.target.kv_bytes == pytest.approx(18 / 32 / 2)
    assert f32.target.kv_bytes == 2 * f16.target.kv_bytes
    mixed = make_plan(machine(), TARGET, None, n_ctx=8192, type_k="q8_0", type_v="f16")
    assert mixed.target.kv_bytes == (q8.target.kv_bytes + f16.target.kv_bytes) // 2
    assert q8.type_k == "q8_0" and q8.draft.kv_bytes < f16.draft.kv_bytes


def test_user_gpu_layer_override_is_respected():
    hw = machine([gpu(6144, 5632)])
    plan = make_plan(hw, TARGET, DRAFT, n_ctx=8192, n_gpu_layers=10, n_gpu_layers_draft=5)
    assert plan.target.n_gpu_layers == 10 and plan.draft.n_gpu_layers == 5
    assert mib(plan.target.gpu_bytes["CUDA0"]) == 400 + 9 * 146 + 553
    assert plan.draft.threads == 8  # only partly on the GPU: it needs the CPU cores
    # -1 means all; more than fits is honoured, with a warning instead of a refusal
    greedy = make_plan(hw, TARGET, DRAFT, n_ctx=8192, n_gpu_layers=-1)
    assert greedy.target.n_gpu_layers == 29
    assert any("exceed the estimated free GPU memory" in w for w in greedy.warnings)
    assert make_plan(hw, TARGET, None, n_gpu_layers=0).target.n_gpu_layers == 0


def test_thread_overrides():
    plan = make_plan(machine([gpu(24576, 23552)]), TARGET, DRAFT, threads=3, threads_draft=1)
    assert plan.target.threads == 3 and plan.draft.threads == 1


def test_target_without_draft():
    plan = make_plan(machine([gpu(8192, 7680)]), TARGET)
    assert plan.draft is None and plan.target.n_gpu_layers == 29


def test_context_past_training_warns():
    short = dataclasses.replace(TARGET, n_ctx_train=4096)
    assert make_plan(machine(), short).n_ctx == 4096  # auto never exceeds the trained context
    plan = make_plan(machine(), short, n_ctx=8192)
    assert any("trained context of 4096" in w for w in plan.warnings)


def test_invalid_requests():
    with pytest.raises(ConfigError, match="KV cache type"):
        make_plan(machine(), TARGET, type_k="q3_k")
    with pytest.raises(ConfigError, match="context"):
        make_plan(machine(), TARGET, n_ctx=0)
    with pytest.raises(ConfigError, match="threads"):
        make_plan(machine(), TARGET, threads=0)
    with pytest.raises(ConfigError, match="n_gpu_layers"):
        make_plan(machine([gpu(8192, 7680)]), TARGET, n_gpu_layers=-2)


def test_plan_json_round_trip():
    hw = machine([gpu(24576, 12288, 0, "A"), gpu(12288, 6144, 1, "B")])
    plan = make_plan(hw, TARGET, DRAFT)
    assert Plan.from_json(json.loads(json.dumps(plan.to_json()))) == plan
    cpu_plan = make_plan(machine(), TARGET)
    assert Plan.from_json(json.loads(json.dumps(cpu_plan.to_json()))) == cpu_plan


def test_model_shape_from_gguf_and_validation():
    info = SimpleNamespace(
        name="m", n_layers=2, layer_bytes=[10, 10], nonlayer_bytes=5, output_bytes=3, n_head_kv=1,
        head_dim_k=4, head_dim_v=4, n_ctx_train=512, n_embd=8, n_vocab=100, file_size=25,
    )
    shape = ModelShape.from_gguf(info)
    assert shape.layer_bytes == (10, 10) and shape.n_vocab == 100 and shape.file_size == 25
    assert shape.input_bytes == 2 and shape.weight_bytes == 25
    del info.n_vocab
    info.name, info.path = None, "/models/Qwen2.5-7B-Q4_K_M.gguf"
    assert ModelShape.from_gguf(info).name == "Qwen2.5-7B-Q4_K_M"
    assert ModelShape.from_gguf(info).n_vocab == 152064  # assumed large when unknown
    assert not shape.tied_output
    # tied embeddings (no output.weight): the embedding stays on the CPU for the input as well
    tensors = {"token_embd.weight": object(), "output_norm.weight": object()}
    info.tensor = tensors.get
    info.output_bytes = 4
    tied = ModelShape.from_gguf(info)
    assert tied.tied_output and tied.input_bytes == 5
    with pytest.raises(ModelFileError, match="2 layer sizes for 3 layers"):
        dataclasses.replace(shape, n_layers=3)
    with pytest.raises(ModelFileError, match="n_head_kv"):
        dataclasses.replace(shape, n_head_kv=0)


# --- --gpu-memory: a cap on what the plan puts on each local GPU --------------------------------


def test_parse_size_forms():
    from edgespec.hardware import parse_size, parse_size_option

    assert parse_size("1.5G") == 1536 * MiB
    assert parse_size("800M") == 800 * MiB
    assert parse_size("800m") == 800 * MiB
    assert parse_size("2GiB") == 2 * GiB
    assert parse_size("512MB") == 512 * MiB
    assert parse_size(" 64K ") == 64 * 1024
    assert parse_size("4096") == 4096
    assert parse_size("0") == 0
    for bad in ("", "lots", "1.5X", "-1G", "1..5G", "G"):
        with pytest.raises(ValueError, match="examples: 1.5G"):
            parse_size(bad)
    assert parse_size_option(None, "--gpu-memory") is None
    assert parse_size_option("  ", "--gpu-memory") is None
    with pytest.raises(ConfigError, match="^--gpu-memory: not a memory size: 'lots'"):
        parse_size_option("lots", "--gpu-memory")


def test_load_config_validates_gpu_memory():
    from edgespec.config import LoadConfig

    assert LoadConfig(target="t", gpu_memory=800 * MiB).gpu_memory == 800 * MiB
    assert LoadConfig(target="t", gpu_memory=0).gpu_memory == 0
    with pytest.raises(ConfigError, match="--gpu-memory"):
        LoadConfig(target="t", gpu_memory=-1)


def test_gpu_memory_caps_the_joint_plan():
    # The 8 GB GPU above holds both fully (budget 7014.4). Capped at 2048 MiB: the draft first,
    # fully (1067) -> 981 left; target: output 400 + compute 553 = 953 <= 981, one more layer
    # (146) would not fit -> ngl 1 (the output layer only).
    plan = make_plan(machine([gpu(8192, 7680)]), TARGET, DRAFT, n_ctx=8192, gpu_memory=2048 * MiB)
    assert plan.draft.n_gpu_layers == 25 and mib(plan.draft.gpu_bytes["CUDA0"]) == 1067
    assert plan.target.n_gpu_layers == 1 and mib(plan.target.gpu_bytes["CUDA0"]) == 953
    assert plan.devices[0].used <= 2048 * MiB
    # The cap moved 28 layers back to the CPU: 300 input + 553 compute + 28 * 146
    assert mib(plan.target.cpu_bytes) == 300 + 553 + 28 * 146
    # 3000 MiB: 3000 - 1067 - 953 = 980 -> 6 more layers (876) -> ngl 7
    wider = make_plan(machine([gpu(8192, 7680)]), TARGET, DRAFT, n_ctx=8192, gpu_memory=3000 * MiB)
    assert wider.target.n_gpu_layers == 7 and wider.devices[0].used <= 3000 * MiB


def test_gpu_memory_above_free_changes_nothing_and_zero_means_cpu_only():
    hw = machine([gpu(6144, 5632)])
    assert make_plan(hw, TARGET, DRAFT, n_ctx=8192, gpu_memory=64 * GiB) == make_plan(hw, TARGET, DRAFT, n_ctx=8192)
    none = make_plan(hw, TARGET, DRAFT, n_ctx=8192, gpu_memory=0)
    assert none.target.n_gpu_layers == 0 and none.draft.n_gpu_layers == 0
    assert none.target.gpu_bytes == {} and none.draft.gpu_bytes == {}


def test_gpu_memory_cap_applies_to_each_local_gpu_not_rpc_servers():
    hw = machine([GPUInfo("10.0.0.2:50052", "RPC", 16384 * MiB, 12288 * MiB, 0, endpoint="10.0.0.2:50052"),
                  gpu(8192, 7680, 1)])
    plan = make_plan(hw, TARGET, DRAFT, n_ctx=8192, gpu_memory=1100 * MiB)
    # the draft (1067) alone fills the capped local GPU; the target goes to the RPC server
    assert plan.draft.gpu_bytes == {"CUDA1": 1067 * MiB}
    assert plan.target.n_gpu_layers == 29
    assert list(plan.target.gpu_bytes) == ["RPC0[10.0.0.2:50052]"]
    assert plan.target.gpu_bytes["RPC0[10.0.0.2:50052]"] > 1100 * MiB


def test_explicit_layers_over_the_cap_are_refused_before_loading():
    hw = machine([gpu(8192, 7680)])
    with pytest.raises(PlanError, match=r"^-ngl 29 and -ngld 25 need ~6108 MiB on CUDA0 but --gpu-memory allows 2048 MiB"):
        make_plan(hw, TARGET, DRAFT, n_ctx=8192, n_gpu_layers=-1, n_gpu_layers_draft=-1, gpu_memory=2048 * MiB)
    assert PlanError("x").exit_code == 9
    # the draft placed by the plan (1067) + -ngl 3 (400 + 2 * 146 + 553) = 2312 > 2048
    with pytest.raises(PlanError, match=r"^-ngl 3 and the draft's 25 planned GPU layers need ~2312 MiB"):
        make_plan(hw, TARGET, DRAFT, n_ctx=8192, n_gpu_layers=3, gpu_memory=2048 * MiB)
    # within the cap (1067 + 953 = 2020), explicit counts are honoured as before
    ok = make_plan(hw, TARGET, DRAFT, n_ctx=8192, n_gpu_layers=1, gpu_memory=2048 * MiB)
    assert ok.target.n_gpu_layers == 1 and ok.devices[0].used == 2020 * MiB
    # without a cap, overrunning free memory stays a warning (llama.cpp may still manage)
    warned = make_plan(machine([gpu(6144, 5632)]), TARGET, DRAFT, n_ctx=8192, n_gpu_layers=-1)
    assert any("exceed the estimated free GPU memory" in w for w in warned.warnings)
    with pytest.raises(ConfigError, match="--gpu-memory"):
        make_plan(hw, TARGET, gpu_memory=-1)
