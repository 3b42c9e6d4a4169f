"""What a bench runs: prompt sets (the built-in one or a JSONL file), categories, and modes."""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Iterable, Sequence

from ..config import SPEC_MODES, Mode
from ..errors import InputError

DEFAULT_MODES = (Mode.OFF, Mode.DRAFT, Mode.NGRAM, Mode.COMBINED, Mode.AUTO)  # the baseline first
PROMPT_FIELDS = {"id": str, "category": str, "prompt": str, "system": str, "max_tokens": int, "prefill": str}
REQUIRED_FIELDS = ("id", "category", "prompt")


@dataclass(frozen=True)
class BenchPrompt:
    id: str
    category: str
    prompt: str
    system: str | None = None
    max_tokens: int | None = None
    # The answer's start, already written: the model goes on from it (a "continue", an editor's
    # half-written file). It is part of the prompt, not of what is generated or timed.
    prefill: str | None = None


def parse_prompts(text: str, source: str = "<prompts>") -> list[BenchPrompt]:
    """One JSON object per line; blank lines and lines starting with # are skipped.

    Errors are one line naming the file and line number.
    """
    prompts: list[BenchPrompt] = []
    seen: dict[str, int] = {}
    for lineno, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        where = f"{source}:{lineno}"
        try:
            obj = json.loads(stripped)
        except json.JSONDecodeError as err:
            raise InputError(f"{where}: not valid JSON ({err.msg} at column {err.colno})") from None
        if not isinstance(obj, dict):
            raise InputError(f"{where}: expected a JSON object, got {type(obj).__name__}")
        missing = [k for k in REQUIRED_FIELDS if k not in obj]
        if missing:
            raise InputError(f"{where}: missing field{'s' if len(missing) > 1 else ''} {', '.join(repr(k) for k in missing)}")
        for key, kind in PROMPT_FIELDS.items():
            value = obj.get(key)
            if value is None and key not in REQUIRED_FIELDS:
                continue
            if kind is int:
                if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                    raise InputError(f"{where}: {key!r} must be a positive integer (got {value!r})")
            elif not isinstance(value, str) or (key in REQUIRED_FIELDS and not value.strip()):
                raise InputError(f"{where}: {key!r} must be a non-empty string (got {value!r})")
        if obj["id"] in seen:
            raise InputError(f"{where}: duplicate id {obj['id']!r} (first on line {seen[obj['id']]})")
        seen[obj["id"]] = lineno
        prompts.append(BenchPrompt(obj["id"], obj["category"], obj["prompt"], obj.get("system"), obj.get("max_tokens"),
                                   obj.get("prefill")))
    if not prompts:
        raise InputError(f"{source}: no prompts (expected one JSON object per line)")
    return prompts


BUILTIN = "built-in"


def load_prompts(path: str | Path | None = None) -> list[BenchPrompt]:
    """The built-in set (path None) or a JSONL file."""
    if path is None:
        text = resources.files("edgespec").joinpath("prompts/bench.jsonl").read_text(encoding="utf-8")
        return parse_prompts(text, BUILTIN)
    p = Path(path)
    try:
        data = p.read_bytes()
    except OSError as err:
        raise InputError(f"cannot read {p}: {err.strerror or err}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data[: err.start].count(b"\n") + 1
        raise InputError(f"{p}:{line}: not valid UTF-8") from None
    return parse_prompts(text, str(p))


def split_list(values: Iterable[str]) -> list[str]:
    """`--x a,b --x c` -> [a, b, c]."""
    out: list[str] = []
    for v in values:
        out += [s.strip() for s in v.split(",") if s.strip()]
    return out


def filter_categories(prompts: Sequence[BenchPrompt], categories: Sequence[str]) -> list[BenchPrompt]:
    if not categories:
        return list(prompts)
    known = sorted({p.category for p in prompts})
    unknown = [c for c in categories if c not in known]
    if unknown:
        raise InputError(f"--category: unknown {', '.join(unknown)} (this set has: {', '.join(known)})")
    return [p for p in prompts if p.category in categories]


def parse_modes(text: str) -> list[Mode]:
    modes = split_list([text])
    bad = [m for m in modes if m not in SPEC_MODES]
    if bad:
        raise InputError(f"--modes: unknown mode {', '.join(map(repr, bad))} (choose from {', '.join(DEFAULT_MODES)})")
    if not modes:
        raise InputError("--modes: no modes given")
    ordered = [Mode(m) for m in dict.fromkeys(modes) if m != Mode.OFF]
    return [Mode.OFF, *ordered]  # the baseline every speedup is measured against, first


def runnable_modes(modes: Sequence[str], has_draft: bool) -> tuple[list[Mode], list[dict]]:
    """Drop modes that need a draft model when none is loaded; return (modes, skipped notes)."""
    keep, skipped = [], []
    for m in map(Mode, modes):
        if m.needs_draft_model and not has_draft:
            skipped.append({"mode": m, "reason": "no draft model loaded (pass -md/--model-draft or --pair)"})
        else:
            keep.append(m)
    return keep, skipped
