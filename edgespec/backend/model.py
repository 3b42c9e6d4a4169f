"""LlamaModel: one loaded GGUF with its own context, over llama-cpp-python's low-level API.

A context holds `n_seq` sequences, each with its own `n_ctx`-token budget, in one unified KV
cache (fast kernels: any mix of sequences' rows is one pass) or a KV stream each (exact kernels:
a row's attention reads its own sequence's cells only; see LoadParams.unified_kv). `model.seq(i)` is sequence i as the speculative core sees a model
(`decode`, `trim`, `tokens`, `n_vocab`, `n_ctx`, `is_eog`); the model itself acts as sequence 0.
`decode_parts` puts the rows of several sequences into one `llama_decode`.
Everything ctypes stays in this file.
"""

from __future__ import annotations

import ctypes
import os
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import psutil

from ..config import KV_CACHE_TYPES
from ..errors import BackendError, ContextError, ModelFileError
from . import devices



def _llama():
    # Imported lazily so `edgespec --help` and header-only commands never load the shared library.
    import llama_cpp

    _ensure_backend(llama_cpp)
    return llama_cpp


_backend_ready = False
# llama.cpp's last log lines, kept even when not shown: a failed load's reason is only in its log.
_recent_log: deque[bytes] = deque(maxlen=40)
_log_callback = None
_verbose = False
# Greedy speculative output must equal plain decoding token for token, so a row's logits must not
# depend on how many rows share its batch. On CPU, ggml breaks that in four places: weight
# repacking (a 4-row GEMM kernel), the tiled K-quant matmul (batches of 8+ rows), flash
# attention's split-KV path (1 row once the cache passes 512 cells) and llamafile's sgemm (2+ rows
# of F16 attention). An "exact" target therefore loads without repacking and flash attention,
# verifies at most EXACT_MAX_BATCH rows at once (below the tiled threshold), and needs a build
# with -DGGML_LLAMAFILE=OFF (scripts/setup does that). The default (fast) kernels trade exactness for speed.
EXACT_MAX_BATCH = 7
MAX_SEQ = 256  # LLAMA_MAX_SEQ: llama.cpp's own limit on sequences in one context


_native_backtraces = False
_abort_callback = None


def set_verbose(verbose: bool) -> None:
    """Let llama.cpp's own log through to stderr (off by default: it is noise for users)."""
    global _verbose
    _verbose = verbose


def set_native_backtraces(on: bool) -> None:
    """--debug: let ggml abort the way it does by default, with its native backtrace."""
    global _native_backtraces
    _native_backtraces = on


def ensure_backend():
    """llama.cpp initialised, with our log and abort handlers: what any caller needs first."""
    return _llama()


def _ensure_backend(llama_cpp) -> None:
    global _backend_ready, _log_callback
    if _backend_ready:
        return

    @llama_cpp.llama_log_callback
    def _log(level, text, _user):  # pragma: no cover - called from C
        if text:
            _recent_log.append(text)
            if _verbose:
                os.write(2, text)

    _log_callback = _log  # keep a reference: C holds only the pointer
    llama_cpp.llama_log_set(_log_callback, ctypes.c_void_p(0))
    llama_cpp.llama_backend_init()
    _backend_ready = True  # before the abort handler: finding ggml's library comes back through here
    if not _native_backtraces:
        _install_abort_handler()


def _allocation_failure() -> str | None:
    """The allocation error llama.cpp logged during the last load, if that is why it failed."""
    for raw in reversed(_recent_log):
        line = raw.decode("utf-8", "replace").strip()
        if "alloc" in line and ("fail" in line or "unable" in line):
            return line[:200]
    return None


def abort_message(text: str) -> str:
    """The one line a user sees when ggml gives up (it would abort with a gdb backtrace)."""
    if "RPC server" in text:
        return (f"an RPC server went away or answered garbage mid-run ({text.split(': ', 1)[-1]}); "
                "restart `edgespec rpc-server` there and run again")
    return f"llama.cpp stopped: {text}"


