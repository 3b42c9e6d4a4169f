"""Frozen run configuration, validated at construction with messages that name the flag."""

from __future__ import annotations

import re
from dataclasses import dataclass

from .errors import ConfigError

SPEC_MODES = ("auto", "draft", "ngram", "combined", "off")
KV_TYPES = ("f16", "f32", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1")


_ENDPOINT = re.compile(r"^(?P<host>[A-Za-z0-9][A-Za-z0-9.\-]*):(?P<port>\d{1,5})$")
MAX_RPC_SERVERS = 16  # GGML_RPC_MAX_SERVERS
MAX_PARALLEL = 64  # sequences in one context: llama.cpp allows 256; past this, each step's bookkeeping dominates


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


@dataclass(frozen=True)
class SpecConfig:
    mode: str = "auto"
    draft_min: int = 1
    draft_max: int | None = None  # None: the longest verify batch the profile measured (16 without one)
    draft_p_min: float = 0.5
    ngram_min: int = 1
    ngram_max: int = 4

    def __post_init__(self):
        _require(self.mode in SPEC_MODES, f"--spec must be one of {', '.join(SPEC_MODES)} (got {self.mode!r})")
        _require(self.draft_min >= 1, f"--draft-min must be >= 1 (got {self.draft_min})")
        if self.draft_max is not None:
            _require(self.draft_max >= self.draft_min, f"--draft-max ({self.draft_max}) must be >= --draft-min ({self.draft_min})")
            _require(self.draft_max <= 64, f"--draft-max must be <= 64 (got {self.draft_max})")
        _require(0.0 <= self.draft_p_min < 1.0, f"--draft-p-min must be in [0, 1) (got {self.draft_p_min})")
        _require(1 <= self.ngram_min <= self.ngram_max <= 16, "n-gram sizes need 1 <= min <= max <= 16")

    @property
    def uses_draft_model(self) -> bool:
        return self.mode in ("auto", "draft", "combined")


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
        _require(1 <= self.n_seq <= MAX_PARALLEL, f"--parallel must be in 1..{MAX_PARALLEL} (got {self.n_seq})")
        _require(self.gpu_memory is None or 0 <= self.gpu_memory <= 1 << 50,
                 f"--gpu-memory must be a size >= 0 such as 1.5G or 800M (got {self.gpu_memory} bytes)")
        for flag, value in (("-ctk", self.type_k), ("-ctv", self.type_v)):
            _require(value in KV_TYPES, f"{flag} must be one of {', '.join(KV_TYPES)} (got {value!r})")
