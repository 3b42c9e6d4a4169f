"""Engine: a loaded target (and optional draft) plus everything one generation needs.

The CLI, the chat REPL and the benchmark all go through `Engine.stream`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Iterator, Sequence

from .backend.model import LlamaModel, LoadParams
from .batch import Batcher, prefill_rows
from .config import DraftLimits, Mode, SpecConfig, require_at_least_one
from .compat import Pairing, TokenMap, pair_vocabularies
from .controller import Controller
from .costs import CostModel
from .errors import ContextError, InputError
from .generate import Chunk, Final, stream
from .gguf import read_gguf
from .sampling import SamplingConfig
from .drafters import ModelDrafter, NgramDrafter
from .speculative import SpecSettings, SpeculativeDecoder
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
    n_seq: int = 1  # sequences decoded together (serve --parallel); each has the full context


def check_compatible(target_path: Path, draft_path: Path) -> Pairing:
    """Identical or mapped vocabularies (headers only, before loading); IncompatibleModelsError otherwise."""
    t = read_gguf(target_path, vocab=True)
    d = read_gguf(draft_path, vocab=True)
    if t.vocab is None or d.vocab is None:
        missing = target_path if t.vocab is None else draft_path
        raise InputError(f"{missing.name} has no tokenizer vocabulary in its header; cannot check the pair")
    return pair_vocabularies(t.vocab, d.vocab, target_name=target_path.name, draft_name=draft_path.name)


class Engine:
    token_map: TokenMap | None = None  # a near-compatible pair's id map (compat.py); None: ids pass as they are

    def __init__(self, config: EngineConfig, *, models: tuple | None = None, token_map: TokenMap | None = None):
        """Load the models the config names; `models` (target, draft or None) are already loaded
        ones that behave like LlamaModel (the tests' multi-sequence fakes)."""
        self.config = config
        self.spec = config.spec
        if models is not None:
            self.target, self.draft = models
            self.token_map = token_map
        else:
            self.target, self.draft, self.token_map = self._load(config)
        self.cost = config.cost or CostModel()
        self.limits = DraftLimits.of(config.spec, config.cost)
        self._controller: Controller | None = None
        self.last_controller: Controller | None = None  # the one the latest decoder used (for its notices)
        # Sequence 0's n-gram drafter lives as long as the session, like its controller: in a chat
        # each turn extends the last one's context, so the edits it learnt still apply.
        self._ngram: NgramDrafter | None = None
        self._template = self.target.chat_template()
        self.batcher = Batcher(self.target, n_batch=self.target.n_batch,
                               max_exact_batch=self.target.max_exact_batch,
                               prefill_chunk=prefill_rows(self.cost, self.target.n_batch))

    @staticmethod
    def _load(config: EngineConfig):
        token_map = None
        if config.draft_path is not None and config.spec.uses_draft_model:
            token_map = check_compatible(config.target_path, config.draft_path).token_map
        # The target's logits decide the output, so they must not depend on the verify batch size.
        target = LlamaModel(config.target_path,
                            replace(config.target_params, exact=config.exact, n_seq=config.n_seq))
        draft: LlamaModel | None = None
        try:
            if config.draft_path is not None and config.spec.uses_draft_model:
                draft = LlamaModel(config.draft_path,
                                   replace(config.draft_params or config.target_params, n_seq=config.n_seq))
        except BaseException:
            target.close()
            raise
        return target, draft, token_map

    @property
    def n_seq(self) -> int:
        return self.target.n_seq

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
            self._ngram = None

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
            k_min=self.limits.draft_min,
            k_max=self.limits.draft_max,
            allow_off=Mode(mode).adaptive,
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

    def decoder(self, sampling: SamplingConfig, mode: str | None = None, *, record_margins: bool = False,
                seq: int | None = None) -> SpeculativeDecoder:
        """A decoder for sequence 0 that keeps the session's learning (chat, prompt, bench), or, with
        `seq`, one for that sequence that starts afresh (a server request: nothing leaks between
        requests but the KV prefix it may reuse)."""
        spec = self.spec if mode is None else replace(self.spec, mode=mode)

        def kv(model):  # a model is its own sequence 0
            return model if seq is None else model.seq(seq)

        drafter = None
        if self.draft is not None and spec.mode.uses_draft_model:
            drafter = ModelDrafter(kv(self.draft), sampling, p_min=spec.draft_p_min, n_vocab_target=self.target.n_vocab,
                                   token_map=self.token_map)
        ngram = None
        if spec.mode.uses_ngram:
            if seq is None and spec.mode == self.spec.mode:
                if self._ngram is None:
                    self._ngram = NgramDrafter(spec.ngram_min, spec.ngram_max)
                ngram = self._ngram
            else:
                ngram = NgramDrafter(spec.ngram_min, spec.ngram_max)
        if spec.mode is Mode.DRAFT and drafter is None:
            raise InputError("--spec draft needs a draft model: pass -md/--model-draft or --pair")
        settings = SpecSettings(mode=spec.mode, draft_max=self.limits.draft_max)
        if seq is None:
            ctl = self.last_controller = self.controller(sampling, spec.mode)
        else:
            seeded = not sampling.greedy and sampling.seed is not None
            ctl = self._new_controller(spec.mode, learn_timing=not seeded)
        return SpeculativeDecoder(kv(self.target), sampling, ctl, settings, ngram=ngram, drafter=drafter,
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
        require_at_least_one("--max-tokens", max_tokens)
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
