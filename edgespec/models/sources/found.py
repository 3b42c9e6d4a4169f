"""What a scan of a local store finds: files, and one warning line per thing it could not read."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Found:
    ref: str  # how to name it on the command line, e.g. ollama:qwen2.5-coder:1.5b
    path: Path  # the GGUF file, where it lives (nothing is copied)
    store: str  # "edgespec", "huggingface", "lmstudio", "ollama"


@dataclass(frozen=True)
class StoreScan:
    store: str
    root: Path
    found: tuple[Found, ...]
    warnings: tuple[str, ...] = ()
