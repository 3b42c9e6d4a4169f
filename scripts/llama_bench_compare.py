#!/usr/bin/env python3
"""Plain decoding through edgespec's loop vs llama.cpp's llama-bench tg on the same model.

usage: scripts/llama_bench_compare.py LLAMA_BENCH_BINARY [MODEL] [--threads 2] [--n-gen 128]
Both kernel configurations are measured: edgespec's exact one (llama-bench --repack 0 -fa off)
and --fast-kernels (llama-bench defaults). Prints a small table; asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import subprocess

from edgespec import models
from edgespec.backend.model import LoadParams
from edgespec.engine import Engine, EngineConfig
from edgespec.generate import complete
from edgespec.config import SpecConfig
from edgespec.sampling import SamplingConfig


def llama_bench(binary: str, model: str, threads: int, n_gen: int, exact: bool) -> float:
    args = [binary, "-m", model, "-p", "0", "-n", str(n_gen), "-t", str(threads), "-r", "3", "-o", "json"]
    args += ["--repack", "0", "-fa", "off"] if exact else []
    out = subprocess.run(args, capture_output=True, text=True, check=True).stdout
    return float(json.loads(out)[0]["avg_ts"])


def edgespec_plain(model: str, threads: int, n_gen: int, exact: bool) -> float:
    params = LoadParams(n_ctx=1024, n_threads=threads)
    cfg = EngineConfig(models.resolve(model), params, spec=SpecConfig(mode="off"), exact=exact)
    with Engine(cfg) as engine:
        prompt = engine.raw_tokens("The")
        runs = []
        for _ in range(3):
            engine.reset()
            final = complete(engine.stream(prompt, SamplingConfig(), max_tokens=n_gen))
            runs.append(final.stats.tokens_per_s)
        return sorted(runs)[1]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("binary")
    ap.add_argument("model", nargs="?", default="qwen2.5-coder-1.5b-instruct-q4_k_m")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--n-gen", type=int, default=128)
    a = ap.parse_args()
    path = str(models.resolve(a.model))
    print(f"| kernels | llama-bench tg{a.n_gen} (tok/s) | edgespec plain (tok/s) | ratio |")
    print("|---|---|---|---|")
    for exact in (True, False):
        lb = llama_bench(a.binary, path, a.threads, a.n_gen, exact)
        es = edgespec_plain(a.model, a.threads, a.n_gen, exact)
        print(f"| {'exact (repack 0, fa off)' if exact else 'fast (defaults)'} | {lb:.2f} | {es:.2f} | {es / lb:.3f} |", flush=True)


if __name__ == "__main__":
    main()
