#!/usr/bin/env python3
"""Prompts that end inside their answer: each recorded answer's first half as the prompt's prefill.

    scripts/make_taken_up_prompts.py --prompts scripts/heldout.jsonl \
        --recordings tests/data/recordings-heldout --out scripts/heldout-taken-up.jsonl

For each prompt of the set with a recording (tests/data/recordings*, scripts/record_replays.py),
the answer is cut at its first line end from the middle on; the text before the cut becomes the
prompt's "prefill" (the answer's start, already written: a "continue", an editor's half-written
file) and the rest's length its max_tokens. `scripts/compare_llamacpp --prompts` and `edgespec bench
--prompts` then time both tools going on from there, the copy already long when decoding starts.
Only the tokenizer of the default target is used (the recordings are its tokens); nothing is timed.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from edgespec import models, session
from edgespec.bench.prompts import load_prompts
from edgespec.config import LoadConfig, SpecConfig
from edgespec.errors import InputError
from edgespec.replay import MIN_LEFT, Recording


def cut(answer_bytes: list[bytes]) -> int | None:
    """The first token after a line end from the middle of the answer on, leaving MIN_LEFT tokens."""
    for s in range(len(answer_bytes) // 2, len(answer_bytes) - MIN_LEFT + 1):
        if answer_bytes[s - 1].endswith(b"\n"):
            return s
    return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", help="a bench prompts file (JSONL; default: the built-in set)")
    ap.add_argument("--recordings", default="tests/data/recordings")
    ap.add_argument("--category", default="copy,rename,edit,extract", help="the categories to take (comma-separated)")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    try:
        prompts = load_prompts(a.prompts)
    except InputError as err:
        ap.error(str(err))
    wanted = set(a.category.split(","))
    recorded = {p.stem: Recording.load(p) for p in sorted(Path(a.recordings).glob("*.json"))}
    chosen = [p for p in prompts if p.category in wanted and p.id in recorded]
    if not chosen:
        ap.error(f"no prompt of {a.category} in {a.prompts or 'the built-in set'} has a recording in {a.recordings}")
    target, _ = models.load_registry().pair(None)
    spec = SpecConfig(mode="off")
    resolved = session.resolve(LoadConfig(target=target.name, draft=None, threads=1), spec, kernels="fast")
    lines = []
    with session.open_engine(resolved, spec, exact=False) as engine:
        for p in chosen:
            answer = [engine.target.token_bytes(t) for t in recorded[p.id].answer]
            s = cut(answer)
            if s is None:
                print(f"{p.id}: no line end to cut at with {MIN_LEFT} tokens left; skipped")
                continue
            prefill = b"".join(answer[:s]).decode("utf-8")
            row = {"id": f"{p.id}@{s}", "category": p.category, "prompt": p.prompt, "system": p.system,
                   "prefill": prefill, "max_tokens": len(answer) - s}
            lines.append(json.dumps({k: v for k, v in row.items() if v is not None}))
            print(f"{p.id}: prefill {s} of {len(answer)} answer tokens")
    Path(a.out).write_text("".join(line + "\n" for line in lines), encoding="utf-8")


if __name__ == "__main__":
    main()
