"""The model registry: models.toml's schema, the built-in file, and the user's file merged over it."""

from __future__ import annotations

import difflib
import logging
import re
import string
import sys
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from edgespec import paths
from edgespec.errors import ConfigError, ModelNotFoundError

log = logging.getLogger("edgespec")

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]*$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_REQUIREMENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*==[A-Za-z0-9][A-Za-z0-9.+!_-]*$")


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
        return (Path(__file__).resolve().parents[2] / "models.toml").read_bytes()


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

