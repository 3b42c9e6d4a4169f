"""The GGUF files already on this machine, found without loading anything.

Stores, in the order they are listed: the edgespec cache ($EDGESPEC_HOME/models), the Hugging
Face cache, LM Studio's models folder and Ollama's store (each module in sources/ says where it
looks and which environment variable moves it). Nothing is copied: a model is read where it is.
Each store or file that cannot be read costs one warning line and is skipped, never a crash.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from edgespec.errors import ModelFileError, ModelNotFoundError
from edgespec.gguf import GGUFInfo, VocabInfo, read_gguf
from edgespec.paths import models_dir

from .registry import Registry, _warn, load_registry
from .sources import hf, lmstudio, ollama
from .sources.found import Found, StoreScan


@dataclass(frozen=True)
class LocalModel:
    ref: str  # what to pass to -m/-md: a registry name, hf:..., lmstudio:..., ollama:...
    store: str
    path: Path
    name: str  # the model's own name (general.name), else the file's
    architecture: str
    quant: str
    size: int
    n_params: int
    vocab: str  # the vocabulary's fingerprint: equal fingerprints, identical vocabularies


def vocab_fingerprint(vocab: VocabInfo | None) -> str:
    """12 hex digits over the tokenizer type, every token's text and type: equal means identical."""
    if vocab is None:
        return "none"
    digest = hashlib.sha256(vocab.model.encode())
    digest.update(b"\0" + "\0".join(vocab.tokens).encode("utf-8", "surrogatepass"))
    digest.update(bytes(t & 0xFF for t in vocab.token_types or ()))
    return digest.hexdigest()[:12]


def edgespec_store(registry: Registry | None = None) -> StoreScan:
    """The edgespec cache: registry models by name, any other GGUF there by its path."""
    root = models_dir()
    if not root.is_dir():
        return StoreScan("edgespec", root, ())
    names = {f"{name}.gguf": name for name in (registry.models if registry else ())}
    try:
        files = sorted(p for p in root.iterdir() if p.suffix == ".gguf" and not p.name.startswith("."))
    except OSError as err:
        return StoreScan("edgespec", root, (), (f"{root}: cannot read ({err.strerror or err})",))
    return StoreScan("edgespec", root, tuple(Found(names.get(p.name, str(p)), p, "edgespec") for p in files))


def scan_stores(registry: Registry | None = None) -> list[StoreScan]:
    registry = registry or load_registry()
    return [edgespec_store(registry), *hf.scan(), *lmstudio.scan(), *ollama.scan()]


def describe(found: Found) -> tuple[LocalModel, GGUFInfo]:
    """Its header (vocabulary included); ModelFileError if it is not a usable GGUF."""
    info = read_gguf(found.path, vocab=True)
    model = LocalModel(
        ref=found.ref, store=found.store, path=found.path,
        name=info.name or found.path.stem, architecture=info.architecture, quant=info.quant,
        size=info.file_size, n_params=info.n_params, vocab=vocab_fingerprint(info.vocab),
    )
    return model, info


def local_models(registry: Registry | None = None) -> list[LocalModel]:
    """Every usable GGUF in every store; a store or file that cannot be read is one warning line."""
    return [model for model, _ in local_headers(registry)]


def local_headers(registry: Registry | None = None) -> list[tuple[LocalModel, GGUFInfo]]:
    out = []
    for scan in scan_stores(registry):
        for warning in scan.warnings:
            _warn(warning)
        for found in scan.found:
            try:
                out.append(describe(found))
            except (ModelFileError, ModelNotFoundError) as err:
                _warn(f"{err}; skipped")  # the error names the file
    return out
