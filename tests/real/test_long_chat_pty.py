"""A 100-turn `edgespec chat` in a pseudo-terminal with a context small enough to roll over many
times: every turn gets an answer, the oldest turns are dropped with a notice, and the process
neither grows without bound (RSS) nor leaks file descriptors. And SIGTERM / SIGHUP in a chat, while
it answers and while readline holds the terminal: one line, exit 143 / 129, the terminal usable.

Bounds (measured on the 2-core development machine, smollm2-135m, -c 256 -n 8, see
/work/notes/reliability-README.md): RSS after the last turn exceeds RSS after turn 10 by at most
RSS_GROWTH_BOUND, and the open descriptors are the same at turn 10 and turn 100.
"""

from __future__ import annotations

import os
import re
import signal
import sys
import termios

import pytest

from .conftest import SMALL

try:
    import pexpect
except ImportError:  # a missing test tool must fail the run, not skip these tests silently
    pytest.fail("pexpect is not installed: `pip install -e .[test]` (CI installs it)", pytrace=False)

TURNS = 100
WARM = 10  # turns before the baseline: allocator and caches settled, the context rolled over once
CTX = 256
MAX_TOKENS = 8
# One thread: a hundred turns then cost about 0.4 s of CPU each, predictably. With two, ggml's
# worker threads spin while they wait, and on a busy machine that multiplies the cost several times.
THREADS = 1
RSS_GROWTH_BOUND = 32 << 20  # bytes; measured growth 4.4 MiB (see the module docstring)
PROMPT = "you> "
LOAD_TIMEOUT = 300
TURN_TIMEOUT = 180
ANSI = re.compile(r"\x1b\[[0-9;]*m")
STATS = re.compile(r"(\d+) tokens · [\d.]+ tok/s[^\n]*prompt (\d+) \((\d+) cached\)[^\n]*\n")


def rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def fds(pid: int) -> list[str]:
    """What each open descriptor points at (so a leak says what leaked)."""
    out = []
    for fd in sorted(os.listdir(f"/proc/{pid}/fd"), key=int):
        try:
            out.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
        except OSError:  # closed between listing and reading
            pass
    return out


def test_a_hundred_turns_roll_the_context_over_without_leaking(model_path):
    child = pexpect.spawn(
        sys.executable,
        ["-c", "from edgespec.commands import main; main()", "chat", "-m", str(model_path(SMALL)),
         "-c", str(CTX), "-n", str(MAX_TOKENS), "-t", str(THREADS)],
        encoding="utf-8", timeout=TURN_TIMEOUT, dimensions=(50, 200),
    )
    child.expect_exact(PROMPT, timeout=LOAD_TIMEOUT)
    rolled = 0
    baseline_rss = baseline_fds = None
    peak = 0
    for turn in range(1, TURNS + 1):
        child.sendline(f"Turn {turn}: name one colour and one number, briefly.")
        child.expect(STATS)
        before = child.before
        tokens = int(child.match.group(1))
        assert tokens > 0, f"turn {turn} got no answer"
        rolled += before.count("context full: dropped")
        child.expect_exact(PROMPT)
        assert "error" not in before.lower() and "Traceback" not in before, before
        if turn == WARM:
            baseline_rss, baseline_fds = rss(child.pid), fds(child.pid)
        elif turn > WARM:
            peak = max(peak, rss(child.pid))
    final_fds = fds(child.pid)
    growth = peak - baseline_rss
    print(f"\n{TURNS} turns, context rolled over {rolled} times; RSS {baseline_rss / 2**20:.1f} MiB at turn {WARM}, "
          f"peak {peak / 2**20:.1f} MiB after (growth {growth / 2**20:.1f} MiB); {len(final_fds)} open descriptors")
    child.sendline("/stats")
    child.expect_exact("session totals")
    child.expect_exact(PROMPT)
    totals = ANSI.sub("", child.before)
    answers = int(re.search(r"answers\s+(\d+)", totals).group(1))
    child.sendline("/exit")
    child.expect(pexpect.EOF, timeout=60)
    child.close()
    assert child.exitstatus == 0
    assert answers == TURNS
    assert rolled >= 5, f"the context rolled over only {rolled} times"
    assert growth <= RSS_GROWTH_BOUND, f"RSS grew {growth / 2**20:.1f} MiB over {TURNS - WARM} turns"
    assert final_fds == baseline_fds, f"descriptors at turn {WARM}: {baseline_fds}; at the end: {final_fds}"


@pytest.mark.parametrize("sig, where", [(signal.SIGTERM, "generating"), (signal.SIGHUP, "at the prompt"),
                                        (signal.SIGTERM, "at the prompt")])
def test_a_signal_in_chat_is_one_line_and_leaves_the_terminal_usable(model_path, sig, where):
    child = pexpect.spawn(
        sys.executable,
        ["-c", "from edgespec.commands import main; main()", "chat", "-m", str(model_path(SMALL)),
         "-n", "400", "-t", "2"],
        encoding="utf-8", timeout=TURN_TIMEOUT, dimensions=(50, 200),
    )
    child.expect_exact(PROMPT, timeout=LOAD_TIMEOUT)
    if where == "generating":
        child.sendline("Write a long story about a lighthouse keeper.")
        child.expect_exact("lighthouse keeper.")  # the echo
        child.expect(r"\w+\W+\w+\W+\w+")  # the answer is streaming
    else:
        child.send("half a line")  # readline holds the terminal in its own mode now
        child.expect_exact("half a line")
    child.kill(sig)
    child.expect(pexpect.EOF, timeout=60)
    rest = child.before
    attrs = termios.tcgetattr(child.child_fd)  # the pty's modes as the chat left them
    child.close()
    code = 128 + sig
    assert (child.exitstatus, child.signalstatus) == (code, None)
    lines = [line.strip() for line in rest.splitlines() if line.strip()]
    assert lines[-1].endswith(f"terminated ({sig.name})") and "Traceback" not in rest
    lflag = attrs[3]
    assert lflag & termios.ECHO and lflag & termios.ICANON, "the terminal was left without echo/line mode"
