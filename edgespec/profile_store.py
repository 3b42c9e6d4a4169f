"""Measured profiles on disk: one JSON file per (machine, target, draft), invalidated by upgrades.

A record is {"edgespec_version", "llama_cpp_version", "fingerprint", "created", "target",
"draft", "hardware", "data", "warnings"}; `data` is what the caller measured, untouched
(`edgespec profile` writes {"models", "plan", "measurements": {kernels: measurement}}).
A profile is only worth what the machine and the software it was measured with are worth, so a
change in either makes it stale. A damaged file is treated as absent, never as an error.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Sequence

import edgespec
from edgespec import paths
from edgespec.errors import EdgespecError
from edgespec.hardware import HardwareInfo


def profile_path(hw: HardwareInfo, target: str, draft: str | None) -> Path:
    key = json.dumps([hw.fingerprint(), target, draft]).encode()
    return paths.profiles_dir() / f"{hashlib.sha256(key).hexdigest()[:16]}.json"


def save_profile(data: dict[str, Any], *, hw: HardwareInfo, target_sha_or_name: str,
                 draft: str | None) -> Path:
    record = {
        "edgespec_version": edgespec.__version__,
        "llama_cpp_version": hw.llama_cpp_version,
        "fingerprint": hw.fingerprint(),
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "target": target_sha_or_name,
        "draft": draft,
        "hardware": hw.to_json(),
        "data": data,
    }
    path = profile_path(hw, target_sha_or_name, draft)
    _write_atomic(path, json.dumps(record, indent=2, sort_keys=True))
    return path


def _write_atomic(path: Path, text: str) -> None:
    # Write a sibling temp file and rename it over the old one, so that a crash or a concurrent
    # reader never sees half a profile.
    tmp_name = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", encoding="utf-8", dir=path.parent,
                                         prefix=f".{path.stem}.", suffix=".tmp", delete=False) as f:
            tmp_name = f.name
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp_name, path)
        tmp_name = None
    except OSError as err:
        raise EdgespecError(
            f"cannot write profile {path}: {err.strerror or err}; set EDGESPEC_HOME to a writable directory"
        ) from err
    finally:  # also on Ctrl-C or SIGTERM mid-write: no temp file is left behind
        if tmp_name is not None and os.path.exists(tmp_name):
            os.unlink(tmp_name)


def _read(path: Path) -> dict[str, Any] | None:
    """The record in path, or None when it is missing or damaged."""
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    if not isinstance(record, dict) or not isinstance(record.get("data"), dict):
        return None
    return record


def _is_current(record: dict[str, Any], hw: HardwareInfo, target: str, draft: str | None) -> bool:
    return (
        record.get("fingerprint") == hw.fingerprint()
        and record.get("edgespec_version") == edgespec.__version__
        and record.get("llama_cpp_version") == hw.llama_cpp_version
        and record.get("target") == target
        and record.get("draft") == draft
    )


def load_profile(hw: HardwareInfo, target: str, draft: str | None) -> dict[str, Any] | None:
    """The current record for this machine and pair; None if absent, damaged or stale."""
    path = profile_path(hw, target, draft)
    record = _read(path)
    if record is None and path.exists():
        logging.getLogger("edgespec").warning(
            f"ignored unreadable profile {path}; measure again to replace it (edgespec profile)")
    if record is None or not _is_current(record, hw, target, draft):
        return None
    return {**record, "warnings": []}


def latest_profile() -> dict[str, Any] | None:
    """The most recently created readable record (any machine, any pair), for `profile --show`.

    Damaged files are skipped and named in the record's "warnings"."""
    directory = paths.profiles_dir()
    if not directory.is_dir():
        return None
    best, warnings = None, []
    for path in sorted(directory.glob("*.json")):
        record = _read(path)
        if record is None:
            warnings.append(f"ignored unreadable profile {path}; measure again to replace it")
            continue
        if best is None or str(record.get("created", "")) > str(best.get("created", "")):
            best = record
    return None if best is None else {**best, "warnings": warnings}


# ---- measured costs, one table per kernel kind ----------------------------------------------------
# data["measurements"][kind] is everything one `edgespec profile` measured for that kind of kernels
# ("fast" or "exact"), its cost table included, stored once. A measurement carries "stable"; an
# unstable one is kept only to be shown (or used when saved with --force): runs prefer a stable one.

