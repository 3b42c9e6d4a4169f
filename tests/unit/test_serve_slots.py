"""`serve`'s choice of slots and prompt-cache size (commands/serve._open_slots) on scripted plans:
the engine loads the slots only (the cache is in host memory), the default cache only when its
plan costs the slots nothing, an explicit one kept or refused."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from edgespec.commands import serve as S
from edgespec.errors import PlanError


def plans(fits):
    """A scripted resolve: fits(n_seq) -> (n_ctx, gpu layers) or None (the plan refuses)."""
    asked = []

    def resolve(kw, spec):
        n = kw["parallel"]
        asked.append(n)
        placed = fits(n)
        if placed is None:
            raise PlanError(f"{n} parallel sequences do not fit")
        n_ctx, layers = placed
        plan = SimpleNamespace(n_ctx=n_ctx, target=SimpleNamespace(n_gpu_layers=layers), draft=None,
                               warnings=(), n_seq=n)
        return SimpleNamespace(plan=plan, warnings=(), notes=())

    return resolve, asked


@pytest.fixture
def loaded(monkeypatch):
    monkeypatch.setattr(S.session, "open_engine", lambda resolved, spec, exact: ("engine", resolved.plan.n_seq))
    monkeypatch.setattr(S, "report", lambda resolved: None)

    def run(fits, parallel=None, cache=None):
        resolve, asked = plans(fits)
        monkeypatch.setattr(S, "resolve", resolve)
        resolved, engine, slots, cached = S._open_slots({"exact": False}, None, parallel, cache)
        return engine[1], slots, cached, asked

    return run


def test_the_default_cache_is_as_many_prompts_as_slots_when_it_costs_nothing(loaded):
    assert loaded(lambda n: (8192, 0)) == (4, 4, 4, [4, 8])


def test_the_default_cache_is_left_out_when_it_would_shrink_the_context_or_move_layers(loaded):
    assert loaded(lambda n: (8192 if n <= 4 else 4096, 0))[:3] == (4, 4, 0)
    assert loaded(lambda n: (8192, 28 if n <= 4 else 20))[:3] == (4, 4, 0)
    assert loaded(lambda n: (8192, 0) if n <= 4 else None)[:3] == (4, 4, 0)


def test_slots_shrink_to_fit_before_the_cache_is_tried(loaded):
    assert loaded(lambda n: (2048, 0) if n <= 3 else None) == (3, 3, 0, [4, 3, 6])


def test_an_explicit_cache_is_kept_or_refused(loaded):
    assert loaded(lambda n: (8192 if n <= 2 else 4096, 0), parallel=2, cache=3)[:3] == (2, 2, 3)
    with pytest.raises(PlanError):
        loaded(lambda n: (8192, 0) if n <= 2 else None, parallel=2, cache=3)
    assert loaded(lambda n: (8192, 0), parallel=2, cache=0) == (2, 2, 0, [2])
