#!/usr/bin/env python3
"""Write the copy-heavy and long-document prompts of the built-in bench set (issue 25).

Sources: CPython's own standard library, read from the running interpreter (colorsys.py,
calendar.py, and the language reference text pydoc ships in pydoc_data/topics.py), so the
prompts are reproducible from any CPython 3.11. Prints JSONL lines in edgespec's bench format;
the lines were appended to edgespec/prompts/bench.jsonl with

    python3 scripts/make_copy_prompts.py >> edgespec/prompts/bench.jsonl
"""

from __future__ import annotations

import inspect
import json

import calendar
import colorsys
from pydoc_data.topics import topics

EDIT_SYSTEM = "You edit code exactly as asked. Reply with the complete code only, in one code block, with no explanation."


def lines(module, first: str, last: str) -> str:
    """The source of `module` from the line starting with `first` to the line starting with `last`."""
    src = inspect.getsource(module).splitlines()
    start = next(i for i, line in enumerate(src) if line.startswith(first))
    end = next(i for i, line in enumerate(src) if i > start and line.startswith(last))
    return "\n".join(src[start:end + 1]).rstrip() + "\n"


def search_replace() -> dict:
    code = lines(colorsys, "# HLS: Hue", "    return h, s, v")
    return {
        "id": "sr-colorsys", "category": "copy", "max_tokens": 448,
        "system": "You edit code with SEARCH/REPLACE blocks. Reply with the blocks only, no explanation.",
        "prompt": (
            "In colorsys.py below, rename the local variables `maxc` and `minc` to `cmax` and `cmin` in "
            "`rgb_to_hls` and in `rgb_to_hsv`. Reply with one SEARCH/REPLACE block per function, each "
            "covering the whole function, in exactly this format:\n\n"
            "colorsys.py\n<<<<<<< SEARCH\n(the original lines)\n=======\n(the edited lines)\n>>>>>>> REPLACE\n\n"
            f"```python\n{code}```"
        ),
    }


def insert_lines() -> dict:
    code = lines(calendar, "def isleap", "        return year, month+1")
    return {
        "id": "insert-calendar-checks", "category": "copy", "max_tokens": 448, "system": EDIT_SYSTEM,
        "prompt": (
            "Insert the line `_check_year(year)` as the first statement of every function below that has a "
            "parameter named `year` (after its docstring, if it has one). Change nothing else and return the "
            f"whole code.\n\n```python\n{code}```"
        ),
    }


def summary() -> dict:
    return {
        "id": "summ-raise", "category": "summ", "max_tokens": 256,
        "prompt": (
            "Summarize the document below in five bullet points. Each bullet must be one sentence copied word "
            "for word from the document.\n\nDocument:\n\n" + topics["raise"]
        ),
    }


def rag_quote() -> dict:
    return {
        "id": "rag-objects-quote", "category": "rag", "max_tokens": 256,
        "prompt": (
            "Using only the document below, answer the question. First quote, word for word, the sentences "
            "that answer it, then give the answer in one line.\n\nQuestion: when may an object be "
            "garbage-collected, and why should programs close files explicitly?\n\nDocument:\n\n"
            + topics["objects"]
        ),
    }


def rag_own_words() -> dict:
    return {
        "id": "rag-with-own-words", "category": "rag", "max_tokens": 160,
        "prompt": (
            "Using only the document below, answer in two or three sentences of your own words: what does "
            "the with statement do with the context manager's exit method when the body raises an "
            "exception?\n\nDocument:\n\n" + topics["with"]
        ),
    }


def main() -> None:
    for make in (search_replace, insert_lines, summary, rag_quote, rag_own_words):
        print(json.dumps(make(), ensure_ascii=False))


if __name__ == "__main__":
    main()
