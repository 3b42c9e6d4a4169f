"""Joint placement of a target and a draft model on this machine's GPUs and RAM.

Pure arithmetic on HardwareInfo and ModelShape: no I/O, so it is tested with scripted machines.
All byte counts are estimates of what llama.cpp (as vendored by llama-cpp-python 0.3.36) will
allocate; the margins below absorb the difference.

Layer semantics follow that llama.cpp: a model has n_layers repeating blocks plus the output
layer, numbered n_layers. With n_gpu_layers = k, the *last* k of those n_layers + 1 units go to
the GPU(s), so k = n_layers + 1 offloads everything, and k = 1 offloads only the output layer.
The input (token embedding) layer always stays on the CPU.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Sequence

from edgespec.config import KV_CACHE_TYPES
from edgespec.errors import ConfigError, ModelFileError, PlanError
from edgespec.hardware import GiB, MiB, GPUInfo, HardwareInfo

DEFAULT_CTX = 8192
MIN_AUTO_CTX = 2048
DEFAULT_BATCH = 512
DEFAULT_UBATCH = 512

# Compute-buffer allowance per model per device: the logits of one ubatch (n_vocab floats per
# token) plus a fixed share for activations and graph scratch. An estimate, not llama.cpp's
# exact graph size; it errs high for small models so the plan does not OOM at load time.
COMPUTE_FIXED = 256 * MiB

# What not to plan into: GPUs keep 5% + 256 MiB (driver, fragmentation, other processes);
# RAM keeps 10% (at least 1 GiB) for the OS and everything else running.
GPU_MARGIN_FRACTION = 0.05
GPU_MARGIN_FIXED = 256 * MiB
RAM_HEADROOM_FRACTION = 0.10
RAM_HEADROOM_MIN = 1 * GiB

# A draft that is fully on a GPU only needs a CPU thread or two to feed it; more would contend
# with the target's threads for no gain.
DRAFT_GPU_THREADS = 2

# Bits per weight of a Q4_K_M file, for the "a smaller quant would fit" suggestion.
Q4_K_M_BITS = 4.85

CPU = "CPU"


@dataclass(frozen=True)
class ModelShape:
    """The sizes that matter for placement, from the GGUF header.

    nonlayer_bytes: every tensor outside the blk.N blocks (token embedding, output norm, output).
    output_bytes: the output matrix, what offloading the output layer moves to the GPU.
    tied_output: the output reuses the token embedding (no output.weight); llama.cpp then keeps
    the embedding on the CPU for the input *and* puts a copy on the output's device.
    """

    name: str
    n_layers: int
    layer_bytes: tuple[int, ...]
    nonlayer_bytes: int
    output_bytes: int
    n_head_kv: int
    head_dim_k: int
    head_dim_v: int
    n_ctx_train: int
    n_embd: int
    n_vocab: int
    file_size: int = 0
    n_params: int = 0  # 0 = unknown
    tied_output: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "layer_bytes", tuple(int(b) for b in self.layer_bytes))
        positive = ("n_layers", "n_head_kv", "head_dim_k", "head_dim_v", "n_ctx_train", "n_embd", "n_vocab")
        for name in positive:
            if getattr(self, name) < 1:
                raise ModelFileError(f"{self.name}: {name} must be >= 1, got {getattr(self, name)}")
        if len(self.layer_bytes) != self.n_layers:
            raise ModelFileError(
                f"{self.name}: {len(self.layer_bytes)} layer sizes for {self.n_layers} layers"
            )
        for name in ("nonlayer_bytes", "output_bytes", "file_size", "n_params"):
            if getattr(self, name) < 0:
                raise ModelFileError(f"{self.name}: {name} must be >= 0, got {getattr(self, name)}")
        if any(b < 0 for b in self.layer_bytes):
            raise ModelFileError(f"{self.name}: layer sizes must be >= 0")

    @classmethod
    def from_gguf(cls, info: Any) -> ModelShape:
        # Vocabulary size feeds only the compute-buffer estimate; when the header does not tell it
        # (GGUFInfo.n_vocab None), assume a large modern vocabulary (Qwen's 152k) so the estimate errs high.
        n_vocab = getattr(info, "n_vocab", None) or 152064
        return cls(
            name=info.name or _stem(getattr(info, "path", None)),
            n_layers=info.n_layers,
            layer_bytes=tuple(info.layer_bytes),
            nonlayer_bytes=info.nonlayer_bytes,
            output_bytes=info.output_bytes,
            n_head_kv=info.n_head_kv,
            head_dim_k=info.head_dim_k,
            head_dim_v=info.head_dim_v,
            n_ctx_train=info.n_ctx_train,
            n_embd=info.n_embd,
            n_vocab=int(n_vocab),
            file_size=int(getattr(info, "file_size", 0) or 0),
            n_params=int(getattr(info, "n_params", 0) or 0),
            tied_output=_has_tied_output(info),
        )

    @property
    def input_bytes(self) -> int:
        """Bytes that stay on the CPU whatever n_gpu_layers is (the input layer)."""
        if self.tied_output or self.output_bytes >= self.nonlayer_bytes:
            return self.nonlayer_bytes
        return self.nonlayer_bytes - self.output_bytes

    @property
    def weight_bytes(self) -> int:
        return sum(self.layer_bytes) + self.nonlayer_bytes


def _stem(path: Any) -> str:
    # general.name is optional in GGUF; the file name is the next best label.
    return Path(path).stem if path else "model"


def _has_tied_output(info: Any) -> bool:
    lookup = getattr(info, "tensor", None)
    if not callable(lookup):
        return bool(getattr(info, "tied_output", False))
    return lookup("output.weight") is None and lookup("token_embd.weight") is not None


def kv_bytes_per_elem(type_name: str) -> float:
    try:
        return KV_CACHE_TYPES[type_name].bytes_per_elem
    except KeyError:
        raise ConfigError(
            f"unknown KV cache type {type_name!r}; use one of {', '.join(KV_CACHE_TYPES)}"
        ) from None


def kv_layer_bytes(shape: ModelShape, n_ctx: int, type_k: str, type_v: str) -> int:
    per_token = shape.n_head_kv * (
        shape.head_dim_k * kv_bytes_per_elem(type_k) + shape.head_dim_v * kv_bytes_per_elem(type_v)
    )
    return int(n_ctx * per_token)


def kv_bytes(shape: ModelShape, n_ctx: int, type_k: str = "f16", type_v: str = "f16") -> int:
    return shape.n_layers * kv_layer_bytes(shape, n_ctx, type_k, type_v)


def compute_bytes(shape: ModelShape, n_ubatch: int = DEFAULT_UBATCH) -> int:
    return shape.n_vocab * 4 * n_ubatch + COMPUTE_FIXED


# --- output types --------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelPlacement:
    model: str
    n_gpu_layers: int
    main_gpu: int
    tensor_split: tuple[float, ...] | None
    gpu_bytes: dict[str, int]
    cpu_bytes: int
    kv_bytes: int
    threads: int

    def __post_init__(self) -> None:
        if self.n_gpu_layers < 0 or self.threads < 1 or self.cpu_bytes < 0 or self.kv_bytes < 0:
            raise ValueError(f"{self.model}: placement sizes must be >= 0 and threads >= 1")

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ModelPlacement:
        fields = dict(data)
        split = fields.get("tensor_split")
        fields["tensor_split"] = tuple(split) if split is not None else None
        fields["gpu_bytes"] = {str(k): int(v) for k, v in fields.get("gpu_bytes", {}).items()}
        return cls(**fields)


@dataclass(frozen=True)
class DeviceUse:
    """Planned use of one device. headroom: what it would still have free after loading
    (free/available memory now minus `used`); negative means the plan overcommits it."""

    label: str
    total: int
    used: int
    headroom: int


@dataclass(frozen=True)
class Plan:
    target: ModelPlacement
    draft: ModelPlacement | None
    n_ctx: int
    type_k: str
    type_v: str
    n_batch: int = DEFAULT_BATCH
    n_ubatch: int = DEFAULT_UBATCH
    devices: tuple[DeviceUse, ...] = ()
    warnings: tuple[str, ...] = ()
    n_seq: int = 1  # sequences served at once, each with n_ctx tokens of KV (counted in the placements)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["devices"] = [asdict(d) for d in self.devices]
        data["warnings"] = list(self.warnings)
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Plan:
        fields = dict(data)
        fields["target"] = ModelPlacement.from_json(fields["target"])
        draft = fields.get("draft")
        fields["draft"] = ModelPlacement.from_json(draft) if draft is not None else None
        fields["devices"] = tuple(DeviceUse(**d) for d in fields.get("devices", ()))
        fields["warnings"] = tuple(fields.get("warnings", ()))
        return cls(**fields)


# --- budgets -------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Budget:
    """Plannable bytes: per GPU (llama.cpp device order) and for RAM. `unified` GPUs draw on
    the same RAM pool, so what they use is also taken out of `ram`."""

    gpus: tuple[GPUInfo, ...]
    gpu: tuple[int, ...]
    ram: int
    unified: bool


def ram_headroom(hw: HardwareInfo) -> int:
    return max(RAM_HEADROOM_MIN, int(hw.ram_total * RAM_HEADROOM_FRACTION))


def gpu_margin(gpu: GPUInfo) -> int:
    return int(gpu.total_bytes * GPU_MARGIN_FRACTION) + GPU_MARGIN_FIXED


def _budget(hw: HardwareInfo, gpu_memory: int | None = None) -> _Budget:
    ram = max(0, hw.ram_available - ram_headroom(hw))
    # RPC devices work whatever this build can offload locally: they are other machines'.
    usable = [g for g in hw.gpus if g.remote or hw.gpu_offload_supported]
    gpus = tuple(sorted(usable, key=lambda g: g.index))
    unified = any(g.unified_memory for g in gpus)
    gpu = tuple(max(0, g.free_bytes - gpu_margin(g)) for g in gpus)
    if gpu_memory is not None:
        # --gpu-memory caps what the plan puts on each local GPU; RPC servers size their own.
        gpu = tuple(b if g.remote else min(b, gpu_memory) for g, b in zip(gpus, gpu))
    if unified:
        gpu = tuple(b if g.remote else min(b, ram) for g, b in zip(gpus, gpu))
    return _Budget(gpus, gpu, ram, unified)


# --- one model on a set of budgets ---------------------------------------------------------


def _units(shape: ModelShape, kv_layer: int) -> list[int]:
    """Bytes of each offloadable unit: the repeating layers (weights + their KV) then output."""
    return [b + kv_layer for b in shape.layer_bytes] + [shape.output_bytes]


def _split_points(fractions: Sequence[float]) -> list[float]:
    total = sum(fractions)
    points, acc = [], 0.0
    for f in fractions:
        acc += f
        points.append(acc / total)
    return points


def _assign(n_units: int, k: int, fractions: Sequence[float]) -> list[int | None]:
    """Device position of each unit for n_gpu_layers = k, as llama.cpp's load_tensors does it
    (upper_bound of the unit's relative position in the cumulative split); None = CPU."""
    points = _split_points(fractions)
    start = n_units - k
    devices: list[int | None] = []
    for unit in range(n_units):
        if unit < start:
            devices.append(None)
            continue
        x = (unit - start) / k
        devices.append(next((i for i, p in enumerate(points) if p > x), len(points) - 1))
    return devices


@dataclass(frozen=True)
class _Fit:
    k: int
    gpu_used: tuple[int, ...]  # per budget position
    cpu_used: int


def _usage(shape: ModelShape, units: list[int], k: int, fractions: Sequence[float], compute: int) -> _Fit:
    n_gpu = len(fractions)
    gpu_used = [0] * n_gpu
    cpu = shape.input_bytes + compute
    placement = _assign(len(units), k, fractions) if k else [None] * len(units)
    for unit_bytes, dev in zip(units, placement):
        if dev is None:
            cpu += unit_bytes
        else:
            gpu_used[dev] += unit_bytes
    gpu_used = [u + compute if u else 0 for u in gpu_used]
    return _Fit(k, tuple(gpu_used), cpu)


def _best_fit(shape: ModelShape, units: list[int], fractions: Sequence[float],
              budget: Sequence[int], compute: int) -> _Fit:
    """Largest k whose GPU usage fits every device's budget."""
    if not any(fractions):
        return _usage(shape, units, 0, fractions, compute)
    for k in range(len(units), 0, -1):
        fit = _usage(shape, units, k, fractions, compute)
        if all(u <= b for u, b in zip(fit.gpu_used, budget)):
            return fit
    return _usage(shape, units, 0, fractions, compute)


# --- the joint plan at one context ---------------------------------------------------------


@dataclass(frozen=True)
class _Joint:
    n_ctx: int
    target: _Fit
    target_fractions: tuple[float, ...]
    draft: _Fit | None
    draft_gpu: int | None  # budget position holding the draft (None: no local GPU)
    feasible: bool
    gpu_overcommitted: bool
    need: int  # bytes the pair needs in all
    kv_target: int
    kv_draft: int


def _unit_counts(n_units: int, k: int, fractions: Sequence[float]) -> list[int]:
    """How many of the last k units each device gets under `fractions`."""
    counts = [0] * len(fractions)
    if k:
        for dev in _assign(n_units, k, fractions):
            if dev is not None:
                counts[dev] += 1
    return counts


def _shares(n: int, weights: Sequence[int]) -> list[int]:
    """n whole units split by weight (largest remainder; ties to the earlier device)."""
    total = sum(weights)
    exact = [n * w / total for w in weights]
    shares = [int(e) for e in exact]
    order = sorted(range(len(weights)), key=lambda i: (-(exact[i] - shares[i]), i))
    for i in order[: n - sum(shares)]:
        shares[i] += 1
    return shares


def _one_hot(n: int, pos: int | None) -> tuple[float, ...]:
    return tuple(1.0 if i == pos else 0.0 for i in range(n))


def _normalized(values: Sequence[float]) -> tuple[float, ...]:
    # Rounded before simulating, so the split we test is exactly the split llama.cpp is given.
    total = sum(values)
    return tuple(round(v / total, 4) for v in values) if total > 0 else tuple(0.0 for _ in values)


def _clamp_ngl(value: int | None, shape: ModelShape | None) -> int | None:
    if value is None or shape is None:
        return None
    if value < -1:
        raise ConfigError(f"n_gpu_layers must be -1 (all) or >= 0, got {value}")
    return shape.n_layers + 1 if value == -1 else min(value, shape.n_layers + 1)


@dataclass(frozen=True)
class _Request:
    budget: _Budget
    target: ModelShape
    draft: ModelShape | None
    type_k: str
    type_v: str
    n_ubatch: int
    ngl_target: int | None
    ngl_draft: int | None
    n_seq: int = 1  # sequences served at once (serve --parallel): each holds n_ctx tokens of KV

    @property
    def fastest(self) -> int | None:
        """Budget position of the local GPU with the most free memory: where the draft goes.
        Never an RPC device: the draft runs K times a round, each a network round trip there."""
        gpus = self.budget.gpus
        local = [i for i, g in enumerate(gpus) if not g.remote]
        return max(local, key=lambda i: (gpus[i].free_bytes, -i)) if local else None

    def place(self, n_ctx: int, type_k: str | None = None, type_v: str | None = None,
              with_draft: bool = True) -> _Joint:
        type_k, type_v = type_k or self.type_k, type_v or self.type_v
        remaining = list(self.budget.gpu)
        draft_fit, kv_draft = None, 0
        if self.draft is not None and with_draft:
            # The draft runs K times per round: it gets the roomiest local GPU, and gets it first.
            draft_fit, kv_draft = self._fit(self.draft, n_ctx, type_k, type_v, self.ngl_draft,
                                            _one_hot(len(remaining), self.fastest), remaining)
            remaining = [b - u for b, u in zip(remaining, draft_fit.gpu_used)]
        room = [max(0, b) for b in remaining]
        remote = [g.remote for g in self.budget.gpus]
        if self.ngl_target is not None:
            # An explicit layer count is spread over every device by its room, as llama.cpp does.
            fractions = _normalized(room) if any(room) else _normalized([g.free_bytes for g in self.budget.gpus])
            target_fit, kv_target = self._fit(self.target, n_ctx, type_k, type_v, self.ngl_target,
                                              fractions, remaining)
        else:
            target_fit, kv_target, fractions = self._fit_target(n_ctx, type_k, type_v, room, remote, remaining)
        return self._joint(n_ctx, target_fit, fractions, draft_fit, kv_target, kv_draft)

    def _fit_target(self, n_ctx: int, type_k: str, type_v: str, room: list[int], remote: list[bool],
                    budget: Sequence[int]) -> tuple[_Fit, int, tuple[float, ...]]:
        """Local GPUs first (split by room), then RPC devices for what they cannot hold, then CPU:
        a remote device costs a network round trip per layer boundary, the CPU costs compute."""
        local = _normalized([0 if r else b for b, r in zip(room, remote)])
        fit, kv = self._fit(self.target, n_ctx, type_k, type_v, None, local, budget)
        if not any(remote) or fit.k == self.target.n_layers + 1:
            return fit, kv, local
        kv_layer = kv_layer_bytes(self.target, n_ctx * self.n_seq, type_k, type_v)
        units, compute = _units(self.target, kv_layer), compute_bytes(self.target, self.n_ubatch)
        away = [b if r else 0 for b, r in zip(room, remote)]
        if not any(away):
            return fit, kv, local
        here = _unit_counts(len(units), fit.k, local)
        for extra in range(len(units) - fit.k, 0, -1):
            # llama.cpp hands out the offloaded units in device order (RPC devices come first).
            # Whole unit counts as the split keep its float32 arithmetic and ours in step.
            there = _shares(extra, away)
            fractions = tuple(float(a + b) for a, b in zip(there, here))
            trial = _usage(self.target, units, fit.k + extra, fractions, compute)
            if all(u <= b for u, b in zip(trial.gpu_used, budget)):
                return trial, kv, fractions
        return fit, kv, local

    def _fit(self, shape: ModelShape, n_ctx: int, type_k: str, type_v: str, ngl: int | None,
             fractions: tuple[float, ...], budget: Sequence[int]) -> tuple[_Fit, int]:
        kv_layer = kv_layer_bytes(shape, n_ctx * self.n_seq, type_k, type_v)
        units = _units(shape, kv_layer)
        compute = compute_bytes(shape, self.n_ubatch)
        if ngl is not None and any(fractions):
            fit = _usage(shape, units, ngl, fractions, compute)
        else:
            fit = _best_fit(shape, units, fractions, budget, compute)
        return fit, kv_layer * shape.n_layers

    def _joint(self, n_ctx: int, target: _Fit, fractions: tuple[float, ...], draft: _Fit | None,
               kv_target: int, kv_draft: int) -> _Joint:
        gpu_used = [t + (draft.gpu_used[i] if draft else 0) for i, t in enumerate(target.gpu_used)]
        cpu_used = target.cpu_used + (draft.cpu_used if draft else 0)
        ram = self.budget.ram - _shared(self.budget, gpu_used)
        return _Joint(
            n_ctx=n_ctx, target=target, target_fractions=fractions, draft=draft,
            draft_gpu=self.fastest, feasible=cpu_used <= ram,
            gpu_overcommitted=any(u > b for u, b in zip(gpu_used, self.budget.gpu)),
            need=cpu_used + sum(gpu_used), kv_target=kv_target, kv_draft=kv_draft,
        )


# --- context choice ------------------------------------------------------------------------


def _auto_contexts(target: ModelShape) -> list[int]:
    """Start at min(8192, trained context), then powers of two down to 2048."""
    start = min(DEFAULT_CTX, target.n_ctx_train)
    contexts = [start]
    c = 1 << (start.bit_length() - 1)
    if c == start:
        c //= 2
    while c >= MIN_AUTO_CTX:
        contexts.append(c)
        c //= 2
    return contexts


def _preference(j: _Joint) -> tuple:
    # Feasible first; then keep the draft on the GPU (it runs K times a round); then as many
    # target layers on the GPU as possible; only then a longer context. Among refusals, the
    # smallest need is the one worth reporting.
    if not j.feasible:
        return (False, 0, 0, -j.need)
    return (True, j.draft.k if j.draft else 0, j.target.k, j.n_ctx)


# --- public entry point --------------------------------------------------------------------


def make_plan(hw: HardwareInfo, target: ModelShape, draft: ModelShape | None = None, *,
              n_ctx: int | None = None, type_k: str = "f16", type_v: str = "f16",
              n_gpu_layers: int | None = None, n_gpu_layers_draft: int | None = None,
              threads: int | None = None, threads_draft: int | None = None,
              n_batch: int = DEFAULT_BATCH, n_ubatch: int = DEFAULT_UBATCH,
              gpu_memory: int | None = None, n_seq: int = 1) -> Plan:
    """Place target (and draft) on hw. n_ctx=None lets the planner pick (and shrink) the
    context; n_gpu_layers* = -1 means all layers; gpu_memory (bytes) caps what the plan puts
    on each local GPU. Raises PlanError when the pair cannot fit."""
    _check_requests(n_ctx, type_k, type_v, threads, threads_draft, n_batch, n_ubatch)
    if gpu_memory is not None and gpu_memory < 0:
        raise ConfigError(f"--gpu-memory must be >= 0, got {gpu_memory}")
    budget = _budget(hw, gpu_memory)
    warnings = _offload_warnings(hw)
    ngl_t, ngl_d = _clamp_ngl(n_gpu_layers, target), _clamp_ngl(n_gpu_layers_draft, draft)
    if not budget.gpus and (ngl_t or ngl_d):
        warnings.append("GPU layer counts ignored: this machine/build has no GPU offload")
        ngl_t = ngl_d = None
    request = _Request(budget, target, draft, type_k, type_v, n_ubatch, ngl_t, ngl_d, n_seq)

    contexts = [n_ctx] if n_ctx is not None else _auto_contexts(target)
    best = max((request.place(c) for c in contexts), key=_preference)
    if not best.feasible:
        raise PlanError(_refusal(request, best, fixed_ctx=n_ctx is not None))

    warnings += _context_warnings(best, contexts[0], target, draft, n_ctx is not None)
    over_cap = _over_cap(request, best, gpu_memory) if best.gpu_overcommitted and gpu_memory is not None else None
    if over_cap:
        # Explicit layer counts against an explicit cap: the user asked for both; say which gives.
        raise PlanError(over_cap)
    if best.gpu_overcommitted:
        warnings.append("the requested GPU layer counts exceed the estimated free GPU memory; loading may fail")
    return _assemble(hw, request, best, n_batch, threads, threads_draft, warnings)


def _offload_warnings(hw: HardwareInfo) -> list[str]:
    local = [g for g in hw.gpus if not g.remote]
    if local and not hw.gpu_offload_supported:
        return [
            f"llama.cpp was built without GPU offload, so {local[0].name} is unused; "
            "reinstall llama-cpp-python with GPU support to use it"
        ]
    return []


def _check_requests(n_ctx: int | None, type_k: str, type_v: str, threads: int | None,
                    threads_draft: int | None, n_batch: int, n_ubatch: int) -> None:
    kv_bytes_per_elem(type_k)
    kv_bytes_per_elem(type_v)
    if n_ctx is not None and n_ctx < 64:
        raise ConfigError(f"context size must be at least 64 tokens, got {n_ctx}")
    for name, value in (("threads", threads), ("threads_draft", threads_draft)):
        if value is not None and value < 1:
            raise ConfigError(f"{name} must be >= 1, got {value}")
    if n_ubatch < 1 or n_batch < n_ubatch:
        raise ConfigError(f"need 1 <= n_ubatch ({n_ubatch}) <= n_batch ({n_batch})")


def _context_warnings(best: _Joint, wanted: int, target: ModelShape, draft: ModelShape | None,
                      fixed: bool) -> list[str]:
    warnings = []
    if best.n_ctx < wanted:
        warnings.append(
            f"context reduced from {wanted} to {best.n_ctx} tokens so that more of the models "
            "stay on the GPU; set the context size explicitly to override"
        )
    for shape in (target, draft):
        if fixed and shape is not None and best.n_ctx > shape.n_ctx_train:
            warnings.append(
                f"context {best.n_ctx} exceeds {shape.name}'s trained context of {shape.n_ctx_train}; "
                "output quality may degrade past it"
            )
    return warnings


# --- refusal -------------------------------------------------------------------------------


def _over_cap(request: _Request, best: _Joint, cap: int) -> str | None:
    """The refusal when explicit layer counts overrun --gpu-memory on a local GPU; None when no
    capped device is overrun (free memory alone being short stays a warning, as without a cap)."""
    budget = request.budget
    used = [t + (best.draft.gpu_used[i] if best.draft else 0) for i, t in enumerate(best.target.gpu_used)]
    over = [i for i, (g, u, b) in enumerate(zip(budget.gpus, used, budget.gpu))
            if u > b and not g.remote and b == cap]
    if not over:
        return None
    i = over[0]
    parts = []
    for fit, flag, asked, what in ((best.target, "-ngl", request.ngl_target, "target"),
                                   (best.draft, "-ngld", request.ngl_draft, "draft")):
        if fit is not None and fit.gpu_used[i]:
            parts.append(f"{flag} {fit.k}" if asked is not None else f"the {what}'s {fit.k} planned GPU layers")
    layers = " and ".join(parts)
    return (f"{layers} need ~{used[i] / MiB:.0f} MiB on {budget.gpus[i].label} but --gpu-memory allows "
            f"{cap / MiB:.0f} MiB there; lower the layer counts or raise --gpu-memory "
            "(or drop -ngl/-ngld and let the plan fit them)")


def _gib(n: float) -> str:
    return f"{n / GiB:.1f} GiB"


def _shared(budget: _Budget, gpu_used: Sequence[int]) -> int:
    """What unified-memory GPUs take out of RAM (one pool; RPC devices are other machines')."""
    if not budget.unified:
        return 0
    return sum(u for g, u in zip(budget.gpus, gpu_used) if not g.remote)


def _usable(budget: _Budget) -> int:
    return budget.ram + sum(budget.gpu) - _shared(budget, budget.gpu)


def _refusal(request: _Request, best: _Joint, fixed_ctx: bool) -> str:
    budget, target, draft = request.budget, request.target, request.draft
    pair = f"{target.name} + {draft.name} need" if draft else f"{target.name} needs"
    away = sum(b for g, b in zip(budget.gpus, budget.gpu) if g.remote)
    local = sum(budget.gpu) - away
    where = f"{_gib(budget.ram)} of RAM" + (
        f" and {_gib(local)} of GPU memory" if local and not budget.unified else ""
    ) + (f" and {_gib(away)} on RPC servers" if away else "")
    slots = f" x {request.n_seq} parallel sequences" if request.n_seq > 1 else ""
    head = f"{pair} ~{_gib(best.need)} at context {best.n_ctx}{slots} but only {where} is usable"
    return f"{head}; try {' or '.join(_alternatives(request, best, fixed_ctx))}"


def _alternatives(request: _Request, best: _Joint, fixed_ctx: bool) -> list[str]:
    options: list[str] = []
    if fixed_ctx:
        c = 1 << (best.n_ctx.bit_length() - 1)
        c = c // 2 if c == best.n_ctx else c
        while c >= MIN_AUTO_CTX and not request.place(c).feasible:
            c //= 2
        if c >= MIN_AUTO_CTX:
            options.append(f"a context of {c} tokens")
    current = min(kv_bytes_per_elem(request.type_k), kv_bytes_per_elem(request.type_v))
    for kv in ("q8_0", "q4_0"):
        if kv_bytes_per_elem(kv) < current and request.place(best.n_ctx, kv, kv).feasible:
            options.append(f"KV cache type {kv}")
            break
    if request.draft is not None and request.place(best.n_ctx, with_draft=False).feasible:
        options.append(f"running {request.target.name} without the draft model")
    if request.n_seq > 1:
        options.append("fewer parallel sequences (--parallel, or serve's --prompt-cache)")
    options.append(_smaller_quant(request.target, best, _usable(request.budget)))
    return options


def _smaller_quant(target: ModelShape, best: _Joint, usable: int) -> str:
    others = best.need - target.weight_bytes  # KV, compute buffers, the draft
    if target.n_params:
        q4 = int(target.n_params * Q4_K_M_BITS / 8)
        if q4 < target.weight_bytes:
            return f"a Q4_K_M of {target.name} (needs ~{_gib(q4 + others)} in all at this context)"
    room = usable - others
    if room <= 0:
        return "a machine with more memory (the KV cache and buffers alone do not fit)"
    return f"a smaller quant of {target.name} whose weights are under ~{_gib(room)}"


# --- assembling the result -----------------------------------------------------------------


def _placement(shape: ModelShape, fit: _Fit, budget: _Budget, fractions: Sequence[float],
               main_gpu: int, kv: int, threads: int) -> ModelPlacement:
    gpu_bytes = {g.label: used for g, used in zip(budget.gpus, fit.gpu_used) if used}
    used_gpus = [i for i, used in enumerate(fit.gpu_used) if used]
    # With one GPU llama.cpp needs no split; with several it must get the exact split we tested.
    split = tuple(fractions) if len(budget.gpus) > 1 and fit.k else None
    main = budget.gpus[used_gpus[0]].index if len(used_gpus) == 1 else main_gpu
    return ModelPlacement(
        model=shape.name, n_gpu_layers=fit.k, main_gpu=main, tensor_split=split,
        gpu_bytes=gpu_bytes, cpu_bytes=fit.cpu_used, kv_bytes=kv, threads=threads,
    )


def _assemble(hw: HardwareInfo, request: _Request, best: _Joint, n_batch: int,
              threads: int | None, threads_draft: int | None, warnings: list[str]) -> Plan:
    budget, draft = request.budget, request.draft
    main_gpu = budget.gpus[best.draft_gpu].index if best.draft_gpu is not None else 0
    t_threads = threads or hw.physical_cores
    target_p = _placement(request.target, best.target, budget, best.target_fractions, main_gpu,
                          best.kv_target, t_threads)
    draft_p = None
    if draft is not None and best.draft is not None:
        on_gpu = best.draft.k == draft.n_layers + 1
        d_threads = threads_draft or (min(DRAFT_GPU_THREADS, hw.physical_cores) if on_gpu else t_threads)
        fractions = _one_hot(len(budget.gpus), best.draft_gpu)
        draft_p = _placement(draft, best.draft, budget, fractions, main_gpu, best.kv_draft, d_threads)
    return Plan(
        target=target_p, draft=draft_p, n_ctx=best.n_ctx, type_k=request.type_k,
        type_v=request.type_v, n_batch=n_batch, n_ubatch=request.n_ubatch,
        devices=_device_uses(hw, budget, best), warnings=tuple(warnings), n_seq=request.n_seq,
    )


def _device_uses(hw: HardwareInfo, budget: _Budget, best: _Joint) -> tuple[DeviceUse, ...]:
    uses = []
    for i, gpu in enumerate(budget.gpus):
        used = best.target.gpu_used[i] + (best.draft.gpu_used[i] if best.draft else 0)
        uses.append(DeviceUse(gpu.label, gpu.total_bytes, used, gpu.free_bytes - used))
    cpu_used = best.target.cpu_used + (best.draft.cpu_used if best.draft else 0)
    shared = _shared(budget, [u.used for u in uses])  # one pool: a unified GPU's share comes out of RAM
    uses.append(DeviceUse(CPU, hw.ram_total, cpu_used, hw.ram_available - cpu_used - shared))
    return tuple(uses)
