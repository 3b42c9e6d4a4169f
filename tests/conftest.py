"""Shared by the real-model suites (tests/real, tests/gpu): the packs' model names, and the `real`
marker on every test there (they load real GGUF models)."""

from __future__ import annotations

import pytest

TARGET = "qwen2.5-coder-1.5b-instruct-q4_k_m"
DRAFT = "qwen2.5-coder-0.5b-instruct-q4_k_m"
SMALL = "smollm2-135m-instruct-q4_1"

REAL_SUITES = ("/tests/real/", "/tests/gpu/")


def pytest_collection_modifyitems(items):
    for item in items:
        if any(suite in str(item.fspath) for suite in REAL_SUITES):
            item.add_marker(pytest.mark.real)
