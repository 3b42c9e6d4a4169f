"""`edgespec profile`: detect, plan, measure, persist."""

from __future__ import annotations

import json

import click

from .. import profile_store
from ..config import SpecConfig
from ..errors import EdgespecError, InputError
from ..hardware import HardwareInfo
from ..measure import MeasurementAborted, measure as measure_costs
from ..models import NullProgress
from ..plan import Plan
from ..render import stderr_console, stdout_console
from ..render.common import (RichProgress, StepProgress, devices_table, hardware_table, measurement_tables,
                             plan_table)
from ..session import profile_key, resolve
from .options import kernel_kind, load_config, model_options, spec_config
from .root import CONTEXT, cli


# ---- profile -----------------------------------------------------------------------------------
@cli.command(context_settings=CONTEXT)
@model_options
@click.option("--measure/--no-measure", default=True, show_default=True, help="Time the models (a minute or so, plus up to about 2 for the deeper context depths).")
@click.option("--force", is_flag=True,
              help="Save the measurement even when it is unstable (busy machine, noisy timings).")
@click.option("--show", is_flag=True, help="Print the saved profile and exit.")
@click.option("--json", "as_json", is_flag=True)
def profile(measure, force, show, as_json, **kw):
    """Detect the hardware, plan the offload of target + draft, measure costs, save the profile.

    prompt/chat/bench then use it automatically. The costs are measured for the kernels in use
    (fast by default, --exact for the exact ones) and kept per kind. A measurement taken while the
    machine is busy or noisy does not replace a good saved one (exit 1; --force saves it anyway).
    """
    run_profile(kw, measure=measure, show=show, as_json=as_json, spec=spec_config(kw), force=force)


def run_profile(kw: dict, *, measure: bool, show: bool, as_json: bool, spec: SpecConfig, force: bool = False) -> None:
    out = stdout_console()
    if show:
        _show(out, as_json)
        return
    resolved, plan = _plan(kw, spec)
    hw = resolved.hardware
    result = {"hardware": hw.to_json(), "plan": plan.to_json(), "rpc": list(resolved.rpc)}
    if not as_json:
        for table in (hardware_table(hw), plan_table(plan), devices_table(plan)):
            out.print(table)
        for w in plan.warnings:
            out.print(f"[yellow]warning:[/] {w}")
    kernels = kernel_kind(kw)
    m, reasons = None, []
    if measure:
        try:
            m = _measure(resolved, plan, quiet=as_json, exact=kernels == "exact", force=force)
        except MeasurementAborted as err:
            reasons = err.reasons
            result["measurement"] = {"kernels": kernels, "stable": False, "unstable_reasons": err.reasons,
                                     "load": [x.to_json() for x in err.loads], "aborted": True}
        else:
            reasons = m["unstable_reasons"]
            result["measurement"] = m
            if not as_json:
                for table in measurement_tables(m):
                    out.print(table)
                out.print(depth_line(m))
    stored = profile_store.store_profile_run(
        hw, target=profile_key(resolved.target_path),
        draft=profile_key(resolved.draft_path) if resolved.draft_path else None,
        data={"models": {"target": resolved.choice.target, "draft": resolved.choice.draft}, "plan": plan.to_json()},
        kind=kernels, measurement=m, force=force, aborted=measure and m is None)
    result["profile_path"] = str(stored.path)
    result["saved"] = stored.decision
    if as_json:
        click.echo(json.dumps(result))
    elif stored.decision in ("saved", None):
        out.print(f"saved profile: {stored.path}")
    elif stored.decision == "forced":
        out.print(f"[yellow]saved an unstable measurement (--force):[/] {stored.path}")
    problem = stored.problem(kernels, reasons)
    if problem:
        raise EdgespecError(problem)


def _show(out, as_json: bool) -> None:
    saved = profile_store.latest_profile()
    if saved is None:
        raise InputError("no saved profile yet: run `edgespec profile`")
    if as_json:
        click.echo(json.dumps(saved))
    else:
        _render_saved(out, saved)


def depth_line(m: dict) -> str:
    """t(k) at each measured context depth, for the sizes the tables above show at depth 0: one line."""
    depths = m.get("depths") or {}
    if not depths:
        return "costs measured at depth 0 only (a profile from before depth tables)"
    shown = [k for k in ("1", "8", "16", "64") if k in m["target_ms"]]
    tables = [("0", m["target_ms"])] + [(d, t["target_ms"]) for d, t in sorted(depths.items(), key=lambda kv: int(kv[0]))]
    rows = [f"{d}: " + ", ".join(f"t({k}) {ms[k]:.1f}" for k in shown if k in ms) for d, ms in tables]
    typical = (m.get("cost") or {}).get("typical")
    tail = f" (fastest runs; a typical pass {typical:.2f}x that)" if typical else ""
    return "ms at context depth " + "; ".join(rows) + tail


def _plan(kw: dict, spec: SpecConfig):

    # Profiling always considers the draft model, whatever --spec says, so the verdict is measured.
    spec_for_models = SpecConfig(mode="draft") if spec.mode in ("off", "ngram") else spec
    resolved = resolve(load_config(kw, spec_for_models), spec_for_models, progress=RichProgress(stderr_console()),
                       kernels=kernel_kind(kw))
    return resolved, resolved.plan


def _measure(resolved, plan, *, quiet: bool, exact: bool, force: bool = False) -> dict:

    progress = NullProgress() if quiet else StepProgress(stderr_console())
    m = measure_costs(resolved.target_path, resolved.draft_path, plan, progress=progress, exact=exact, stop_when_busy=not force)
    return m.to_json()


def _render_saved(out, saved: dict) -> None:

    out.print(f"profile created {saved.get('created')} (edgespec {saved.get('edgespec_version')}, llama-cpp-python {saved.get('llama_cpp_version')})")
    out.print(f"target {saved.get('target')}, draft {saved.get('draft')}")
    if saved.get("hardware"):
        out.print(hardware_table(HardwareInfo.from_json(saved["hardware"])))
    data = saved.get("data", {})
    if data.get("plan"):
        out.print(plan_table(Plan.from_json(data["plan"])))

    for kind, m in sorted(profile_store.saved_measurements(saved).items()):
        if "target_ms" not in m:
            out.print(f"{kind} kernels: costs from an older profile (no timings kept); rerun `edgespec profile` to see them")
            continue
        for table in measurement_tables({"kernels": kind, **m}):
            out.print(table)
        if m.get("depths"):
            out.print(depth_line(m))
        if not profile_store.usable(m):
            out.print(f"[yellow]the {kind}-kernel measurement is unstable and not used[/]")
    for w in saved.get("warnings", []):
        out.print(f"[yellow]warning:[/] {w}")
