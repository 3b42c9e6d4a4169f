"""`--draft auto`: among the models on this machine, the drafts that can speculate for a target,
ranked by what the plan expects them to pay.

A candidate must share the target's vocabulary (identical, or mapped: compat.py), be a different
file, and fit beside the target (make_plan). Its expected speed-up is the controller's own
formula at the prior acceptance rate (a candidate the controller would rule out by its cost
alone is not picked), with the draft's cost per token relative to the target's
taken from a measured profile of this pair when there is one, else from the size ratio (decoding
reads every weight once per token, so cost follows bytes). Headers only: nothing is loaded.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from . import profile_store
from .compat import pair_vocabularies
from .controller import Controller, candidate_ks, speedup
from .costs import CostModel
from .errors import EdgespecError, IncompatibleModelsError
from .gguf import GGUFInfo, read_gguf
from .hardware import HardwareInfo
from .models.local import LocalModel, local_headers
from .plan import ModelShape, make_plan

PRIOR_ACCEPTANCE = 0.6  # the acceptance guess the engine starts a draft model at (engine.PRIORS)
K_MAX = 16  # draft lengths compared, as far as the default --draft-max without a profile


@dataclass(frozen=True)
class Candidate:
    model: LocalModel
    vocab: str  # "identical" or "mapped"
    pairing: str  # compat's one line
    fits: bool
    fit_detail: str
    cost_ratio: float  # draft cost per token / target's
    measured: bool  # cost_ratio from a saved profile of this pair
    expected_speedup: float  # at PRIOR_ACCEPTANCE and the best draft length (ranks the candidates)
    can_pay: bool  # the controller's rule: a near-perfect drafter at this cost would beat plain decoding

    @property
    def usable(self) -> bool:
        # Fitting is enough: the acceptance prior is only a starting guess (same-family drafts often
        # accept far more), and under --spec auto the controller keeps a draft off while it does not pay.
        return self.fits

    def line(self) -> str:
        cost = f"cost {self.cost_ratio:.2f}× the target's per token ({'measured' if self.measured else 'from size'})"
        pays = "" if self.can_pay else " (by these costs it cannot pay even at full acceptance; --spec auto keeps it off unless it does)"
        return (f"{self.model.ref}: {self.pairing}; {cost}; expected {self.expected_speedup:.2f}× "
                f"at acceptance {PRIOR_ACCEPTANCE}{pays}")


def rank_drafts(target_path: Path, hw: HardwareInfo, *, n_ctx: int | None = None,
                type_k: str = "f16", type_v: str = "f16", gpu_memory: int | None = None) -> list[Candidate]:
    """Every compatible draft on this machine, best first (usable ones before the rest)."""
    target = read_gguf(target_path, vocab=True)
    if target.vocab is None:
        return []
    out = []
    for model, info in local_headers():
        if info.vocab is None or _same_file(model.path, target_path):
            continue
        try:
            pairing = pair_vocabularies(target.vocab, info.vocab, target_name=target_path.name, draft_name=model.path.name)
        except IncompatibleModelsError:
            continue
        fits, fit_detail = _fits(hw, target, info, n_ctx, type_k, type_v, gpu_memory)
        cost, ratio, measured = _costs(hw, target_path, model.path, target, info)
        controller = Controller(cost, k_max=K_MAX, learn_timing=False)
        best = max(speedup(PRIOR_ACCEPTANCE, k, ratio, controller.cost) for k in candidate_ks(1, K_MAX))
        out.append(Candidate(model, pairing.kind, pairing.summary, fits, fit_detail, ratio, measured, best,
                             controller.could_pay(ratio)))
    return sorted(out, key=lambda c: (not c.usable, not c.can_pay, -c.expected_speedup, c.model.ref))


def best_draft(candidates: list[Candidate]) -> Candidate | None:
    return candidates[0] if candidates and candidates[0].usable else None


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve() or a.samefile(b)
    except OSError:
        return False


def _fits(hw, target: GGUFInfo, draft: GGUFInfo, n_ctx, type_k, type_v, gpu_memory) -> tuple[bool, str]:
    try:
        plan = make_plan(hw, ModelShape.from_gguf(target), ModelShape.from_gguf(draft), n_ctx=n_ctx,
                         type_k=type_k, type_v=type_v, gpu_memory=gpu_memory)
    except EdgespecError as err:
        return False, err.message
    return True, f"fits beside the target: context {plan.n_ctx}, draft {plan.draft.n_gpu_layers} GPU layers"


def _costs(hw, target_path: Path, draft_path: Path, target: GGUFInfo, draft: GGUFInfo) -> tuple[CostModel, float, bool]:
    """(verify costs, draft cost ratio, whether the ratio was measured): a profile of this pair
    gives both; a profile of the target alone its verify costs; else the prior and the size ratio."""
    by_size = draft.tensor_bytes / max(1, target.tensor_bytes)
    for key, measured in ((draft_path.name, True), (None, False)):
        saved = profile_store.load_profile(hw, target_path.name, key)
        for data in profile_store.saved_costs(saved).values():
            cost = CostModel.from_json(data)
            return cost, (cost.draft_cost if measured else by_size), measured
    return CostModel(), by_size, False
