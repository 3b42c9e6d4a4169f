"""Real GGUF models from the packs. CI pulls them (scripts/test); a missing one is fetched here."""

from __future__ import annotations

import pytest

from edgespec import models

TARGET = "qwen2.5-coder-1.5b-instruct-q4_k_m"
DRAFT = "qwen2.5-coder-0.5b-instruct-q4_k_m"
SMALL = "smollm2-135m-instruct-q4_1"


def pytest_collection_modifyitems(items):
    for item in items:
        if "/tests/real/" in str(item.fspath):
            item.add_marker(pytest.mark.real)


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