def _install_abort_handler() -> None:
    # GGML_ABORT cannot be recovered from (abort() follows the callback), but it can end the
    # process with one line and BackendError's exit code instead of a core dump and a backtrace.
    global _abort_callback
    lib = devices.ggml_lib()
    setter = getattr(lib, "ggml_set_abort_callback", None) if lib is not None else None
    if setter is None:
        return
    prototype = ctypes.CFUNCTYPE(None, ctypes.c_char_p)

    def _on_abort(message):  # pragma: no cover - runs in the aborting process
        text = message.decode("utf-8", "replace") if message else "unknown error"
        os.write(2, f"\nerror: {abort_message(text)}\n".encode())
        os._exit(BackendError.exit_code)

    _abort_callback = prototype(_on_abort)
    setter.argtypes, setter.restype = [prototype], ctypes.c_void_p
    setter(_abort_callback)


@dataclass(frozen=True)
class LoadParams:
    n_ctx: int = 4096
    n_threads: int = 0  # 0: physical cores
    n_threads_batch: int = 0
    n_gpu_layers: int = 0
    main_gpu: int = 0
    tensor_split: tuple[float, ...] | None = None
    type_k: str = "f16"
    type_v: str = "f16"
    n_batch: int = 512
    use_mmap: bool = True
    exact: bool = False  # batch-invariant logits (see EXACT_MAX_BATCH): for the target
    n_seq: int = 1  # sequences in the context, each with n_ctx tokens of KV (see unified_kv)

    @property
    def fast(self) -> bool:
        return not self.exact

    @property
    def unified_kv(self) -> bool:
        """How several sequences share the context's KV cache. With a stream per sequence llama.cpp
        splits a batch into passes of consecutive sequence ids holding equal rows ("equal split"):
        rows (8, 4, 2, 1) of four sequences run as four passes. One unified cache runs any mix of
        sequences' rows as one pass (as llama-server's -kvu), so the fast kernels use it; flash
        attention skips the other sequences' cells, but every pass still spans all cells in use
        (which is why the prompt cache is kept out of it: SavedSeq). Exact kernels keep a stream per sequence: a
        row's attention then reads only its own sequence's cells, summed the same whatever else is
        in the batch, which is what makes a request's answer independent of its neighbours."""
        return self.fast and self.n_seq > 1

    def __post_init__(self):
        if self.n_ctx < 16:
            raise BackendError(f"context size {self.n_ctx} is too small (at least 16)")
        if not 1 <= self.n_seq <= MAX_SEQ:
            raise BackendError(f"sequences per context must be in 1..{MAX_SEQ} (got {self.n_seq})")
        for name in ("type_k", "type_v"):
            if getattr(self, name) not in KV_CACHE_TYPES:
                raise BackendError(
                    f"unknown KV cache type {getattr(self, name)!r}; choose one of {', '.join(KV_CACHE_TYPES)}"
                )


def default_threads() -> int:
    try:
        return max(1, psutil.cpu_count(logical=False) or os.cpu_count() or 1)
    except Exception:
        return max(1, os.cpu_count() or 1)


@dataclass(frozen=True, eq=False)
class SavedSeq:
    """A sequence's KV in host memory. In a unified cache every pass attends over all cells up to
    the highest one in use, whichever sequence holds them, so a prompt kept in the cache as a
    sequence of its own makes every other sequence's passes longer; kept here it costs nothing
    until it is restored (llama-server keeps its prompt cache in RAM for the same reason)."""
    tokens: tuple[int, ...]
    state: object  # the ctypes buffer llama_state_seq_get_data filled
    size: int  # bytes of it in use

    @property
    def n_tokens(self) -> int:
        return len(self.tokens)


