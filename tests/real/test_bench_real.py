"""`edgespec bench` end to end on the real default pair: a tiny prompt set, --verify, --json."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from edgespec.commands import cli

from .conftest import SMALL

pytestmark = pytest.mark.real

PROMPTS = [
    {"id": "hello", "category": "free", "prompt": "Say hello in three languages, one per line."},
    {
        "id": "copy",
        "category": "edit",
        "system": "Reply with the code only.",
        "prompt": "Rename `total` to `acc` in this code and return the whole code.\n\n"
        "def add_all(xs):\n    total = 0\n    for x in xs:\n        total += x\n    return total\n",
    },
]
MODES = ["off", "ngram", "auto"]
METRICS = ("tokens", "tokens_per_s", "speedup", "acceptance_rate", "mean_accepted_per_pass", "ttft_ms",
           "latency_p50_ms", "latency_p95_ms")


def test_bench_default_pair_verify_json(tmp_path):
    f = tmp_path / "tiny.jsonl"
    f.write_text("".join(json.dumps(p) + "\n" for p in PROMPTS))
    args = ["bench", "--prompts", str(f), "--max-tokens", "24", "--modes", ",".join(MODES), "--verify", "--exact", "--json",
            "-q", "-t", "2", "--repeats", "1"]
    r = CliRunner().invoke(cli, args)
    assert r.exit_code == 0, (r.stdout, r.stderr, r.exception)
    data = json.loads(r.stdout)

    assert data["modes"] == MODES and data["skipped"] == []
    assert data["config"]["draft"] and data["config"]["target"].endswith(".gguf")
    assert data["verify"] == {"checked": True, "ok": True, "exact": True, "near_tie_logit": None, "differences": []}
    assert set(data["categories"]) == {"free", "edit"}
    for group in [data["overall"], *data["categories"].values()]:
        assert set(group) == set(MODES)
        for mode, row in group.items():
            for key in METRICS:
                assert key in row
            assert row["tokens"] > 0 and row["tokens_per_s"] > 0 and row["ttft_ms"] > 0
            assert 0 < row["mean_accepted_per_pass"] <= 17
            if mode == "off":
                assert row["speedup"] == 1.0 and row["acceptance_rate"] is None
    assert [p["id"] for p in data["prompts"]] == ["hello", "copy"]
    for p in data["prompts"]:
        assert set(p["modes"]) == set(MODES) and p["prompt_tokens"] > 0
        tokens = {m["tokens"] for m in p["modes"].values()}
        assert len(tokens) == 1 and tokens.pop() <= 24  # greedy: every mode emits the same tokens
    # Input-grounded copying is where n-gram drafting accepts: it must have drafted and accepted something.
    copy = data["prompts"][1]["modes"]["ngram"]
    assert copy["drafted"] > 0 and copy["accepted"] > 0


def test_bench_fast_kernels_every_repeat_in_json_and_the_exit_code_is_the_verdict(tmp_path, model_path):
    """Default (fast) kernels, on the smallest model: every repeat is in --json, and the exit code is
    the verify verdict it reports. Whether these kernels make a run diverge from plain decoding is
    this machine's arithmetic, not the test's to choose; how each divergence is judged (its margin,
    near-tie or not, exit 1 only on a real one) is proven where divergences are forced, on a fake
    (tests/unit/test_bench.py: test_verify_passes_a_divergence_at_a_near_tie and the tests after it)."""
    from edgespec.bench.results import NEAR_TIE_LOGIT

    modes = ["off", "ngram"]
    f = tmp_path / "tiny.jsonl"
    f.write_text("".join(json.dumps(p) + "\n" for p in PROMPTS))
    args = ["bench", "-m", str(model_path(SMALL)), "--prompts", str(f), "--max-tokens", "24", "--modes", ",".join(modes),
            "--verify", "--json", "-q", "-t", "2", "--repeats", "2"]
    r = CliRunner().invoke(cli, args)
    data = json.loads(r.stdout)
    verify = data["verify"]
    assert verify["checked"] and verify["exact"] is False and verify["near_tie_logit"] == NEAR_TIE_LOGIT
    assert verify["ok"] is all(d["near_tie"] for d in verify["differences"])
    assert r.exit_code == (0 if verify["ok"] else 1), (r.stderr, r.exception)
    assert data["modes"] == modes and data["config"]["repeats"] == 2 and data["config"]["kernels"] == "fast"
    for p in data["prompts"]:
        assert set(p["modes"]) == set(modes)
        for mode, row in p["modes"].items():
            assert [run["repeat"] for run in row["runs"]] == [0, 1]
            assert all(run["tokens_per_s"] > 0 for run in row["runs"])
    for mode, row in data["overall"].items():
        assert len(row["repeats"]) == 2
        lo, hi = row["spread"]["tokens_per_s"]
        assert lo <= row["tokens_per_s"] <= hi
        if mode != "off":
            lo, hi = row["spread"]["speedup"]
            assert row["speedup_overlaps_1"] == (lo <= 1.0 <= hi)


def test_bench_goes_on_from_a_prompts_prefill(tmp_path):
    copy = PROMPTS[1]
    rows = [copy, {**copy, "id": "copy-prefilled", "prefill": "def add_all(xs):\n    acc = 0\n"}]
    f = tmp_path / "prefill.jsonl"
    f.write_text("".join(json.dumps(p) + "\n" for p in rows))
    args = ["bench", "--prompts", str(f), "--max-tokens", "16", "--modes", "off,ngram", "--json", "-q", "-t", "2",
            "--repeats", "1"]
    r = CliRunner().invoke(cli, args)
    assert r.exit_code == 0, (r.stdout, r.stderr, r.exception)
    prompts = {p["id"]: p for p in json.loads(r.stdout)["prompts"]}
    # the prefill is read as part of the prompt (after the template), not generated
    assert prompts["copy-prefilled"]["prompt_tokens"] >= prompts["copy"]["prompt_tokens"] + 8
    # going on from there is copying the rest of the function: the drafter finds it at once
    ngram = prompts["copy-prefilled"]["modes"]["ngram"]
    assert ngram["drafted"] > 0 and ngram["accepted"] > 0
