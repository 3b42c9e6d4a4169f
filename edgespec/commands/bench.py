"""`edgespec bench`: plain vs speculative decoding on a prompt set, in one process."""

from __future__ import annotations

import json
import sys
from functools import partial
from pathlib import Path

import click

from ..bench.prompts import BUILTIN, DEFAULT_MODES, filter_categories, load_prompts, parse_modes, split_list
from ..bench.results import BenchResult
from ..bench.runner import run_bench
from ..config import Mode
from ..render import stderr_console, stdout_console
from ..render.bench import print_event, render_results
from ..sampling import SamplingConfig
from .options import POSITIVE, kernel_kind, model_options, open_engine, spec_config
from .root import CONTEXT, cli


@cli.command(context_settings=CONTEXT)
@model_options
@click.option("--prompts", "prompts_file", type=click.Path(dir_okay=False, path_type=Path),
              help='JSONL prompt set: {"id", "category", "prompt", optional "system", "max_tokens", "prefill"} per line '
                   '("prefill": the answer\'s start, already written; generation goes on from it). Default: the built-in set.')
@click.option("--modes", default=",".join(DEFAULT_MODES), show_default=True,
              help="Comma-separated modes; off (the baseline) always runs. Modes needing a draft model are skipped without one.")
@click.option("--category", "categories", multiple=True, help="Only prompts of this category (repeatable, or comma-separated).")
@click.option("-n", "--max-tokens", type=POSITIVE, envvar="EDGESPEC_MAX_TOKENS", help="Cap on generated tokens per prompt (default: each prompt's max_tokens, else 128).")
@click.option("--repeats", type=POSITIVE, default=3, show_default=True,
              help="Runs per prompt and mode (modes interleaved per repeat); the median is reported with the spread.")
@click.option("--verify", is_flag=True,
              help="Compare every mode's greedy output with plain decoding; exit 1 on a difference "
                   "(with fast kernels only on one that is not a near-tie; with --exact on any).")
@click.option("--temperature", "--temp", type=float, default=0.0, show_default=True, help="0 is greedy.")
@click.option("--seed", type=int, help="Seed for sampling (temperature > 0).")
@click.option("--no-warmup", is_flag=True, help="Skip the untimed warm-up generation.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of the table.")
@click.option("-q", "--quiet", is_flag=True, help="No per-run progress on stderr.")
def bench(prompts_file, modes, categories, max_tokens, repeats, verify, temperature, seed, no_warmup, as_json, quiet, **kw):
    """Baseline vs speculative decoding: tok/s, speedup, acceptance, tokens per pass, TTFT, latency.

    Every run starts from empty KV caches with a fresh controller; tok/s counts generation only.

    \b
    edgespec bench                                   # built-in set, all modes
    edgespec bench --modes off,ngram,auto --verify -t 2
    edgespec bench --prompts mine.jsonl --repeats 3 --json
    """
    mode_list = parse_modes(modes)
    prompts = filter_categories(load_prompts(prompts_file), split_list(categories))
    sampling = SamplingConfig(temperature=temperature, seed=seed)
    # Load the draft model only when some requested mode can use it.
    spec = spec_config(kw, mode=Mode.AUTO if any(m.uses_draft_model for m in mode_list) else Mode.OFF)
    resolved, engine = open_engine(kw, spec, quiet=as_json)
    with engine:
        result = run_bench(engine, prompts, mode_list, sampling, repeats=repeats, max_tokens=max_tokens,
                           verify=verify, exact=kernel_kind(kw) == "exact", warmup=not no_warmup,
                           on_event=None if quiet else partial(print_event, stderr_console()))
        result.config = {**_models_config(resolved, engine), "temperature": temperature, "seed": seed,
                         "repeats": repeats, "kernels": kernel_kind(kw), "max_tokens": max_tokens,
                         "prompt_set": str(prompts_file) if prompts_file else BUILTIN, "prompts": len(prompts),
                         "draft_prefill": DRAFT_PREFILL}
    if as_json:
        click.echo(json.dumps(result.to_json()))
    else:
        render_results(stdout_console(), stderr_console(), result)
    if verify and not result.verify_ok:
        _fail_verify(result, as_json)


DRAFT_PREFILL = ("draft/combined: done before timing, excluded from tok/s, included in ttft_ms; "
                 "auto: lazy, counted in tok/s when the draft model is used")


def _models_config(resolved, engine) -> dict:
    """What ran where: the models and threads as the plan placed them (the draft only if loaded)."""
    plan, draft = resolved.plan, engine.draft is not None
    return {
        "target": resolved.target_path.name,
        "draft": resolved.draft_path.name if draft and resolved.draft_path else None,
        "threads": plan.target.threads,
        "threads_draft": plan.draft.threads if plan.draft and draft else None,
        "n_ctx": plan.n_ctx,
    }


def _fail_verify(result: BenchResult, as_json: bool) -> None:
    if as_json:  # the table already said it
        click.echo(f"error: verify: {len(result.failing_differences())} run(s) differ from plain decoding"
                   + ("" if result.exact else " where it was not a near-tie"), err=True)
    sys.exit(1)


# `--spec` makes no sense here (--modes chooses); drop it from this command only.
bench.params = [p for p in bench.params if p.name != "spec_mode"]
