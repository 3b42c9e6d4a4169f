"""Tables for the models already on this machine (`edgespec models list --local`, `models scan`)."""

from __future__ import annotations

from rich.markup import escape
from rich.table import Table

from . import human_bytes


def local_table(rows) -> Table:
    t = Table(title="models on this machine", caption="use the first column with -m/-md; equal vocab: same tokenizer")
    # The reference is what users copy into -m/-md: keep it on one line; the path may fold.
    t.add_column("reference", no_wrap=True, min_width=max((len(r.ref) for r in rows), default=9))
    for col in ("name", "arch", "quant", "size", "vocab"):
        t.add_column(col)
    t.add_column("where", overflow="fold")
    for r in rows:
        t.add_row(escape(r.ref), escape(r.name), escape(r.architecture), escape(r.quant), human_bytes(r.size),
                  r.vocab, escape(str(r.path)))
    return t
