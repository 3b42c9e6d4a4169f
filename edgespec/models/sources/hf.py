"""The Hugging Face source: registry models and `hf:OWNER/REPO/FILE` references, through the
hub's own cache (HF_HUB_OFFLINE is honoured: then only the cache is read)."""

from __future__ import annotations

import inspect
import os
import socket
from pathlib import Path
from urllib.parse import urlsplit

from edgespec.errors import DownloadError, ModelNotFoundError
from edgespec.gguf import read_gguf

from ...progress import Progress
from ..registry import ModelEntry
from ..store import SourceFailed, _hash_file, _place_from
from .found import Found, StoreScan

def _fetch_hf(entry: ModelEntry, progress: Progress) -> None:
    path = _hf_download(entry.hf.repo, entry.hf.file, progress)
    if path.stat().st_size != entry.size:
        raise SourceFailed(
            f"size mismatch: expected {entry.size} bytes, got {path.stat().st_size}"
        )
    digest = _hash_file(path, f"verifying {entry.name}", progress)
    if digest != entry.sha256:
        raise SourceFailed(f"sha256 mismatch: expected {entry.sha256}, got {digest}")
    _place_from(path, entry, progress)


def _from_hf_cache_only(entry: ModelEntry, progress: Progress) -> bool:
    path = _hf_cached(entry.hf.repo, entry.hf.file)
    if path is None or path.stat().st_size != entry.size:
        return False
    if _hash_file(path, f"verifying {entry.name}", progress) != entry.sha256:
        return False
    try:
        _place_from(path, entry, progress)
    except SourceFailed:
        return False
    return True



def _hf_download(repo: str, file: str, progress: Progress) -> Path:
    """The file from the HF cache, or downloaded into it. SourceFailed with a short reason."""
    cached = _hf_cached(repo, file)
    if cached is not None:
        return cached
    if _hf_offline():
        raise SourceFailed("offline (HF_HUB_OFFLINE) and not in the Hugging Face cache")
    unreachable = _hf_unreachable()
    if unreachable:
        raise SourceFailed(unreachable)
    hub = _import_hub()
    kwargs = {}
    if _accepts(hub.hf_hub_download, "tqdm_class"):  # huggingface_hub >= 0.27 or so
        kwargs["tqdm_class"] = _hf_bar_class(progress, f"downloading {file}")
    try:
        return Path(hub.hf_hub_download(repo_id=repo, filename=file, **kwargs))
    except Exception as err:  # the hub raises many unrelated types; each becomes a reason
        raise SourceFailed(_hf_reason(err)) from None


def _accepts(func, name: str) -> bool:
    try:
        params = inspect.signature(func).parameters
    except (TypeError, ValueError):
        return False
    return name in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


def _hf_cached(repo: str, file: str) -> Path | None:
    try:
        hub = _import_hub()
        return Path(hub.hf_hub_download(repo_id=repo, filename=file, local_files_only=True))
    except Exception:  # not cached, or the hub is unusable: either way, not from here
        return None


def _import_hub():
    try:
        import huggingface_hub
    except ImportError:
        raise SourceFailed("huggingface_hub is not installed") from None
    return huggingface_hub


def _hf_offline() -> bool:
    value = os.environ.get("HF_HUB_OFFLINE", "").strip().lower()
    return value in ("1", "true", "yes", "on")


