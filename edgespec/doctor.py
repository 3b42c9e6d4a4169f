"""`edgespec doctor`: what a GGUF is, whether a pair works together and fits, whether the build is safe.

Reads GGUF headers only: no weights are loaded and nothing is downloaded.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from . import models, profile_store
from .compat import compatible
from .draft_auto import Candidate, rank_drafts
from .errors import EdgespecError
from .gguf import GGUFInfo, read_gguf
from .hardware import detect
from .plan import ModelShape, make_plan
from .backend import devices
from .hardware import cpu_features


@dataclass
class ModelReport:
    ref: str
    path: Path | None = None
    info: GGUFInfo | None = None
    error: str | None = None
    error_code: int | None = None  # the exit code of the error (3 missing, 4 not a usable GGUF, ...)

    def to_json(self) -> dict:
        if self.info is None:
            return {"ref": self.ref, "error": self.error}
        i = self.info
        v = i.vocab
        return {
            "ref": self.ref,
            "path": str(self.path),
            "architecture": i.architecture,
            "name": i.name,
            "quant": i.quant,
            "file_size": i.file_size,
            "n_params": i.n_params,
            "n_layers": i.n_layers,
            "n_ctx_train": i.n_ctx_train,
            "vocab": None if v is None else {"model": v.model, "n_tokens": v.n_tokens, "bos": v.bos_id, "eos": v.eos_id},
            "chat_template": i.chat_template is not None,
        }


@dataclass
class DoctorReport:
    models: list[ModelReport] = field(default_factory=list)
    pair: tuple[bool, str] | None = None
    fit: tuple[bool, str] | None = None
    build: list[tuple[bool, str]] = field(default_factory=list)
    drafts: list[Candidate] | None = None  # with --drafts: the compatible drafts here, best first

    @property
    def ok(self) -> bool:
        checks = [m.error is None for m in self.models] + [ok for ok, _ in self.build]
        for item in (self.pair, self.fit):
            if item is not None:
                checks.append(item[0])
        return all(checks)

    @property
    def exit_code(self) -> int:
        """0 when all is well; an unreadable model's own code (3 missing, 4 malformed); else 1."""
        for m in self.models:
            if m.error is not None:
                return m.error_code or 1
        return 0 if self.ok else 1

    def to_json(self) -> dict:
        pair = None if self.pair is None else {"compatible": self.pair[0], "detail": self.pair[1]}
        fit = None if self.fit is None else {"fits": self.fit[0], "detail": self.fit[1]}
        return {
            "ok": self.ok,
            "models": [m.to_json() for m in self.models],
            "pair": pair,
            "fit": fit,
            "build": [{"ok": ok, "detail": d} for ok, d in self.build],
            "drafts": None if self.drafts is None else [_candidate_json(c) for c in self.drafts],
        }


def _candidate_json(c: Candidate) -> dict:
    return {"ref": c.model.ref, "path": str(c.model.path), "vocab": c.vocab, "detail": c.pairing,
            "fits": c.fits, "fit_detail": c.fit_detail, "cost_ratio": round(c.cost_ratio, 4),
            "cost_measured": c.measured, "expected_speedup": round(c.expected_speedup, 3), "usable": c.usable}


def inspect_model(ref: str) -> ModelReport:
    report = ModelReport(ref)
    try:
        report.path = models.resolve(ref, allow_download=False)
        report.info = read_gguf(report.path, vocab=True)
        _check_readable(report.info)
    except EdgespecError as err:
        report.info = None
        report.error, report.error_code = err.message, err.exit_code
    return report


def _check_readable(info: GGUFInfo) -> None:
    # What the report shows must be there: a header can parse and still lack these.
    for name in ("architecture", "quant", "n_params", "n_layers", "n_ctx_train"):
        getattr(info, name)


def check_pair(target: ModelReport, draft: ModelReport) -> tuple[bool, str]:
    if target.info is None or draft.info is None or not target.info.vocab or not draft.info.vocab:
        return False, "cannot compare: a model could not be read"
    return compatible(target.info.vocab, draft.info.vocab, target_name=target.path.name, draft_name=draft.path.name)


def check_fit(target: ModelReport, draft: ModelReport | None) -> tuple[bool, str]:
    if target.info is None or (draft is not None and draft.info is None):
        return False, "cannot plan: a model could not be read"
    hw = detect()
    saved = profile_store.load_profile(hw, target.path.name, draft.path.name if draft else None)
    try:
        plan = make_plan(hw, ModelShape.from_gguf(target.info), ModelShape.from_gguf(draft.info) if draft else None)
    except EdgespecError as err:
        return False, err.message
    where = f"target {plan.target.n_gpu_layers} GPU layers" + (f", draft {plan.draft.n_gpu_layers} GPU layers" if plan.draft else "")
    source = "saved profile" if saved else "no saved profile yet (run edgespec profile)"
    return True, f"fits: context {plan.n_ctx}, {where}; {source}"


def check_build() -> list[tuple[bool, str]]:

    info = devices.system_info()
    if not info:
        return [(False, "llama-cpp-python is not importable: run scripts/setup")]
    results = [(True, f"llama-cpp-python {devices.llama_cpp_version()}: {info.strip()}")]
    # A native build on an AMX CPU crashes in ggml_backend_amx_mul_mat on batched decodes.
    if "AMX" in cpu_features() and "AMX_INT8 = 1" in info:
        results.append((False, "this llama.cpp build enables AMX, which crashes on batched decoding here; rebuild with scripts/setup"))
    if "LLAMAFILE = 1" in info:
        results.append((False, "this build uses llamafile sgemm, so speculative output can drift from plain decoding; rebuild with scripts/setup (-DGGML_LLAMAFILE=OFF)"))
    results.append((True, "GPU offload supported" if devices.supports_gpu_offload() else "CPU-only build (no GPU offload)"))
    return results


def diagnose(refs: list[str], *, drafts: bool = False) -> DoctorReport:
    """refs: none (the default pair), a model, or a target and a draft. drafts: also rank every
    compatible draft on this machine for the (first) model."""
    report = DoctorReport()
    if not refs:
        target, draft = models.load_registry().pair(None)
        refs = [target.name, draft.name]
        report.build = check_build()
    if len(refs) > 2:
        raise EdgespecError("doctor takes one model, or a target and a draft")
    report.models = [inspect_model(r) for r in refs]
    if any(m.error is not None for m in report.models):
        return report  # the error line says it all; pair and fit cannot be judged without the model
    if len(report.models) == 2:
        report.pair = check_pair(report.models[0], report.models[1])
    report.fit = check_fit(report.models[0], report.models[1] if len(report.models) == 2 else None)
    if drafts:
        report.drafts = rank_drafts(report.models[0].path, detect())
    return report
