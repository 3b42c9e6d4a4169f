"""The model cache ($EDGESPEC_HOME/models): what in it can be trusted, one fetcher at a time, and
installing a file into it.

Whatever the source, the bytes are checked against the registry's size and sha256 before they
enter the cache, and they enter it by an atomic rename: the cache never holds a file it should
not trust. A verified file is recorded by a sidecar NAME.gguf.sha256.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO, Callable

from filelock import FileLock, Timeout

from edgespec import paths
from edgespec.paths import models_dir

from ..progress import NullProgress, Progress
from .registry import ModelEntry, _warn

CHUNK = 4 << 20


class SourceFailed(Exception):
    """One source could not deliver; the message is a short reason."""

def cached_path(entry: ModelEntry) -> Path:
    return models_dir() / f"{entry.name}.gguf"


def _sidecar(entry: ModelEntry) -> Path:
    return models_dir() / f"{entry.name}.gguf.sha256"


def is_cached(entry: ModelEntry) -> bool:
    """In the cache with the right size and a sidecar saying it was verified since it last changed.

    Hashing a gigabyte at every start is too slow, so the record is trusted while it is newer than
    the file; a file changed afterwards (edited or replaced in place) is hashed again.
    """
    path = cached_path(entry)
    try:
        stat = path.stat()
        if stat.st_size != entry.size:
            return False
        sidecar = _sidecar(entry)
        if sidecar.stat().st_mtime_ns < stat.st_mtime_ns:
            return False
        return sidecar.read_text().split()[:1] == [entry.sha256]
    except (OSError, UnicodeDecodeError):
        return False


def _write_sidecar(entry: ModelEntry) -> None:
    target = _sidecar(entry)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    tmp.write_text(f"{entry.sha256}  {entry.name}.gguf\n")
    os.replace(tmp, target)


def _adopt_existing(entry: ModelEntry, progress: Progress) -> bool:
    """A cache file without a valid sidecar (copied in by hand, or its record lost or damaged):
    trust it only if it hashes right. Either way one warning line says what happened to it."""
    path = cached_path(entry)
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return False
    except OSError as err:
        _warn(f"{path}: cannot read ({err.strerror or err}); not used")
        return False
    untrusted = "not trusted (a download replaces it: edgespec models pull " + entry.name + ")"
    try:
        if size != entry.size:
            _warn(f"{path}: {size} bytes, but the registry says {entry.size}; {untrusted}")
            return False
        if _hash_file(path, f"verifying {entry.name}", progress) != entry.sha256:
            _warn(f"{path}: its sha256 does not match the registry's; {untrusted}")
            return False
        _write_sidecar(entry)
    except OSError as err:  # unreadable, or a read-only cache: fetch as if it were absent
        _warn(f"{path}: cannot verify ({err.strerror or err}); not used")
        return False
    _warn(f"{path}: its sha256 record was missing, wrong or older than the file; the file hashed correctly and is kept")
    return True


def _hash_file(path: Path, task: str, progress: Progress) -> str:
    digest = hashlib.sha256()
    progress.start(task, path.stat().st_size)
    try:
        with open(path, "rb") as f:
            while chunk := f.read(CHUNK):
                digest.update(chunk)
                progress.advance(len(chunk))
    finally:
        progress.done()
    return digest.hexdigest()


@contextmanager
def _fetch_lock(entry: ModelEntry, progress: Progress):
    """One process at a time fetches a model; the others wait, then find it cached.

    The lock lives outside models/ (under $EDGESPEC_HOME/locks) so the cache holds only models and
    their sha256 records. Where no lock can be made (a read-only home) fetching goes on unlocked:
    each fetch still lands by an atomic rename of a verified file.
    """
    path = paths.home() / "locks" / f"{entry.name}.lock"
    lock = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        lock = FileLock(str(path))
        try:
            lock.acquire(timeout=0)
        except Timeout:
            progress.start(f"waiting for another edgespec process fetching {entry.name}", None)
            try:
                lock.acquire()
            finally:
                progress.done()
    except OSError:
        lock = None
    try:
        yield
    finally:
        if lock is not None:
            lock.release()



def _install(entry: ModelEntry, write: Callable[[BinaryIO], None]) -> None:
    """Run write() into a temp file beside the cache, verify it, then rename it into place.

    The temp file is removed on any failure, Ctrl-C included.
    """
    directory = models_dir()
    directory.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{entry.name}.", suffix=".part")
    try:
        with os.fdopen(fd, "wb") as out:
            write(out)
        os.chmod(tmp, 0o644)  # mkstemp makes it private; the cache is shared like any download
        _verify(entry, Path(tmp))
        os.replace(tmp, cached_path(entry))
        _write_sidecar(entry)
    except OSError as err:
        raise SourceFailed(f"could not write the cache: {err.strerror or err}") from None
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _verify(entry: ModelEntry, path: Path) -> None:
    size = path.stat().st_size
    if size != entry.size:
        raise SourceFailed(f"size mismatch: expected {entry.size} bytes, got {size}")
    digest = _hash_file(path, f"verifying {entry.name}", NullProgress())
    if digest != entry.sha256:
        raise SourceFailed(f"sha256 mismatch: expected {entry.sha256}, got {digest}")


def _copy(src: BinaryIO, out: BinaryIO, progress: Progress, limit: int) -> int:
    """Stream src into out; stop as soon as more than `limit` bytes arrive."""
    written = 0
    while chunk := src.read(CHUNK):
        written += len(chunk)
        if written > limit:
            raise SourceFailed(f"larger than the expected {limit} bytes")
        out.write(chunk)
        progress.advance(len(chunk))
    return written



def _place_from(src: Path, entry: ModelEntry, progress: Progress) -> None:
    """Put an already-verified file into the cache: a hard link when possible, else a copy."""

    def write(out: BinaryIO) -> None:
        progress.start(f"copying {entry.name} into the cache", entry.size)
        try:
            with open(src, "rb") as f:
                _copy(f, out, progress, entry.size)
        finally:
            progress.done()

    if not _try_link(src.resolve(), entry):
        _install(entry, write)


def _try_link(src: Path, entry: ModelEntry) -> bool:
    directory = models_dir()
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / f".{entry.name}.{os.getpid()}.link"
    try:
        os.link(src, tmp)
        os.replace(tmp, cached_path(entry))
        _write_sidecar(entry)
        return True
    except OSError:
        return False
    finally:
        if tmp.exists():
            tmp.unlink()

