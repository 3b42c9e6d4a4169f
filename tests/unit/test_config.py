"""Run configuration: the --spec modes and what each implies, the KV cache types, the draft lengths."""

from __future__ import annotations

import json

import pytest

from edgespec.config import (DEFAULT_DRAFT_MAX, KV_CACHE_TYPES, KV_TYPES, MAX_DRAFT, SPEC_MODES, DraftLimits, LoadConfig,
                             Mode, SpecConfig)
from edgespec.costs import CostModel
from edgespec.errors import ConfigError
from edgespec.plan import kv_bytes_per_elem


def test_mode_properties_say_which_drafters_a_mode_uses():
    table = {m: (m.uses_ngram, m.uses_draft_model, m.needs_draft_model, m.adaptive) for m in Mode}
    assert table == {
        Mode.OFF: (False, False, False, False),
        Mode.NGRAM: (True, False, False, False),
        Mode.DRAFT: (False, True, True, False),
        Mode.COMBINED: (True, True, True, False),
        Mode.AUTO: (True, True, False, True),
    }


def test_a_mode_is_its_string_in_comparisons_messages_and_json():
    assert Mode.AUTO == "auto" and "auto" == Mode.AUTO and Mode("ngram") is Mode.NGRAM
    assert f"{Mode.COMBINED}" == str(Mode.COMBINED) == "combined"
    assert json.dumps({Mode.OFF: Mode.DRAFT}) == '{"off": "draft"}'
    assert SPEC_MODES == ("auto", "draft", "ngram", "combined", "off")  # --spec's choices, in its help's order


def test_spec_config_takes_a_string_and_holds_a_mode():
    spec = SpecConfig(mode="combined")
    assert spec.mode is Mode.COMBINED and spec.uses_draft_model
    assert SpecConfig().mode is Mode.AUTO and not SpecConfig(mode="ngram").uses_draft_model
    with pytest.raises(ConfigError, match="--spec must be one of auto, draft, ngram, combined, off"):
        SpecConfig(mode="sideways")


# ---- KV cache types ----------------------------------------------------------------------------
def test_the_kv_types_are_llama_cpps_with_their_ggml_ids_and_block_sizes():
    # common/arg.cpp kv_cache_types and ggml.h's enum ggml_type in the vendored llama.cpp
    assert {n: t.ggml_type for n, t in KV_CACHE_TYPES.items()} == {
        "f32": 0, "f16": 1, "bf16": 30, "q8_0": 8, "q4_0": 2, "q4_1": 3, "iq4_nl": 20, "q5_0": 6, "q5_1": 7}
    assert KV_CACHE_TYPES["iq4_nl"].bytes_per_elem == KV_CACHE_TYPES["q4_0"].bytes_per_elem == 18 / 32
    assert KV_TYPES == tuple(KV_CACHE_TYPES)
    assert LoadConfig(target="t", type_k="iq4_nl", type_v="q8_0").type_k == "iq4_nl"
    with pytest.raises(ConfigError, match="-ctv must be one of f32, f16, bf16, q8_0, q4_0, q4_1, iq4_nl"):
        LoadConfig(target="t", type_v="q3_k")


def test_the_plan_prices_every_kv_type_the_flags_accept():
    for name, kind in KV_CACHE_TYPES.items():
        assert kv_bytes_per_elem(name) == kind.bytes_per_elem
    with pytest.raises(ConfigError, match="unknown KV cache type 'q3_k'"):
        kv_bytes_per_elem("q3_k")


# ---- draft lengths -----------------------------------------------------------------------------
def test_draft_limits_follow_the_profile_up_to_the_cap():
    measured = CostModel(verify={2: 1.4, 8: 2.9, 33: 7.0})
    assert DraftLimits.of(SpecConfig(), measured) == DraftLimits(1, 32)  # the longest measured batch less one
    assert DraftLimits.of(SpecConfig(), None) == DraftLimits(1, DEFAULT_DRAFT_MAX)  # no profile
    assert DraftLimits.of(SpecConfig(), CostModel()) == DraftLimits(1, DEFAULT_DRAFT_MAX)  # a profile that timed nothing
    assert DraftLimits.of(SpecConfig(), CostModel(verify={2: 1.4, 200: 40.0})).draft_max == MAX_DRAFT
    assert DraftLimits.of(SpecConfig(), CostModel(verify={2: 1.4})).draft_max == 1


def test_draft_limits_take_the_flags_and_never_go_below_draft_min():
    measured = CostModel(verify={2: 1.4, 8: 2.9})
    assert DraftLimits.of(SpecConfig(draft_max=12), measured) == DraftLimits(1, 12)
    assert DraftLimits.of(SpecConfig(draft_min=10), measured) == DraftLimits(10, 10)  # the profile says 7
    assert DraftLimits.of(SpecConfig(draft_min=3, draft_max=5), None) == DraftLimits(3, 5)
    with pytest.raises(ConfigError, match=f"--draft-max must be <= {MAX_DRAFT}"):
        SpecConfig(draft_max=MAX_DRAFT + 1)
    with pytest.raises(ConfigError):
        DraftLimits(4, 2)
