"""LM Studio's models folder, read in place: `lmstudio:PUBLISHER/REPO[/FILE]` and what it holds.

The folder is $EDGESPEC_LMSTUDIO_MODELS when set (LM Studio lets its users move it), else
~/.lmstudio/models and the older ~/.cache/lm-studio/models; models live at
PUBLISHER/REPO/FILE.gguf. Vision projectors (mmproj-*.gguf) are not language models and are
left out.
"""

from __future__ import annotations

import os
from pathlib import Path

from edgespec.errors import ModelNotFoundError

from .found import Found, StoreScan

ENV = "EDGESPEC_LMSTUDIO_MODELS"


def roots() -> tuple[tuple[Path, bool], ...]:
    env = os.environ.get(ENV)
    if env:
        return tuple((Path(p).expanduser(), True) for p in env.split(os.pathsep) if p)
    home = Path.home()
    return ((home / ".lmstudio" / "models", False), (home / ".cache" / "lm-studio" / "models", False))


def _is_model(path: Path) -> bool:
    return path.suffix.lower() == ".gguf" and not path.name.lower().startswith("mmproj")


def resolve_ref(ref: str) -> Path:
    parts = ref.removeprefix("lmstudio:").split("/", 2)
    if len(parts) < 2 or not all(parts) or ".." in parts:
        raise ModelNotFoundError(f"bad reference {ref!r}: expected lmstudio:PUBLISHER/REPO[/FILE]")
    searched = []
    for root, _ in roots():
        folder = root / parts[0] / parts[1]
        searched.append(str(root))
        if len(parts) == 3:
            if (folder / parts[2]).is_file():
                return folder / parts[2]
            continue
        try:
            files = sorted(p for p in folder.iterdir() if p.is_file() and _is_model(p))
        except OSError:
            continue
        if len(files) == 1:
            return files[0]
        if files:
            names = ", ".join(p.name for p in files)
            raise ModelNotFoundError(f"{ref} holds {len(files)} GGUF files ({names}); name one: {ref}/FILE")
    raise ModelNotFoundError(f"{ref}: not found in LM Studio's models folder ({', '.join(searched)}; "
                             f"set {ENV} if LM Studio keeps them elsewhere)")


def scan() -> list[StoreScan]:
    return [_scan_root(root) for root, explicit in roots() if explicit or root.exists()]


def _scan_root(root: Path) -> StoreScan:
    if not root.is_dir():
        return StoreScan("lmstudio", root, (), (f"{root}: no such folder ({ENV})",))
    found, warnings = [], []
    try:
        publishers = sorted(p for p in root.iterdir() if p.is_dir())
    except OSError as err:
        return StoreScan("lmstudio", root, (), (f"{root}: cannot read ({err.strerror or err})",))
    for publisher in publishers:
        try:
            repos = sorted(p for p in publisher.iterdir() if p.is_dir())
            for repo in repos:
                for path in sorted(p for p in repo.iterdir() if p.is_file() and _is_model(p)):
                    ref = f"lmstudio:{publisher.name}/{repo.name}/{path.name}"
                    found.append(Found(ref, path, "lmstudio"))
        except OSError as err:
            warnings.append(f"{publisher}: cannot read ({err.strerror or err}); skipped")
    return StoreScan("lmstudio", root, tuple(found), tuple(warnings))
