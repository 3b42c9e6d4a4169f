"""Real GGUF models from the packs. CI pulls them (scripts/test); a missing one is fetched here."""

from __future__ import annotations

import pytest

from edgespec import models

from ..conftest import DRAFT, SMALL, TARGET  # noqa: F401  (the tests here import them from this module)


@pytest.fixture(scope="session")
def model_path():
    cache = {}

    def get(name):
        if name not in cache:
            cache[name] = models.resolve(name)
        return cache[name]

    return get


@pytest.fixture(scope="session")
def pair_engine(model_path):
    """One loaded default pair for the whole session (loading costs seconds)."""
    from edgespec.backend.model import LoadParams
    from edgespec.config import SpecConfig
    from edgespec.engine import Engine, EngineConfig

    params = LoadParams(n_ctx=4096, n_threads=2)
    # exact: the equality tests compare speculative with plain decoding token for token
    cfg = EngineConfig(model_path(TARGET), params, model_path(DRAFT), params, spec=SpecConfig(mode="auto"), exact=True)
    engine = Engine(cfg)
    yield engine
    engine.close()