def saved_measurements(profile: dict | None) -> dict[str, dict]:
    """{kernels: measurement} of a saved profile record, also from records of older layouts
    (data["costs"] / data["cost"] + data["measurement"] + data["kernels"])."""
    data = (profile or {}).get("data", {})
    if not isinstance(data, dict):
        return {}
    if isinstance(data.get("measurements"), dict):
        return {k: dict(m) for k, m in data["measurements"].items() if isinstance(m, dict)}
    old_kind = data.get("kernels", "exact")
    full = data.get("measurement") if isinstance(data.get("measurement"), dict) else None
    if isinstance(data.get("costs"), dict):
        costs = data["costs"]
    elif "cost" in data:
        costs = {old_kind: data["cost"]}
    else:
        return {}
    return {kind: ({**full, "cost": cost} if full is not None and kind == old_kind else {"cost": cost})
            for kind, cost in costs.items()}


def usable(measurement: dict) -> bool:
    """A measurement runs may use: stable (records from before stability checks count as such) or forced."""
    return bool(measurement.get("stable", True) or measurement.get("forced"))


def saved_costs(profile: dict | None) -> dict:
    """{kernels: cost} of a saved profile record: the usable measurements' cost tables."""
    return {kind: m["cost"] for kind, m in saved_measurements(profile).items() if usable(m) and "cost" in m}


def merge_measurement(saved: dict | None, kind: str, new: dict, *, force: bool = False) -> tuple[dict[str, dict], str]:
    """The measurements to store after measuring `kind` anew, and what happened to the new one:

    "saved" (stable), "forced" (unstable, saved because --force), "kept" (unstable, and a usable
    saved one of this kind stays in use), "unstable" (unstable, stored for `--show` but not used).
    The other kind's measurement is always kept.
    """
    out = saved_measurements(saved)
    stable = bool(new.get("stable", True))
    if stable:
        out[kind] = {k: v for k, v in new.items() if k != "forced"}
        return out, "saved"
    if force:
        out[kind] = {**new, "forced": True}
        return out, "forced"
    if kind in out and usable(out[kind]):
        return out, "kept"
    out[kind] = {k: v for k, v in new.items() if k != "forced"}
    return out, "unstable"


# ---- what one `edgespec profile` stores --------------------------------------------------------------
@dataclass(frozen=True)
class Stored:
    """What storing a profile run did: the pair's file, what happened to the new measurement
    ("saved" / "forced" / "kept" / "unstable" as merge_measurement says; "aborted": the machine was
    busy and nothing was measured; None: --no-measure), and whether runs have usable costs of
    this kernel kind afterwards."""

    path: Path
    decision: str | None
    usable: bool

    def problem(self, kind: str, reasons: Sequence[str]) -> str | None:
        """The one-line error for a run whose measurement is not in use (None: nothing wrong)."""
        if self.decision not in ("aborted", "kept", "unstable"):
            return None
        kept = ("kept the saved profile's costs" if self.usable
                else "runs use estimated costs until a stable profile is measured")
        if self.decision == "aborted":
            return (f"profile not measured, the machine is busy ({'; '.join(reasons)}): {kept}; rerun "
                    "`edgespec profile` when it is quiet, or pass --force to measure anyway")
        return (f"profile unstable ({'; '.join(reasons)}): {kept}; rerun `edgespec profile` on a quiet machine, "
                "or pass --force to use this measurement")


def store_profile_run(hw: HardwareInfo, *, target: str, draft: str | None, data: dict[str, Any], kind: str,
                      measurement: dict | None, force: bool = False, aborted: bool = False) -> Stored:
    """Save one profile run: `data` (models, plan) with the measurements merged per kernel kind.

    It is saved for the target alone (the verify costs hold without a draft too: --spec ngram/off
    look them up so) and for the pair, the pair last (its verdict counts). An unstable measurement
    never replaces a usable saved one of its kind unless forced (merge_measurement)."""
    keys = [draft] if draft is None else [None, draft]
    decision = "aborted" if aborted else None
    measurements: dict[str, dict] = {}
    path = None
    for key in keys:
        saved = load_profile(hw, target, key)
        measurements = saved_measurements(saved)
        if measurement is not None:
            measurements, decision = merge_measurement(saved, kind, measurement, force=force)
        path = save_profile({**data, "measurements": measurements}, hw=hw, target_sha_or_name=target, draft=key)
    usable_now = kind in measurements and usable(measurements[kind]) and "cost" in measurements[kind]
    return Stored(path, decision, usable_now)
