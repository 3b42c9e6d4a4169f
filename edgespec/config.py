"""Frozen run configuration, validated at construction with messages that name the flag."""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING

from .errors import ConfigError, InputError

if TYPE_CHECKING:  # the cost model's home imports timing; config stays a leaf module
    from .costs import CostModel


class Mode(str, Enum):
    """`--spec`: where drafts may come from. A str, so `mode == "auto"` holds for Mode.AUTO."""

    AUTO = "auto"  # the controller picks the drafter (or none) by measured cost, and switches
    DRAFT = "draft"  # the draft model only
    NGRAM = "ngram"  # the copy-following n-gram drafter only (no second model)
    COMBINED = "combined"  # the n-gram drafter first, the draft model when it has nothing
    OFF = "off"  # plain decoding

    def __str__(self) -> str:  # "auto", not "Mode.AUTO", in messages and f-strings
        return self.value

    __format__ = str.__format__

    @property
    def uses_ngram(self) -> bool:
        return self in (Mode.NGRAM, Mode.COMBINED, Mode.AUTO)

    @property
    def uses_draft_model(self) -> bool:
        """Whether a loaded draft model is used (so whether one is worth loading)."""
        return self in (Mode.DRAFT, Mode.COMBINED, Mode.AUTO)

    @property
    def needs_draft_model(self) -> bool:
        """Meaningless without a draft model: draft cannot run, combined would be ngram again
        (auto just drafts with the n-gram drafter alone)."""
        return self in (Mode.DRAFT, Mode.COMBINED)

    @property
    def adaptive(self) -> bool:
        """The controller may decide not to draft at all (a forced mode always drafts)."""
        return self is Mode.AUTO


SPEC_MODES = tuple(m.value for m in Mode)


@dataclass(frozen=True)
class KVCacheType:
    ggml_type: int  # enum ggml_type (ggml.h): what llama_context_params.type_k/type_v take
    bytes_per_elem: float  # a ggml block's bytes over its elements (q8_0: 34 bytes per 32)


# The KV cache types llama.cpp accepts for -ctk/-ctv (common/arg.cpp `kv_cache_types`, in that
# vendored llama.cpp), keyed by the names it takes; the one list the flags, the plan and the
# backend use.
KV_CACHE_TYPES: dict[str, KVCacheType] = {
    "f32": KVCacheType(0, 4.0),
    "f16": KVCacheType(1, 2.0),
    "bf16": KVCacheType(30, 2.0),
    "q8_0": KVCacheType(8, 34 / 32),
    "q4_0": KVCacheType(2, 18 / 32),
    "q4_1": KVCacheType(3, 20 / 32),
    "iq4_nl": KVCacheType(20, 18 / 32),
    "q5_0": KVCacheType(6, 22 / 32),
    "q5_1": KVCacheType(7, 24 / 32),
}
KV_TYPES = tuple(KV_CACHE_TYPES)

# The most tokens one round may draft (--draft-max's ceiling). `edgespec profile` times verify
# batches up to 64 rows (measure.KS_FAST), so a longer draft would be chosen on extrapolated
# costs; and a round can expect at most 1/(1 - alpha) tokens, 50 even at alpha = 0.98.
MAX_DRAFT = 64
# --draft-max without a profile: the prior cost model is a guess, so drafts stay at a length
# whose verify batch costs little even where that guess is wrong.
DEFAULT_DRAFT_MAX = 16


_ENDPOINT = re.compile(r"^(?P<host>[A-Za-z0-9][A-Za-z0-9.\-]*):(?P<port>\d{1,5})$")
MAX_RPC_SERVERS = 16  # GGML_RPC_MAX_SERVERS
MAX_PARALLEL = 64  # slots generating at once: past this, each step's bookkeeping dominates
MAX_SEQUENCES = 2 * MAX_PARALLEL  # slots plus serve's prompt cache beside them, in one context (llama.cpp allows 256)


def parse_rpc(text: str | None) -> tuple[str, ...]:
    """`--rpc host:port[,host:port...]` as llama.cpp takes it; '' or None is no servers."""
    if not text or not text.strip():
        return ()
    servers = tuple(s.strip() for s in text.split(","))
    for server in servers:
        match = _ENDPOINT.match(server)
        _require(match is not None, f"--rpc takes host:port[,host:port...] (bad: {server!r})")
        port = int(match.group("port"))
        _require(1 <= port <= 65535, f"--rpc: port {port} of {server!r} must be in 1..65535")
    _require(len(set(servers)) == len(servers), f"--rpc names a server twice: {text!r}")
    _require(len(servers) <= MAX_RPC_SERVERS, f"--rpc takes at most {MAX_RPC_SERVERS} servers (got {len(servers)})")
    return servers


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