def _hf_unreachable() -> str | None:
    """A reason when the hub cannot be reached, found in seconds rather than the hub's retries."""
    if any(os.environ.get(k) for k in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return None  # only the proxy knows; let the hub try
    url = urlsplit(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        socket.create_connection((url.hostname, port), timeout=5).close()
    except OSError as err:
        return f"network unreachable ({url.hostname}: {err.strerror or err})"
    return None


def _hf_reason(err: Exception) -> str:
    kind = type(err).__name__
    status = getattr(getattr(err, "response", None), "status_code", None)
    if kind in ("RepositoryNotFoundError", "GatedRepoError"):
        return "repository not found or gated"
    if kind in ("EntryNotFoundError", "RemoteEntryNotFoundError"):
        return "file not found in the repository"
    if kind == "LocalEntryNotFoundError":
        return "network unreachable"
    if status:
        return f"HTTP {status}"
    first_line = (str(err).strip().splitlines() or [""])[0]
    return f"{kind}: {first_line}"[:200]


def _hf_bar_class(progress: Progress, task: str):
    """A tqdm look-alike the hub drives; it forwards to our progress protocol.

    Deliberately not a tqdm subclass: the hub then leaves display entirely to us.
    Unknown methods (postfix, refresh, ...) are accepted and ignored.
    """

    class _Bar:
        format_dict: dict = {}

        def __init__(self, *args, total=None, initial=0, **kwargs):
            self.total, self.n, self.disable, self._open = total, initial, False, True
            progress.start(task, total)
            if initial:
                progress.advance(initial)

        def update(self, n=1):
            if n:
                self.n += n
                progress.advance(n)

        def update_transfer(self, n=1):  # network bytes; `update` already counts the file
            pass

        def close(self):
            if self._open:
                self._open = False
                progress.done()

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.close()

        def __getattr__(self, name):
            if name.startswith("__"):
                raise AttributeError(name)
            return lambda *a, **k: None

    return _Bar


def _resolve_hf_ref(ref: str, progress: Progress, allow_download: bool) -> Path:
    parts = ref[3:].split("/", 2)
    if len(parts) != 3 or not all(parts):
        raise ModelNotFoundError(f"bad reference {ref!r}: expected hf:OWNER/REPO/FILE")
    repo, file = "/".join(parts[:2]), parts[2]
    try:
        if allow_download:
            path = _hf_download(repo, file, progress)
        else:
            path = _hf_cached(repo, file)
            if path is None:
                raise SourceFailed("not in the Hugging Face cache and downloads are off")
    except SourceFailed as err:
        raise DownloadError(f"could not fetch {ref}: huggingface: {err}") from None
    read_gguf(path)
    return path



# -- the hub's cache, scanned -------------------------------------------------------------------


def cache_root() -> Path:
    """The hub's cache folder (HF_HUB_CACHE, or HF_HOME/hub, as the hub itself reads them)."""
    _import_hub()
    from huggingface_hub import constants  # a submodule the package does not load by itself

    return Path(constants.HF_HUB_CACHE)


def scan() -> list[StoreScan]:
    """The GGUF files in the hub's cache, by `hf:OWNER/REPO/FILE`; the newest revision of a file
    wins. Reads the folder only (no network, so HF_HUB_OFFLINE makes no difference)."""
    try:
        hub = _import_hub()
        root = cache_root()
    except SourceFailed:
        return []
    if not root.exists():
        return []
    try:
        info = hub.scan_cache_dir(root)
    except Exception as err:  # CacheNotFound, or an unreadable folder
        return [StoreScan("huggingface", root, (), (f"{root}: cannot scan the Hugging Face cache ({err})",))]
    newest: dict[tuple[str, str], tuple[float, Path]] = {}
    for repo in info.repos:
        if repo.repo_type != "model":
            continue
        for revision in repo.revisions:
            for f in revision.files:
                if not f.file_name.lower().endswith(".gguf"):
                    continue
                key = (repo.repo_id, f.file_path.relative_to(revision.snapshot_path).as_posix())
                if key not in newest or revision.last_modified > newest[key][0]:
                    newest[key] = (revision.last_modified, f.file_path)
    found = tuple(Found(f"hf:{repo}/{file}", path, "huggingface")
                  for (repo, file), (_, path) in sorted(newest.items()))
    warnings = tuple(f"{root}: {str(w).splitlines()[0]}" for w in info.warnings)
    return [StoreScan("huggingface", root, found, warnings)]