class KVSeq:
    """One sequence of a model's context: its KV cache, mirrored in `self.tokens`."""

    def __init__(self, model: "LlamaModel", seq_id: int):
        self.model = model
        self.seq_id = seq_id
        self.tokens: list[int] = []

    @property
    def n_ctx(self) -> int:
        return self.model.n_ctx

    @property
    def n_vocab(self) -> int:
        return self.model.n_vocab

    @property
    def max_exact_batch(self) -> int | None:
        return self.model.max_exact_batch

    @property
    def n_past(self) -> int:
        return len(self.tokens)

    def is_eog(self, token: int) -> bool:
        return self.model.is_eog(token)

    def token_bytes(self, token: int) -> bytes:
        return self.model.token_bytes(token)

    def decode(self, tokens: Sequence[int], logits_for: Sequence[int] = ()) -> np.ndarray:
        """Append `tokens` to this sequence; return float32 logits rows for the given indices.

        The rows are a view into llama.cpp's buffer: valid until the next decode on this model.
        A batch longer than n_batch is decoded in chunks (rows only from the last one).
        """
        if not tokens:
            return np.empty((0, self.n_vocab), dtype=np.float32)
        step = self.model.params.n_batch
        want = list(logits_for)
        last = ((len(tokens) - 1) // step) * step
        if any(i < last for i in want):
            raise BackendError("logits requested for a token outside the last decoded chunk")
        for start in range(0, last, step):
            self.model.decode_parts([(self, tokens[start : start + step], ())])
        return self.model.decode_parts([(self, tokens[last:], [i - last for i in want])])[0]

    def trim(self, n: int) -> None:
        """Drop KV cells from position n on."""
        if n >= self.n_past:
            return
        m = self.model
        if not m._lc.llama_memory_seq_rm(m._mem, self.seq_id, n, -1):
            # Some caches (recurrent models) cannot drop a suffix: clear the sequence and replay.
            m._lc.llama_memory_seq_rm(m._mem, self.seq_id, -1, -1)
            kept = self.tokens[:n]
            self.tokens = []
            self.decode(kept)
            return
        del self.tokens[n:]

    def reset(self) -> None:
        m = self.model
        m._lc.llama_memory_seq_rm(m._mem, self.seq_id, -1, -1)
        self.tokens = []

    def copy_prefix(self, src: "KVSeq", n: int) -> None:
        """Hold src's first n tokens (their KV copied, not recomputed): a prompt another sequence
        already read. In a unified cache the cells become shared (nothing is copied; what this
        sequence held is dropped first, as a copy would overwrite it); with a stream per sequence
        llama.cpp copies the whole stream (at the next decode), trimmed to the prefix after."""
        m = self.model
        if src.model is not m or src is self or not 0 < n <= src.n_past:
            raise BackendError("a KV prefix copies only from another sequence of the same model")
        if m.unified_kv:
            self.reset()
            m._lc.llama_memory_seq_cp(m._mem, src.seq_id, self.seq_id, 0, n)
            self.tokens = list(src.tokens[:n])
            return
        m._lc.llama_memory_seq_cp(m._mem, src.seq_id, self.seq_id, -1, -1)
        self.tokens = list(src.tokens)
        self.trim(n)

    def save(self) -> "SavedSeq":
        """This sequence's KV copied out to host memory (llama.cpp's sequence state), with its tokens:
        a prompt kept for later without holding cells of the cache (see SavedSeq)."""
        m = self.model
        size = int(m._lc.llama_state_seq_get_size(m._ctx, self.seq_id))
        buf = (ctypes.c_uint8 * max(1, size))()
        n = int(m._lc.llama_state_seq_get_data(m._ctx, buf, size, self.seq_id))
        if size and n == 0:
            raise BackendError("llama.cpp could not copy a sequence's KV out")
        return SavedSeq(tuple(self.tokens), buf, n)

    def restore(self, saved: "SavedSeq", n: int) -> bool:
        """Hold the first n tokens of a saved sequence (its KV copied back, not recomputed).
        False when llama.cpp finds no room for it: the sequence is then empty."""
        m = self.model
        if not 0 < n <= len(saved.tokens):
            raise BackendError("a saved prefix is restored only within what was saved")
        self.reset()
        if not m._lc.llama_state_seq_set_data(m._ctx, saved.state, saved.size, self.seq_id):
            m._lc.llama_memory_seq_rm(m._mem, self.seq_id, -1, -1)
            return False
        self.tokens = list(saved.tokens)
        self.trim(n)
        return True

    def _resync(self, known: list[int]) -> None:
        m = self.model
        held = int(m._lc.llama_memory_seq_pos_max(m._mem, self.seq_id)) + 1
        if held > len(known):  # cannot happen unless another writer touched the cache
            m._lc.llama_memory_seq_rm(m._mem, self.seq_id, len(known), -1)
            held = len(known)
        self.tokens = known[:held]


class LlamaModel:
    """A model plus a context of `n_seq` sequences; the model itself is sequence 0."""

    def __init__(self, path: str | Path, params: LoadParams = LoadParams()):
        self.path = Path(path)
        self.params = params
        lc = _llama()
        self._lc = lc
        self._model = None
        self._ctx = None
        self._batch = None
        self._load_model(lc)
        self._create_context(lc)
        self._seqs = [KVSeq(self, i) for i in range(params.n_seq)]
        self._piece_cache: dict[int, bytes] = {}
        self._eog_cache: dict[int, bool] = {}

    # ---- loading -------------------------------------------------------------------------
    def _load_model(self, lc) -> None:
        mp = lc.llama_model_default_params()
        mp.n_gpu_layers = self.params.n_gpu_layers
        mp.main_gpu = self.params.main_gpu
        mp.use_mmap = self.params.use_mmap
        mp.use_extra_bufts = self.params.fast
        if self.params.tensor_split:
            arr = (ctypes.c_float * len(self.params.tensor_split))(*self.params.tensor_split)
            self._tensor_split = arr  # must outlive the load call
            mp.tensor_split = arr
        _recent_log.clear()
        model = lc.llama_model_load_from_file(str(self.path).encode(), mp)
        if not model:
            alloc = _allocation_failure()
            if alloc:
                raise BackendError(
                    f"llama.cpp could not allocate memory to load {self.path.name} ({alloc}); "
                    "put fewer layers on the GPU (-ngl, --gpu-memory) or use a smaller -c/--ctx-size"
                )
            raise ModelFileError(
                f"llama.cpp could not load {self.path} (not a supported GGUF, or corrupt); "
                "run with --verbose for llama.cpp's reason"
            )
        self._model = model
        self._vocab = lc.llama_model_get_vocab(model)
        self.n_vocab = int(lc.llama_vocab_n_tokens(self._vocab))
        self.n_ctx_train = int(lc.llama_model_n_ctx_train(model))
        self.n_layers = int(lc.llama_model_n_layer(model))
        self.bos = int(lc.llama_vocab_bos(self._vocab))
        self.eos = int(lc.llama_vocab_eos(self._vocab))
        self.add_bos = bool(lc.llama_vocab_get_add_bos(self._vocab))

    def _create_context(self, lc) -> None:
        p = self.params
        cp = lc.llama_context_default_params()
        # n_ctx cells per sequence, as one cache or as a stream each (LoadParams.unified_kv)
        cp.n_ctx = p.n_ctx * p.n_seq
        cp.n_seq_max = p.n_seq
        cp.kv_unified = p.unified_kv
        cp.n_batch = p.n_batch
        cp.n_ubatch = p.n_batch
        threads = p.n_threads or default_threads()
        cp.n_threads = threads
        cp.n_threads_batch = p.n_threads_batch or threads
        cp.type_k = KV_CACHE_TYPES[p.type_k].ggml_type
        cp.type_v = KV_CACHE_TYPES[p.type_v].ggml_type
        cp.no_perf = True
        # flash attention: auto (-1) when speed matters, off (0) for batch-invariant logits
        cp.flash_attn_type = -1 if p.fast else 0
        ctx = lc.llama_init_from_model(self._model, cp)
        if not ctx:
            raise BackendError(
                f"llama.cpp could not create a {p.n_ctx}-token context for {self.path.name} "
                "(out of memory?); try a smaller --ctx-size or -ctk q8_0"
            )
        self._ctx = ctx
        self.unified_kv = p.unified_kv
        # a unified cache's llama_n_ctx_seq is the whole cache: each sequence is still held to n_ctx
        self.n_ctx = p.n_ctx if p.unified_kv else int(lc.llama_n_ctx_seq(ctx))
        self._mem = lc.llama_get_memory(ctx)
        self._batch = lc.llama_batch_init(p.n_batch, 0, 1)
        self._row_bytes = self.n_vocab * 4
        # The largest batch whose rows match single-token decoding exactly (None: no limit).
        # Also kept with layers offloaded: RPC servers run these same CPU kernels, and CUDA
        # switches from its MMVQ to its MMQ kernels above 8 rows.
        self.max_exact_batch = None if p.fast else EXACT_MAX_BATCH

    def close(self) -> None:
        lc = self._lc
        if self._batch is not None:
            lc.llama_batch_free(self._batch)
            self._batch = None
        if self._ctx:
            lc.llama_free(self._ctx)
            self._ctx = None
        if self._model:
            lc.llama_model_free(self._model)
            self._model = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):  # pragma: no cover - best effort at interpreter exit
        try:
            self.close()
        except Exception:
            pass

    # ---- vocabulary ----------------------------------------------------------------------
    def tokenize(self, text: str, *, special: bool = False, add_bos: bool = False) -> list[int]:
        """Special-token parsing is off by default so user text can never become control tokens."""
        data = text.encode("utf-8")
        cap = len(data) + 8
        buf = (self._lc.llama_token * cap)()
        n = self._lc.llama_tokenize(self._vocab, data, len(data), buf, cap, add_bos, special)
        if n < 0:
            cap = -n
            buf = (self._lc.llama_token * cap)()
            n = self._lc.llama_tokenize(self._vocab, data, len(data), buf, cap, add_bos, special)
        if n < 0:
            raise BackendError("tokenization failed")
        return list(buf[:n])

    def token_bytes(self, token: int) -> bytes:
        """The raw bytes of one token (a UTF-8 character may span tokens)."""
        piece = self._piece_cache.get(token)
        if piece is None:
            buf = ctypes.create_string_buffer(64)
            n = self._lc.llama_token_to_piece(self._vocab, token, buf, 64, 0, False)
            if n < 0:
                buf = ctypes.create_string_buffer(-n)
                n = self._lc.llama_token_to_piece(self._vocab, token, buf, -n, 0, False)
            piece = buf.raw[: max(n, 0)]
            self._piece_cache[token] = piece
        return piece

    def token_text(self, token: int) -> str:
        raw = self._lc.llama_vocab_get_text(self._vocab, token)
        return raw.decode("utf-8", errors="replace") if raw else ""

    def is_eog(self, token: int) -> bool:
        # asked of every drafted token: remembered, not a foreign call each time
        eog = self._eog_cache.get(token)
        if eog is None:
            eog = self._eog_cache[token] = bool(self._lc.llama_vocab_is_eog(self._vocab, token))
        return eog

    def chat_template(self) -> str | None:
        raw = self._lc.llama_model_chat_template(self._model, None)
        return raw.decode("utf-8", errors="replace") if raw else None

    # ---- sequences and decoding ------------------------------------------------------
    def seq(self, i: int) -> KVSeq:
        return self._seqs[i]

    @property
    def n_seq(self) -> int:
        return len(self._seqs)

    @property
    def n_batch(self) -> int:
        return self.params.n_batch

    @property
    def tokens(self) -> list[int]:
        return self._seqs[0].tokens

    @property
    def n_past(self) -> int:
        return self._seqs[0].n_past

    def decode(self, tokens: Sequence[int], logits_for: Sequence[int] = ()) -> np.ndarray:
        return self._seqs[0].decode(tokens, logits_for)

    def trim(self, n: int) -> None:
        self._seqs[0].trim(n)

    def reset(self) -> None:
        """Empty every sequence's cache."""
        self._lc.llama_memory_clear(self._mem, True)
        for s in self._seqs:
            s.tokens = []

    def decode_parts(self, parts: Sequence[tuple[KVSeq, Sequence[int], Sequence[int]]]) -> list[np.ndarray]:
        """One llama_decode over several sequences: for each (seq, tokens, logits_for), append the
        tokens to seq and return its logits rows (views valid until the next decode on this model).
        All tokens together must fit one batch (n_batch)."""
        parts = [(s, list(t), list(w) if t else []) for s, t, w in parts]
        total = sum(len(t) for _, t, _ in parts)
        if total > self.params.n_batch:
            raise BackendError(f"{total} tokens in one decode exceed the batch size {self.params.n_batch}")
        for s, t, _ in parts:
            if s.model is not self:
                raise BackendError("a sequence of another model in this decode")
            if s.n_past + len(t) > self.n_ctx:
                raise ContextError(
                    f"context full: {s.n_past} + {len(t)} tokens exceed the {self.n_ctx}-token "
                    "context; use a larger --ctx-size"
                )
        if not total:
            return [self._rows([]) for _ in parts]
        b = self._batch
        n = 0
        offsets = [0] * len(parts)
        # In seq-id order: with a KV stream per sequence llama.cpp splits a batch into passes of
        # consecutive seq ids in batch order, so sequences 2, 3, 0, 1 would run as two passes
        # where 0, 1, 2, 3 is one (a unified cache runs any order as one pass).
        for j in sorted(range(len(parts)), key=lambda j: parts[j][0].seq_id):
            s, t, want = parts[j]
            offsets[j] = n
            pos0 = s.n_past
            rows = set(want)
            for i, tok in enumerate(t):
                b.token[n] = tok
                b.pos[n] = pos0 + i
                b.n_seq_id[n] = 1
                b.seq_id[n][0] = s.seq_id
                b.logits[n] = i in rows
                n += 1
        b.n_tokens = n
        before = [list(s.tokens) for s, _, _ in parts]
        try:
            rc = self._lc.llama_decode(self._ctx, b)
            if rc == 1:
                raise ContextError(f"no room left in the {self.n_ctx}-token KV cache; use a larger --ctx-size")
            if rc != 0:
                raise BackendError(f"llama_decode failed with code {rc}")
            for s, t, _ in parts:
                s.tokens.extend(t)
        except BaseException:
            # Ctrl-C can land between llama_decode returning and the bookkeeping above:
            # ask llama.cpp what each cache really holds so the mirrors never lie.
            for (s, t, _), known in zip(parts, before):
                s._resync(known + t)
            raise
        if not any(want for _, _, want in parts):
            # GPU and RPC backends return from llama_decode before the work is done; reading
            # logits waits for it, a prefill reads none: wait here so its timing is honest.
            self._lc.llama_synchronize(self._ctx)
        return [self._rows([off + i for i in want]) for off, (_, _, want) in zip(offsets, parts)]

    def _rows(self, indices: list[int]) -> np.ndarray:
        if not indices:
            return np.empty((0, self.n_vocab), dtype=np.float32)
        lc, ctx = self._lc, self._ctx
        ptrs = []
        for i in indices:
            p = lc.llama_get_logits_ith(ctx, i)
            if not p:
                raise BackendError(f"llama.cpp returned no logits for batch index {i}")
            ptrs.append(ctypes.cast(p, ctypes.c_void_p).value)
        contiguous = all(b - a == self._row_bytes for a, b in zip(ptrs, ptrs[1:]))
        if contiguous:
            arr = (ctypes.c_float * (self.n_vocab * len(ptrs))).from_address(ptrs[0])
            return np.ctypeslib.as_array(arr).reshape(len(ptrs), self.n_vocab)
        return np.stack(
            [np.ctypeslib.as_array((ctypes.c_float * self.n_vocab).from_address(p)) for p in ptrs]
        )
