"""`edgespec profile`: detect, plan, measure, persist."""

from __future__ import annotations

import json

import click

from .. import profile_store
from ..config import SpecConfig
from ..errors import EdgespecError, InputError
from .options import kernel_kind, model_options, spec_config
from .root import CONTEXT, cli


# ---- profile -----------------------------------------------------------------------------------
@cli.command(context_settings=CONTEXT)
@model_options
@click.option("--measure/--no-measure", default=True, show_default=True, help="Time the models (a minute or so).")
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
    from ..render import stdout_console
    from ..render.common import devices_table, hardware_table, measurement_tables, plan_table

    out = stdout_console()
    if show:
        saved = profile_store.latest_profile()
        if saved is None:
            raise InputError("no saved profile yet: run `edgespec profile`")
        if as_json:
            click.echo(json.dumps(saved))
            return
        _render_saved(out, saved)
        return
    resolved, plan = _plan(kw, spec)
    hw = resolved.hardware
    result = {"hardware": hw.to_json(), "plan": plan.to_json(), "rpc": list(resolved.rpc)}
    if not as_json:
        out.print(hardware_table(hw))
        out.print(plan_table(plan))
        out.print(devices_table(plan))
        for w in plan.warnings:
            out.print(f"[yellow]warning:[/] {w}")
    from ..session import profile_key

    target_key = profile_key(resolved.target_path)
    draft_key = profile_key(resolved.draft_path) if resolved.draft_path else None
    keys = [draft_key] if draft_key is None else [None, draft_key]  # the pair's file last: its verdict counts
    kernels = kernel_kind(kw)
    m = None
    decision = aborted = None
    if measure:
        from ..measure import MeasurementAborted

        try:
            m = _measure(resolved, plan, quiet=as_json, exact=kernels == "exact", force=force)
        except MeasurementAborted as err:
            aborted = err.reasons
            result["measurement"] = {"kernels": kernels, "stable": False, "unstable_reasons": err.reasons,
                                     "load": [x.to_json() for x in err.loads], "aborted": True}
        else:
            result["measurement"] = m
            if not as_json:
                for table in measurement_tables(m):
                    out.print(table)
    for draft in keys:
        # The target's verify costs hold without a draft too (--spec ngram/off look them up so).
        saved = profile_store.load_profile(hw, target_key, draft)
        measurements = profile_store.saved_measurements(saved)
        if m is not None:
            measurements, decision = profile_store.merge_measurement(saved, kernels, m, force=force)
        data = {"models": {"target": resolved.choice.target, "draft": resolved.choice.draft},
                "plan": plan.to_json(), "measurements": measurements}
        path = profile_store.save_profile(data, hw=hw, target_sha_or_name=target_key, draft=draft)
    result["profile_path"] = str(path)
    result["saved"] = "aborted" if aborted else decision
    if as_json:
        click.echo(json.dumps(result))
    elif decision in ("saved", None) and not aborted:
        out.print(f"saved profile: {path}")
    elif decision == "forced":
        out.print(f"[yellow]saved an unstable measurement (--force):[/] {path}")
    if aborted:
        kept = ("kept the saved profile's costs" if profile_store.saved_costs({"data": {"measurements": measurements}}).get(kernels)
                else "runs use estimated costs until a stable profile is measured")
        raise EdgespecError(
            f"profile not measured, the machine is busy ({'; '.join(aborted)}): {kept}; rerun `edgespec profile` "
            "when it is quiet, or pass --force to measure anyway"
        )
    if decision in ("kept", "unstable"):
        kept = ("kept the saved profile's costs" if decision == "kept"
                else "runs use estimated costs until a stable profile is measured")
        raise EdgespecError(
            f"profile unstable ({'; '.join(m['unstable_reasons'])}): {kept}; rerun `edgespec profile` "
            "on a quiet machine, or pass --force to use this measurement"
        )


def _plan(kw: dict, spec: SpecConfig):
    from .options import load_config
    from ..render import stderr_console
    from ..render.common import RichProgress
    from ..session import resolve

    # Profiling always considers the draft model, whatever --spec says, so the verdict is measured.
    spec_for_models = SpecConfig(mode="draft") if spec.mode in ("off", "ngram") else spec
    resolved = resolve(load_config(kw, spec_for_models), spec_for_models, progress=RichProgress(stderr_console()),
                       kernels=kernel_kind(kw))
    return resolved, resolved.plan


def _measure(resolved, plan, *, quiet: bool, exact: bool, force: bool = False) -> dict:
    from ..measure import measure
    from ..models import NullProgress
    from ..render import stderr_console
    from ..render.common import StepProgress

    progress = NullProgress() if quiet else StepProgress(stderr_console())
    m = measure(resolved.target_path, resolved.draft_path, plan, progress=progress, exact=exact, stop_when_busy=not force)
    return m.to_json()


def _render_saved(out, saved: dict) -> None:
    from ..hardware import HardwareInfo
    from ..plan import Plan
    from ..render.common import hardware_table, measurement_tables, plan_table

    out.print(f"profile created {saved.get('created')} (edgespec {saved.get('edgespec_version')}, llama-cpp-python {saved.get('llama_cpp_version')})")
    out.print(f"target {saved.get('target')}, draft {saved.get('draft')}")
    if saved.get("hardware"):
        out.print(hardware_table(HardwareInfo.from_json(saved["hardware"])))
    data = saved.get("data", {})
    if data.get("plan"):
        out.print(plan_table(Plan.from_json(data["plan"])))
    from ..profile_store import saved_measurements, usable

    for kind, m in sorted(saved_measurements(saved).items()):
        if "target_ms" not in m:
            out.print(f"{kind} kernels: costs from an older profile (no timings kept); rerun `edgespec profile` to see them")
            continue
        for table in measurement_tables({"kernels": kind, **m}):
            out.print(table)
        if not usable(m):
            out.print(f"[yellow]the {kind}-kernel measurement is unstable and not used[/]")
    for w in saved.get("warnings", []):
        out.print(f"[yellow]warning:[/] {w}")
