"""Engine: a loaded target (and optional draft) plus everything one generation needs.

The CLI, the chat REPL and the benchmark all go through `Engine.stream`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Iterator, Sequence

from .backend.model import LlamaModel, LoadParams
from .config import SpecConfig
from .controller import Controller
from .costs import CostModel
from .errors import ContextError, InputError
from .generate import Chunk, Final, stream
from .sampling import SamplingConfig
from .speculative import ModelDrafter, NgramDrafter, SpecSettings, SpeculativeDecoder
from .template import Message, render_segments

# Starting acceptance guesses; the controller replaces them with measurements within a few rounds.
PRIORS = {"draft": 0.6}  # the n-gram drafter brings its own guess per copy state (drafters.PRIORS)


@dataclass(frozen=True)
class EngineConfig:
    target_path: Path
    target_params: LoadParams
    draft_path: Path | None = None
    draft_params: LoadParams | None = None
    spec: SpecConfig = SpecConfig()
    cost: CostModel | None = None  # measured by `edgespec profile`; None: a CPU-shaped prior
    exact: bool = False  # True: batch-invariant target kernels, greedy output identical to plain decoding


def default_draft_max(cost: CostModel | None) -> int:
    """Draft as far as the profile measured verify batches (a batch holds the drafts plus one token):
    beyond that the cost model only extrapolates. 16 without a profile."""
    measured = [k for k in (cost.verify if cost else {}) if k > 1]
    return max(1, min(64, max(measured) - 1)) if measured else 16


def check_compatible(target_path: Path, draft_path: Path) -> None:
    """Refuse a draft whose vocabulary differs from the target's (headers only, before loading)."""
    from .compat import check_pair
    from .gguf import read_gguf

    t = read_gguf(target_path, vocab=True)
    d = read_gguf(draft_path, vocab=True)
    if t.vocab is None or d.vocab is None:
        missing = target_path if t.vocab is None else draft_path
        raise InputError(f"{missing.name} has no tokenizer vocabulary in its header; cannot check the pair")
    check_pair(t.vocab, d.vocab, target_name=target_path.name, draft_name=draft_path.name)


class Engine:
    def __init__(self, config: EngineConfig):
        self.config = config
        self.spec = config.spec
        if config.draft_path is not None and config.spec.uses_draft_model:
            check_compatible(config.target_path, config.draft_path)
        # The target's logits decide the output, so they must not depend on the verify batch size.
        self.target = LlamaModel(config.target_path, replace(config.target_params, exact=config.exact))
        self.draft: LlamaModel | None = None
        try:
            if config.draft_path is not None and config.spec.uses_draft_model:
                self.draft = LlamaModel(config.draft_path, config.draft_params or config.target_params)
        except BaseException:
            self.target.close()
            raise
        self.cost = config.cost or CostModel()
        self.draft_max = config.spec.draft_max or default_draft_max(config.cost)
        self._controller: Controller | None = None
        self.last_controller: Controller | None = None  # the one the latest decoder used (for its notices)
        self._template = self.target.chat_template()

    def close(self) -> None:
        for m in (self.target, self.draft):
            if m is not None:
                m.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def reset(self, *, forget_learning: bool = False) -> None:
        """Empty both KV caches; optionally forget what the controller learnt (bench isolation)."""
        for model in (self.target, self.draft):
            if model is not None:
                model.reset()
        if forget_learning:
            self._controller = None

    # ---- prompts -------------------------------------------------------------------------
    def chat_tokens(self, messages: Sequence[Message]) -> list[int]:
        bos_text = self.target.token_text(self.target.bos) if self.target.bos >= 0 else ""
        eos_text = self.target.token_text(self.target.eos) if self.target.eos >= 0 else ""
        segments = render_segments(self._template, messages, bos_token=bos_text, eos_token=eos_text)
        tokens: list[int] = []
        for text, is_content in segments:
            tokens += self.target.tokenize(text, special=not is_content)
        return tokens

    def raw_tokens(self, text: str) -> list[int]:
        return self.target.tokenize(text, special=False, add_bos=self.target.add_bos)

    # ---- generation ----------------------------------------------------------------------
    def _new_controller(self, mode: str, learn_timing: bool) -> Controller:
        return Controller(
            replace(self.cost, verify=dict(self.cost.verify)),
            k_min=self.spec.draft_min,
            k_max=max(self.draft_max, self.spec.draft_min),
            allow_off=mode == "auto",
            learn_timing=learn_timing,
            priors=PRIORS,
        )

    def controller(self, sampling: SamplingConfig, mode: str) -> Controller:
        """The session's controller (it keeps learning across turns), or a fresh one when needed.

        A seeded sampler must make the same choices every run, so it gets a fresh controller
        that does not learn from wall-clock timing; a one-off mode (bench) gets its own.
        """
        seeded = not sampling.greedy and sampling.seed is not None
        if seeded or mode != self.spec.mode:
            return self._new_controller(mode, learn_timing=not seeded)
        if self._controller is None:
            self._controller = self._new_controller(mode, learn_timing=True)
        return self._controller

    def decoder(self, sampling: SamplingConfig, mode: str | None = None, *, record_margins: bool = False) -> SpeculativeDecoder:
        spec = self.spec if mode is None else replace(self.spec, mode=mode)
        drafter = None
        if self.draft is not None and spec.mode in ("draft", "combined", "auto"):
            drafter = ModelDrafter(self.draft, sampling, p_min=spec.draft_p_min, n_vocab_target=self.target.n_vocab)
        ngram = NgramDrafter(spec.ngram_min, spec.ngram_max) if spec.mode in ("ngram", "combined", "auto") else None
        if spec.mode in ("draft",) and drafter is None:
            raise InputError("--spec draft needs a draft model: pass -md/--model-draft or --pair")
        settings = SpecSettings(mode=spec.mode, draft_min=spec.draft_min, draft_max=max(self.draft_max, spec.draft_min))
        ctl = self.last_controller = self.controller(sampling, spec.mode)
        return SpeculativeDecoder(self.target, sampling, ctl, settings, ngram=ngram, drafter=drafter,
                                  record_margins=record_margins)

    def stream(
        self,
        prompt: Sequence[int],
        sampling: SamplingConfig = SamplingConfig(),
        *,
        max_tokens: int = 256,
        stop: Sequence[str] = (),
        mode: str | None = None,
        decoder: SpeculativeDecoder | None = None,
    ) -> Iterator[Chunk | Final]:
        if max_tokens < 1:
            raise InputError(f"--max-tokens must be >= 1 (got {max_tokens})")
        if len(prompt) >= self.target.n_ctx:
            raise ContextError(
                f"the prompt is {len(prompt)} tokens but the context holds {self.target.n_ctx}; "
                "use a larger -c/--ctx-size or a shorter prompt"
            )
        dec = decoder or self.decoder(sampling, mode)
        events = dec.generate(prompt, max_tokens)
        return stream(
            events,
            self.target.token_bytes,
            lambda: dec.stats,
            mode=dec.settings.mode,
            stop=stop,
        )
