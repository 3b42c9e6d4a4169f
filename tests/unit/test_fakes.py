"""The fakes behave like the real thing where the core could go wrong."""

from __future__ import annotations

import numpy as np

from .fakes import FakeModel, table_lm


def test_decode_rows_are_a_view_the_next_decode_overwrites():
    lm = table_lm(3)
    model = FakeModel(lm)
    rows = model.decode([1, 2, 3], range(3))
    kept = rows[2]
    assert np.array_equal(kept, lm([1, 2, 3]))
    model.decode([4], [0])
    # like llama.cpp's logits buffer: the kept row now reads the new decode's logits, or NaN past them
    assert np.array_equal(rows[0], lm([1, 2, 3, 4]))
    assert np.isnan(kept).all()
    fresh = model.decode([5, 6, 7, 1], range(4))  # more rows than the buffer held: a larger buffer
    assert np.array_equal(fresh[3], lm([1, 2, 3, 4, 5, 6, 7, 1])) and np.isnan(rows).all()
