"""From what the user asked for to a loaded Engine: pick models, resolve them, plan, load.

Precedence: flags/env (already merged by click) > the saved profile's models > models.toml's
default pair. The saved profile also supplies the measured cost model.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from . import models, profile_store
from .backend.model import LoadParams
from .config import LoadConfig, SpecConfig
from .costs import CostModel
from .draft_auto import best_draft, rank_drafts
from .engine import Engine, EngineConfig
from .errors import InputError
from .gguf import read_gguf
from .hardware import HardwareInfo, detect
from .plan import ModelPlacement, ModelShape, Plan, make_plan
from .backend import rpc


AUTO = "auto"  # --draft auto: pick the draft among the models on this machine


@dataclass(frozen=True)
class ModelChoice:
    target: str
    draft: str | None


def choose_models(model: str | None, model_draft: str | None, pair: str | None, spec: SpecConfig) -> ModelChoice:
    if pair and model:
        raise InputError("give either --pair or -m/--model, not both")
    if pair:
        target, draft = models.load_registry().pair(pair)
        choice = ModelChoice(target.name, draft.name)
    elif model:
        choice = ModelChoice(model, model_draft)
    else:
        saved = profile_store.latest_profile()
        refs = (saved or {}).get("data", {}).get("models") or {}
        if refs.get("target"):
            choice = ModelChoice(refs["target"], model_draft or refs.get("draft"))
        else:
            target, draft = models.load_registry().pair(None)
            choice = ModelChoice(target.name, model_draft or draft.name)
    if not spec.uses_draft_model:
        return ModelChoice(choice.target, None)  # n-gram and plain need no second model
    return choice


def profile_key(path: Path) -> str:
    return path.name


@dataclass(frozen=True)
class Resolved:
    choice: ModelChoice
    target_path: Path
    draft_path: Path | None
    hardware: HardwareInfo
    plan: Plan
    cost: CostModel | None
    profile: dict | None
    rpc: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()  # one line each for the user, e.g. which draft `--draft auto` picked


def resolve(load: LoadConfig, spec: SpecConfig, progress=None, *, hardware: HardwareInfo | None = None,
            kernels: str = "fast") -> Resolved:
    choice = ModelChoice(load.target, load.draft if spec.uses_draft_model else None)
    target_path = models.resolve(choice.target, progress=progress)
    auto = choice.draft == AUTO
    draft_path = models.resolve(choice.draft, progress=progress) if choice.draft and not auto else None
    if load.rpc:
        rpc.connect(load.rpc)  # before detect(): the servers' devices join the ones it lists
    hw = hardware or detect()
    notes: tuple[str, ...] = ()
    if auto:
        choice, draft_path, notes = _auto_draft(choice, target_path, hw, load)
    plan = make_plan(
        hw,
        ModelShape.from_gguf(read_gguf(target_path)),
        ModelShape.from_gguf(read_gguf(draft_path)) if draft_path else None,
        n_ctx=load.n_ctx,
        type_k=load.type_k,
        type_v=load.type_v,
        n_gpu_layers=load.n_gpu_layers,
        n_gpu_layers_draft=load.n_gpu_layers_draft,
        threads=load.threads,
        threads_draft=load.threads_draft,
        gpu_memory=load.gpu_memory,
        n_seq=load.n_seq,
    )
    saved = profile_store.load_profile(hw, profile_key(target_path), profile_key(draft_path) if draft_path else None)
    if saved is None and draft_path is not None:
        # A profile measured without the draft still knows the target's verify costs.
        saved = profile_store.load_profile(hw, profile_key(target_path), None)
    cost, warnings = _cost(saved, kernels)
    return Resolved(choice, target_path, draft_path, hw, plan, cost, saved, load.rpc, warnings, notes)


def _auto_draft(choice: ModelChoice, target_path: Path, hw: HardwareInfo, load: LoadConfig):
    """`--draft auto`: the best compatible draft on this machine, or none (the n-gram drafter remains)."""
    ranked = rank_drafts(target_path, hw, n_ctx=load.n_ctx, type_k=load.type_k, type_v=load.type_v,
                         gpu_memory=load.gpu_memory)
    best = best_draft(ranked)
    if best is None:
        why = f"{len(ranked)} compatible, none fits beside the target" if ranked else "none compatible on this machine"
        return ModelChoice(choice.target, None), None, (f"--draft auto: no draft model ({why}; edgespec doctor {choice.target} --drafts)",)
    return (ModelChoice(choice.target, best.model.ref), best.model.path,
            (f"--draft auto: {best.line()}",))


def _cost(saved: dict | None, kernels: str) -> tuple[CostModel | None, tuple[str, ...]]:
    """The measured costs for the kernels in use: exact and fast kernels price batches differently."""
    costs = profile_store.saved_costs(saved)
    if kernels in costs:
        return CostModel.from_json(costs[kernels]), ()
    if costs:
        flag = " --exact" if kernels == "exact" else ""
        return None, (f"the saved profile was measured with {', '.join(costs)} kernels, not {kernels}: "
                      f"auto uses estimated costs until `edgespec profile{flag}` measures these",)
    return None, ()


def load_params(place: ModelPlacement, plan: Plan) -> LoadParams:
    return LoadParams(
        n_ctx=plan.n_ctx,
        n_threads=place.threads,
        n_gpu_layers=place.n_gpu_layers,
        main_gpu=place.main_gpu,
        tensor_split=place.tensor_split,
        type_k=plan.type_k,
        type_v=plan.type_v,
        n_batch=plan.n_batch,
    )


def open_engine(resolved: Resolved, spec: SpecConfig, *, exact: bool = False) -> Engine:
    plan = resolved.plan
    config = EngineConfig(
        target_path=resolved.target_path,
        target_params=load_params(plan.target, plan),
        draft_path=resolved.draft_path,
        draft_params=load_params(plan.draft, plan) if plan.draft and resolved.draft_path else None,
        spec=spec,
        cost=resolved.cost,
        exact=exact,
        n_seq=plan.n_seq,
    )
    return Engine(config)
