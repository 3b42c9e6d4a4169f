"""Ollama's model store, read in place: `ollama:NAME[:TAG]` and the models it holds.

The store ($OLLAMA_MODELS, else ~/.ollama/models, else the Linux service's
/usr/share/ollama/.ollama/models) keeps one JSON manifest per model tag under
manifests/HOST/NAMESPACE/NAME/TAG; the manifest's layer of media type
application/vnd.ollama.image.model names, by digest sha256:HEX, the blob blobs/sha256-HEX,
which is the GGUF file itself. Nothing is copied: the blob is read where it is.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from edgespec.errors import ModelNotFoundError

from .found import Found, StoreScan

MODEL_LAYER = "application/vnd.ollama.image.model"
DEFAULT_HOST = "registry.ollama.ai"
DEFAULT_NAMESPACE = "library"
DEFAULT_TAG = "latest"
_DIGEST = re.compile(r"^sha256[:-]([0-9a-f]{64})$")
_PART = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def roots() -> tuple[tuple[Path, bool], ...]:
    """(store root, set explicitly): OLLAMA_MODELS (Ollama's own setting) when set, else the defaults."""
    env = os.environ.get("OLLAMA_MODELS")
    if env:
        return ((Path(env).expanduser(), True),)
    return ((Path.home() / ".ollama" / "models", False),
            (Path("/usr/share/ollama/.ollama/models"), False))


def parse_ref(ref: str) -> tuple[str, str, str, str]:
    """`ollama:NAME[:TAG]` -> (host, namespace, name, tag). NAME is `name`, `user/name` or
    `host/namespace/name` (e.g. hf.co/OWNER/REPO, as `ollama pull hf.co/...` stores it)."""
    body = ref.removeprefix("ollama:")
    name, _, tag = body.rpartition(":") if ":" in body.split("/")[-1] else (body, "", DEFAULT_TAG)
    parts = name.split("/")
    if len(parts) == 1:
        parts = [DEFAULT_HOST, DEFAULT_NAMESPACE, *parts]
    elif len(parts) == 2:
        parts = [DEFAULT_HOST, *parts]
    if len(parts) < 3 or not tag or not all(_PART.match(p) for p in (*parts, tag)):
        raise ModelNotFoundError(f"bad reference {ref!r}: expected ollama:NAME[:TAG] (e.g. ollama:qwen2.5-coder:1.5b)")
    return parts[0], "/".join(parts[1:-1]), parts[-1], tag


def ref_of(host: str, namespace: str, name: str, tag: str) -> str:
    if host == DEFAULT_HOST and namespace == DEFAULT_NAMESPACE:
        short = name
    elif host == DEFAULT_HOST:
        short = f"{namespace}/{name}"
    else:
        short = f"{host}/{namespace}/{name}"
    return f"ollama:{short}:{tag}"


def model_blob(root: Path, manifest: Path) -> Path:
    """The GGUF blob a manifest names. ValueError (a short reason) when the manifest is unusable
    or its blob is absent (a pull that never finished)."""
    try:
        data = json.loads(manifest.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as err:
        raise ValueError(f"cannot read ({getattr(err, 'strerror', None) or err})") from None
    except json.JSONDecodeError as err:
        raise ValueError(f"not a JSON manifest ({err.msg})") from None
    layers = data.get("layers") if isinstance(data, dict) else None
    if not isinstance(layers, list):
        raise ValueError("manifest has no layers")
    digests = [layer.get("digest") for layer in layers
               if isinstance(layer, dict) and layer.get("mediaType") == MODEL_LAYER]
    if not digests:
        raise ValueError(f"manifest has no {MODEL_LAYER} layer")
    match = _DIGEST.match(str(digests[0]))
    if not match:
        raise ValueError(f"model layer digest {digests[0]!r} is not sha256:HEX")
    blob = root / "blobs" / f"sha256-{match.group(1)}"
    if not blob.is_file():
        raise ValueError(f"its model blob {blob.name} is missing (an unfinished pull?)")
    return blob


def resolve_ref(ref: str) -> Path:
    host, namespace, name, tag = parse_ref(ref)
    searched = []
    for root, _ in roots():
        manifest = root / "manifests" / host / namespace / name / tag
        if manifest.is_file():
            try:
                return model_blob(root, manifest)
            except ValueError as err:
                raise ModelNotFoundError(f"{ref}: {manifest}: {err}") from None
        searched.append(str(root))
    raise ModelNotFoundError(f"{ref}: no such Ollama model in {', '.join(searched)} "
                             f"(ollama pull {ref_of(host, namespace, name, tag).removeprefix('ollama:')})")


def scan() -> list[StoreScan]:
    return [_scan_root(root) for root, explicit in roots() if explicit or root.exists()]


def _scan_root(root: Path) -> StoreScan:
    manifests = root / "manifests"
    if not manifests.is_dir():
        return StoreScan("ollama", root, (), (f"{root}: not an Ollama store (no manifests/ folder)",))
    found, warnings = [], []
    try:
        files = sorted(p for p in manifests.rglob("*") if p.is_file())
    except OSError as err:
        return StoreScan("ollama", root, (), (f"{manifests}: cannot read ({err.strerror or err})",))
    for manifest in files:
        parts = manifest.relative_to(manifests).parts
        if len(parts) < 4:
            continue
        host, namespace, name, tag = parts[0], "/".join(parts[1:-2]), parts[-2], parts[-1]
        try:
            blob = model_blob(root, manifest)
        except ValueError as err:
            warnings.append(f"{manifest}: {err}; skipped")
            continue
        found.append(Found(ref_of(host, namespace, name, tag), blob, "ollama"))
    return StoreScan("ollama", root, tuple(found), tuple(warnings))
