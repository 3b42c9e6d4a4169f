#!/usr/bin/env python3
"""Write the held-out prompts of issue 25: copy-heavy and long-document prompts nobody tuned on.

The built-in bench set (edgespec/prompts/bench.jsonl) is recorded for the replay harness
(tests/data/recordings/) and every controller change is judged there, so it is tuned on. These
prompts are not: they are never recorded, never replayed in tests, and only measured live
(scripts/compare_llamacpp --prompts scripts/heldout.jsonl, edgespec bench --prompts ...). Keep it so:
a prompt that is recorded or tuned on moves to the built-in set and a new one takes its place here.

Sources: CPython 3.11's own standard library, read from the running interpreter (queue, textwrap,
json.encoder, shutil, zipfile, string and the language reference text in pydoc_data/topics.py).
Written with

    .venv/bin/python scripts/make_heldout_prompts.py > scripts/heldout.jsonl
"""

from __future__ import annotations

import inspect
import json
import json.encoder
import queue
import shutil
import string
import textwrap
import zipfile

from pydoc_data.topics import topics

EDIT_SYSTEM = "You edit code exactly as asked. Reply with the complete code only, in one code block, with no explanation."


def source(obj) -> str:
    return textwrap.dedent(inspect.getsource(obj))


def fix_queue() -> dict:
    code = source(queue.Queue.get).replace("if remaining <= 0.0:", "if remaining >= 0.0:")
    return {
        "id": "hx-fix-queue", "category": "copy", "max_tokens": 448, "system": EDIT_SYSTEM,
        "prompt": ("The method below raises Empty at the wrong time: one comparison is inverted. Fix that "
                   f"comparison, change nothing else, and return the whole method.\n\n```python\n{code}```"),
    }


def sr_textwrap() -> dict:
    code = source(textwrap.TextWrapper._split_chunks) + "\n" + source(textwrap.TextWrapper.wrap)
    return {
        "id": "hx-sr-textwrap", "category": "copy", "max_tokens": 320,
        "system": "You edit code with SEARCH/REPLACE blocks. Reply with the blocks only, no explanation.",
        "prompt": ("In textwrap.py below, rename the parameter `text` to `source` in both methods. Reply with "
                   "one SEARCH/REPLACE block per method, each covering the whole method, in exactly this "
                   "format:\n\ntextwrap.py\n<<<<<<< SEARCH\n(the original lines)\n=======\n(the edited lines)\n"
                   f">>>>>>> REPLACE\n\n```python\n{code}```"),
    }


def rename_json() -> dict:
    code = source(json.encoder.JSONEncoder.encode) + "\n" + source(json.encoder.JSONEncoder.iterencode)
    return {
        "id": "hx-rename-json", "category": "rename", "max_tokens": 640, "system": EDIT_SYSTEM,
        "prompt": ("Rename the parameter `o` to `value` everywhere in these two methods (the code and the "
                   f"docstrings) and return the whole code.\n\n```python\n{code}```"),
    }


def hints_shutil() -> dict:
    code = source(shutil.copyfileobj) + "\n" + source(shutil.copymode)
    return {
        "id": "hx-hints-shutil", "category": "edit", "max_tokens": 320, "system": EDIT_SYSTEM,
        "prompt": ("Add type hints to the signatures of the two functions below (parameters and return "
                   f"types). Change nothing else and return the whole code.\n\n```python\n{code}```"),
    }


def strip_comments_zipfile() -> dict:
    code = source(zipfile.ZipFile._write_end_record)
    return {
        "id": "hx-uncomment-zipfile", "category": "copy", "max_tokens": 512, "system": EDIT_SYSTEM,
        "prompt": ("Remove every comment (the text from a `#` to the end of its line, and lines that become "
                   f"empty) from the method below. Change nothing else and return the whole method.\n\n```python\n{code}```"),
    }


def extract_string() -> dict:
    code = inspect.getsource(string.Formatter)
    return {
        "id": "hx-extract-formatter", "category": "extract", "max_tokens": 192,
        "prompt": ("List every method that the class below defines, as a JSON array of objects with the keys "
                   "\"name\" and \"parameters\" (the parameter list exactly as written, without `self`). Reply "
                   f"with the JSON only.\n\n```python\n{code}```"),
    }


def summ_try() -> dict:
    return {
        "id": "hx-summ-try", "category": "summ", "max_tokens": 192,
        "prompt": "Summarize the document below in three sentences of your own words.\n\nDocument:\n\n" + topics["try"],
    }


def rag_import() -> dict:
    return {
        "id": "hx-rag-import", "category": "rag", "max_tokens": 192,
        "prompt": ("Using only the document below, answer the question in a short paragraph, quoting the "
                   "one sentence that settles it.\n\nQuestion: in what order does `from package import "
                   "item` look for `item`, and what is raised when it is not found?\n\nDocument:\n\n"
                   + topics["import"]),
    }


def free_code() -> dict:
    return {
        "id": "hx-code-duration", "category": "code", "max_tokens": 256,
        "prompt": ("Write a Python function parse_duration(text) that parses durations such as '1h30m', "
                   "'45s' and '2h' into a number of seconds, raising ValueError on bad input. Add a short "
                   "docstring."),
    }


def main() -> None:
    for make in (fix_queue, sr_textwrap, rename_json, hints_shutil, strip_comments_zipfile, extract_string,
                 summ_try, rag_import, free_code):
        print(json.dumps(make(), ensure_ascii=False))


if __name__ == "__main__":
    main()
