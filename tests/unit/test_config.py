"""Run configuration: the --spec modes and what each one implies."""

from __future__ import annotations

import json

import pytest

from edgespec.config import SPEC_MODES, Mode, SpecConfig
from edgespec.errors import ConfigError


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
