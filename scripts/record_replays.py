#!/usr/bin/env python3
"""Record greedy answers of built-in bench prompts as token sequences, for the replay harness.

    scripts/record_replays.py [--out tests/data/recordings] [--prompts FILE] [-t 2] [ID ...]

Each file holds the prompt's tokens (chat template applied, as bench feeds them) and the answer's
tokens, from the default pair's target with the default kernels and `--spec auto` without a draft
model (n-gram drafting only, to record faster): greedy, so the answer is plain decoding's except
where the target's top two logits nearly tie (see README, *Exactness*). Recording is not timing:
nothing here measures speed.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from edgespec import models, session
from edgespec.bench.prompts import load_prompts
from edgespec.config import LoadConfig, SpecConfig
from edgespec.errors import InputError
from edgespec.generate import Final
from edgespec.sampling import SamplingConfig
from edgespec.template import Message

DEFAULT_IDS = ("copy-fix-bisect", "rename-heapq", "copy-quote-shlex", "edit-rename", "sr-colorsys",
               "insert-calendar-checks", "free-story", "code-lru", "summ-raise", "rag-objects-quote",
               "rag-with-own-words")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("ids", nargs="*")
    ap.add_argument("--out", default="tests/data/recordings")
    ap.add_argument("--prompts", help="a bench prompts file (JSONL) instead of the built-in set; "
                    "with no IDs, every prompt in it")
    ap.add_argument("-t", "--threads", type=int, default=2)
    a = ap.parse_args()
    # the prompts are checked before the model loads: a typo costs no load
    try:
        prompts = {p.id: p for p in load_prompts(a.prompts)}
    except InputError as err:
        ap.error(str(err))
    ids = a.ids or (list(prompts) if a.prompts else list(DEFAULT_IDS))
    unknown = [i for i in ids if i not in prompts]
    if unknown:
        ap.error(f"no prompt {', '.join(unknown)} in {a.prompts or 'the built-in set'}")
    target, _ = models.load_registry().pair(None)
    spec = SpecConfig(mode="auto")
    resolved = session.resolve(LoadConfig(target=target.name, draft=None, threads=a.threads), spec, kernels="fast")
    engine = session.open_engine(resolved, spec, exact=False)
    eog = [t for t in range(engine.target.n_vocab) if engine.target.is_eog(t)]
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    for pid in ids:
        p = prompts[pid]
        messages = ([Message("system", p.system)] if p.system else []) + [Message("user", p.prompt)]
        tokens = engine.chat_tokens(messages)
        dec = engine.decoder(SamplingConfig())
        final = None
        budget = p.max_tokens or 256
        for item in engine.stream(tokens, max_tokens=budget, decoder=dec):
            if isinstance(item, Final):
                final = item
        answer = list(final.tokens)
        record = {"id": p.id, "category": p.category, "model": resolved.target_path.name,
                  "recorded_with": "edgespec --spec auto (n-gram only), default kernels, greedy",
                  "finish": final.finish_reason if final else None,
                  # the budget and the end tokens: what every policy knows live (edgespec.replay.Recording)
                  "max_tokens": budget, "eog": eog,
                  "prompt": tokens, "answer": answer}
        (out / f"{p.id}.json").write_text(json.dumps(record) + "\n")
        print(f"{p.id}: {len(tokens)} prompt tokens, {len(answer)} answer tokens ({record['finish']})", flush=True)
    engine.close()


if __name__ == "__main__":
    main()