def require_at_least_one(flag: str, value: int | None) -> None:
    """The library's own guard for a count its callers pass (the CLI's Click types refuse it first,
    with the same words): an InputError, as for any unusable input to a generation."""
    if value is not None and value < 1:
        raise InputError(f"{flag} must be >= 1 (got {value})")


@dataclass(frozen=True)
class SpecConfig:
    mode: Mode = Mode.AUTO  # a plain string is accepted and converted
    draft_min: int = 1
    draft_max: int | None = None  # None: DraftLimits decides from the profile
    draft_p_min: float = 0.5
    ngram_min: int = 1
    ngram_max: int = 4

    def __post_init__(self):
        _require(self.mode in SPEC_MODES, f"--spec must be one of {', '.join(SPEC_MODES)} (got {self.mode!r})")
        object.__setattr__(self, "mode", Mode(self.mode))
        _require(self.draft_min >= 1, f"--draft-min must be >= 1 (got {self.draft_min})")
        if self.draft_max is not None:
            _require(self.draft_max >= self.draft_min, f"--draft-max ({self.draft_max}) must be >= --draft-min ({self.draft_min})")
            _require(self.draft_max <= MAX_DRAFT, f"--draft-max must be <= {MAX_DRAFT} (got {self.draft_max})")
        _require(0.0 <= self.draft_p_min < 1.0, f"--draft-p-min must be in [0, 1) (got {self.draft_p_min})")
        _require(1 <= self.ngram_min <= self.ngram_max <= 16, "n-gram sizes need 1 <= min <= max <= 16")

    @property
    def uses_draft_model(self) -> bool:
        return self.mode.uses_draft_model


@dataclass(frozen=True)
class DraftLimits:
    """How long one round's draft may be, decided once per engine and shared by the controller (the
    lengths it compares) and the decoder (the cap it gives the drafters)."""

    draft_min: int
    draft_max: int

    def __post_init__(self):
        _require(1 <= self.draft_min <= self.draft_max <= MAX_DRAFT,
                 f"draft lengths need 1 <= min <= max <= {MAX_DRAFT} (got {self.draft_min}, {self.draft_max})")

    @classmethod
    def of(cls, spec: SpecConfig, cost: "CostModel | None") -> "DraftLimits":
        """--draft-max if given, else as far as the profile measured verify batches (a batch holds
        the drafts plus one token: beyond it the cost model only extrapolates), else
        DEFAULT_DRAFT_MAX; never below --draft-min."""
        measured = [k for k in (cost.verify if cost else {}) if k > 1]
        default = max(1, min(MAX_DRAFT, max(measured) - 1)) if measured else DEFAULT_DRAFT_MAX
        return cls(spec.draft_min, max(spec.draft_max or default, spec.draft_min))


@dataclass(frozen=True)
class LoadConfig:
    """How to load the target and draft; None means 'let the plan decide'."""

    target: str
    draft: str | None = None
    n_ctx: int | None = None
    threads: int | None = None
    threads_draft: int | None = None
    n_gpu_layers: int | None = None
    n_gpu_layers_draft: int | None = None
    type_k: str = "f16"
    type_v: str = "f16"
    rpc: tuple[str, ...] = ()  # llama.cpp RPC servers whose devices join the plan
    gpu_memory: int | None = None  # bytes: --gpu-memory, the most the plan may put on each local GPU
    n_seq: int = 1  # sequences decoded together (serve --parallel), each with its own n_ctx of KV

    def __post_init__(self):
        _require(bool(self.target), "no target model: pass -m/--model or --pair")
        _require(parse_rpc(",".join(self.rpc)) == tuple(self.rpc), f"bad --rpc servers {self.rpc!r}")
        _require(self.n_ctx is None or 64 <= self.n_ctx <= 1 << 20, f"-c/--ctx-size must be in [64, 1048576] (got {self.n_ctx})")
        for flag, value in (("-t/--threads", self.threads), ("-td/--threads-draft", self.threads_draft)):
            _require(value is None or 1 <= value <= 1024, f"{flag} must be >= 1 (got {value})")
        for flag, value in (("-ngl", self.n_gpu_layers), ("-ngld", self.n_gpu_layers_draft)):
            _require(value is None or value >= 0, f"{flag} must be >= 0 (got {value})")
        _require(1 <= self.n_seq <= MAX_SEQUENCES,
                 f"--parallel plus --prompt-cache must be in 1..{MAX_SEQUENCES} (got {self.n_seq})")
        _require(self.gpu_memory is None or 0 <= self.gpu_memory <= 1 << 50,
                 f"--gpu-memory must be a size >= 0 such as 1.5G or 800M (got {self.gpu_memory} bytes)")
        for flag, value in (("-ctk", self.type_k), ("-ctv", self.type_v)):
            _require(value in KV_TYPES, f"{flag} must be one of {', '.join(KV_TYPES)} (got {value!r})")
