"""Every Rich table, colour, progress bar and live display lives in this package.

Library modules return data; these functions turn it into terminal output.
"""

from __future__ import annotations

import sys

from rich.console import Console

SOURCE_STYLES = {"target": "", "draft": "green", "ngram": "cyan"}


def stdout_console() -> Console:
    return Console(file=sys.stdout, highlight=False, soft_wrap=True)


def stderr_console() -> Console:
    return Console(file=sys.stderr, highlight=False, soft_wrap=True)


def human_bytes(n: float | int | None) -> str:
    if n is None:
        return "-"
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n:.2f} TiB"
