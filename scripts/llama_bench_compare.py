#!/usr/bin/env python3
"""edgespec's plain decoding and batch costs vs llama.cpp's llama-bench, same model, one run.

usage: scripts/llama_bench_compare.py [MODEL] [--threads 2] [--n-gen 128] [--pp 8,16,32,64]
                                      [--depth 0] [--kinds fast,exact] [--repeats 5] [--json]

llama-bench is found in (or built into) the cache of scripts/_llamacpp_tools.py: the vendored
llama.cpp of the pinned llama-cpp-python, built with this CPU's flags and llama.cpp's defaults.
Both kernel kinds are measured side by side:
  fast  = llama-bench defaults (repack on, -fa auto)  vs  edgespec default kernels
  exact = llama-bench --repack 0 -fa off              vs  edgespec exact=True (batch-invariant)
Per kind: tg (llama-bench -n N: N single-token decodes from an empty cache, no sampling) vs
edgespec plain decoding of N tokens through its generation loop (`prompt`'s path: greedy
sampling and all, GenerationStats.tokens_per_s). With --depth D both decode after a D-token
context (llama-bench -d D; edgespec: a D-token prompt, its prefill not timed); pp K (llama-bench
-p K: one K-token batch after that context, logits for the last row) vs edgespec's target decode
of K tokens after the same context, with logits for the last row ("pp", like llama-bench) and for every row ("verify", what a
speculative verify batch needs). Repeats are interleaved (tool, kind, repeat); medians are
printed with min–max. The figures are measurements: nothing is asserted.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _reexec_in_venv() -> None:
    venv_py = Path(os.environ.get("EDGESPEC_VENV", ROOT / ".venv")) / "bin" / "python"
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        if venv_py.exists() and Path(sys.executable) != venv_py:
            os.execv(str(venv_py), [str(venv_py), *sys.argv])
        raise


_reexec_in_venv()
sys.path[:0] = [str(ROOT), str(ROOT / "scripts")]

import argparse  # noqa: E402
import json  # noqa: E402
import random  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import time  # noqa: E402

import _llamacpp_tools  # noqa: E402
from edgespec import models  # noqa: E402
from edgespec.backend.model import LoadParams  # noqa: E402
from edgespec.config import SpecConfig  # noqa: E402
from edgespec.engine import Engine, EngineConfig  # noqa: E402
from edgespec.generate import complete  # noqa: E402
from edgespec.sampling import SamplingConfig  # noqa: E402

KINDS = ("fast", "exact")
LLAMA_BENCH_KIND_ARGS = {"fast": [], "exact": ["--repack", "0", "-fa", "off"]}


def say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def llama_bench(binary: Path, model: Path, threads: int, n_gen: int, pps: list[int], kind: str,
                depth: int = 0) -> dict[str, float]:
    """One invocation, one repetition of every test: {"tg128": tok/s, "pp8": tok/s, ...}."""
    args = [str(binary), "-m", str(model), "-t", str(threads), "-r", "1", "-o", "json", "-d", str(depth),
            "-p", ",".join(map(str, pps)) if pps else "0", "-n", str(n_gen), *LLAMA_BENCH_KIND_ARGS[kind]]
    proc = subprocess.run(args, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"llama-bench failed ({proc.returncode}): {proc.stderr.strip()[-600:]}")
    out = {}
    for t in json.loads(proc.stdout):
        name = f"tg{t['n_gen']}" if t["n_gen"] else f"pp{t['n_prompt']}"
        out[name] = float(t["avg_ts"])
    return out


class EdgespecSide:
    def __init__(self, model: str, threads: int, kind: str, depth: int = 0, n_tokens: int = 128):
        # n_tokens: the most any test adds after the depth (tg's n-gen, the largest pp)
        params = LoadParams(n_ctx=max(1024, depth + n_tokens + 64), n_threads=threads, n_threads_batch=threads)
        cfg = EngineConfig(models.resolve(model), params, spec=SpecConfig(mode="off"), exact=kind == "exact")
        self.engine = Engine(cfg)
        self.prompt = self.engine.raw_tokens("The")
        self.depth = depth
        if depth:
            # Source code as the context: a continuation of code does not end early (random
            # tokens, as llama-bench uses, can make the model stop at once).
            text = (ROOT / "edgespec" / "speculative.py").read_text()
            toks = self.engine.raw_tokens(text)
            while len(toks) < depth:
                toks += toks
            self.prompt = toks[:depth]
        vocab = self.engine.target.n_vocab
        rng = random.Random(0)  # llama-bench feeds random tokens too; content does not change the cost
        self.filler = [rng.randrange(vocab) for _ in range(max(256, n_tokens))]

    def tg(self, n_gen: int) -> tuple[float, int]:
        """Plain generation after the prompt (prefill excluded, as llama-bench's -d)."""
        e = self.engine
        e.reset()
        final = complete(e.stream(self.prompt, SamplingConfig(), max_tokens=n_gen))
        e.reset()
        return final.stats.tokens_per_s, final.stats.tokens

    def pp(self, k: int, all_rows: bool) -> float:
        t = self.engine.target
        t.reset()
        if self.depth:
            t.decode(self.prompt)  # the context the batch attends to, untimed (llama-bench -d)
        t0 = time.perf_counter()
        t.decode(self.filler[:k], range(k) if all_rows else [k - 1])
        dt = time.perf_counter() - t0
        t.reset()
        return k / dt

    def close(self) -> None:
        self.engine.close()


def spread(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", nargs="?", default=None, help="target (default: the default pair's target)")
    ap.add_argument("--threads", "-t", type=int, default=2)
    ap.add_argument("--n-gen", type=int, default=128)
    ap.add_argument("--pp", default="8,16,32,64", help="prompt batch sizes (empty: none)")
    ap.add_argument("--depth", type=int, default=0, help="context tokens before each test (llama-bench -d)")
    ap.add_argument("--kinds", default=",".join(KINDS), help="kernel kinds to measure: fast, exact or both")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    pps = [int(x) for x in a.pp.split(",") if x.strip()]
    kinds = tuple(k for k in KINDS if k in a.kinds.split(","))
    if not kinds or set(a.kinds.split(",")) - set(KINDS):
        raise SystemExit(f"--kinds: choose from {', '.join(KINDS)} (got {a.kinds!r})")
    if a.depth < 0 or a.n_gen < 1 or a.repeats < 1:
        raise SystemExit("--depth must be >= 0, --n-gen and --repeats >= 1")
    model = a.model or models.load_registry().pair(None)[0].name
    path = models.resolve(model)
    binary = _llamacpp_tools.tool("llama-bench")

    sides = {}
    for kind in kinds:
        sides[kind] = EdgespecSide(model, a.threads, kind, a.depth, max([a.n_gen, *pps]))
        sides[kind].tg(8)  # warm-up: graphs, page faults, weight repacking
        for k in pps:
            sides[kind].pp(k, True)
    tg = f"tg{a.n_gen}"
    data: dict[tuple[str, str, str], list[float]] = {}  # (kind, test, who) -> samples

    def add(kind, test, who, v):
        data.setdefault((kind, test, who), []).append(v)

    try:
        for rep in range(a.repeats):
            order = kinds if rep % 2 == 0 else tuple(reversed(kinds))
            for kind in order:
                es = sides[kind]
                first_lb = rep % 2 == 0
                if first_lb:
                    lb = llama_bench(binary, path, a.threads, a.n_gen, pps, kind, a.depth)
                tps, n = es.tg(a.n_gen)
                add(kind, tg, "edgespec", tps)
                if n != a.n_gen:
                    say(f"note: edgespec {kind} stopped after {n} of {a.n_gen} tokens")
                for k in (pps if first_lb else list(reversed(pps))):
                    add(kind, f"pp{k}", "edgespec", es.pp(k, all_rows=False))
                    add(kind, f"pp{k}", "edgespec verify", es.pp(k, all_rows=True))
                if not first_lb:
                    lb = llama_bench(binary, path, a.threads, a.n_gen, pps, kind, a.depth)
                for test, v in lb.items():
                    add(kind, test, "llama-bench", v)
                say(f"repeat {rep + 1}/{a.repeats} {kind}: llama-bench {tg} {lb[tg]:.2f}, edgespec {tps:.2f} tok/s")
    finally:
        for s in sides.values():
            s.close()

    tests = [tg] + [f"pp{k}" for k in pps]
    rows = []
    for kind in kinds:
        for test in tests:
            lb = spread(data[(kind, test, "llama-bench")])
            es = spread(data[(kind, test, "edgespec")])
            # Each repeat's two runs are neighbours in time: their ratio cancels most of a noisy
            # minute, so the median of per-repeat ratios is the figure to judge by.
            paired = [e / b for e, b in zip(data[(kind, test, "edgespec")], data[(kind, test, "llama-bench")])]
            row = {"kind": kind, "test": test, "llama_bench": lb, "edgespec": es,
                   "ratio": es["median"] / lb["median"], "paired_ratio": spread(paired)}
            if (kind, test, "edgespec verify") in data:
                v = spread(data[(kind, test, "edgespec verify")])
                row["edgespec_verify"] = v
                row["verify_ratio"] = v["median"] / lb["median"]
            rows.append(row)
    if a.json:
        print(json.dumps({"model": path.name, "threads": a.threads, "repeats": a.repeats, "depth": a.depth,
                          "llama_bench": str(binary), "rows": rows}))
        return

    def f(s):
        return f"{s['median']:.2f} ({s['min']:.2f}–{s['max']:.2f})"

    print(f"{path.name}, {a.threads} threads, depth {a.depth}, {a.repeats} interleaved repeats, medians (min–max), tok/s")
    print("fast = llama.cpp defaults (repack, -fa auto) / edgespec default; exact = llama-bench --repack 0 -fa off / edgespec exact=True")
    print()
    print("| kernels | test | llama-bench | edgespec | edgespec / llama-bench | per-repeat ratio | edgespec all-row logits | all-row / llama-bench |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        v = r.get("edgespec_verify")
        pr = r["paired_ratio"]
        paired = f"{pr['median']:.3f} ({pr['min']:.3f}–{pr['max']:.3f})"
        tail = f"{f(v)} | {r['verify_ratio']:.3f} |" if v else "– | – |"
        print(f"| {r['kind']} | {r['test']} | {f(r['llama_bench'])} | {f(r['edgespec'])} | {r['ratio']:.3f} | {paired} | {tail}")
    print()
    print("per-repeat ratio: median (min–max) of edgespec / llama-bench within each repeat (the two runs are neighbours in time).")
    print(f"{tg}: llama-bench times {a.n_gen} single-token decodes (no sampling); edgespec runs its plain generation loop "
          "(greedy sampling included). ppK: one K-token batch after the --depth context (empty by default); edgespec's last-row column "
          "matches llama-bench, the all-row column is a speculative verify batch.")


if __name__ == "__main__":
    main()
