"""A small GGUF reader: header, metadata and tensor table, never the weights.

Stdlib only on purpose: the `gguf` package pulls in sentencepiece, which breaks CUDA
loading in the same process. Every way a file can be wrong ends in ModelFileError.
"""

from __future__ import annotations

import mmap
import os
import re
import struct
from collections import Counter
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from edgespec.errors import ModelFileError, ModelNotFoundError

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4  # GGML_MAX_DIMS
MAX_NAME = 64  # GGML_MAX_NAME: llama.cpp refuses tensor names of this many bytes or more
INT64_MAX = (1 << 63) - 1  # ggml counts elements in int64

MAX_LAYERS = 65536  # far beyond any real model; larger is garbage

# Arrays longer than this are tokenizer tables; they stay out of `metadata`.
MAX_STORED_ARRAY = 1024

# ggml type id -> (name, elements per block, bytes per block), as in ggml's type_traits.
GGML_TYPES: dict[int, tuple[str, int, int]] = {
    0: ("F32", 1, 4),
    1: ("F16", 1, 2),
    2: ("Q4_0", 32, 18),
    3: ("Q4_1", 32, 20),
    6: ("Q5_0", 32, 22),
    7: ("Q5_1", 32, 24),
    8: ("Q8_0", 32, 34),
    9: ("Q8_1", 32, 36),
    10: ("Q2_K", 256, 84),
    11: ("Q3_K", 256, 110),
    12: ("Q4_K", 256, 144),
    13: ("Q5_K", 256, 176),
    14: ("Q6_K", 256, 210),
    15: ("Q8_K", 256, 292),
    16: ("IQ2_XXS", 256, 66),
    17: ("IQ2_XS", 256, 74),
    18: ("IQ3_XXS", 256, 98),
    19: ("IQ1_S", 256, 50),
    20: ("IQ4_NL", 32, 18),
    21: ("IQ3_S", 256, 110),
    22: ("IQ2_S", 256, 82),
    23: ("IQ4_XS", 256, 136),
    24: ("I8", 1, 1),
    25: ("I16", 1, 2),
    26: ("I32", 1, 4),
    27: ("I64", 1, 8),
    28: ("F64", 1, 8),
    29: ("IQ1_M", 256, 56),
    30: ("BF16", 1, 2),
    34: ("TQ1_0", 256, 54),
    35: ("TQ2_0", 256, 66),
    39: ("MXFP4", 32, 17),
    40: ("NVFP4", 64, 36),
    41: ("Q1_0", 128, 18),
    42: ("Q2_0", 64, 18),
}

# general.file_type (llama.cpp's llama_ftype) -> the label people use for the file.
LLAMA_FTYPES: dict[int, str] = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 4: "Q4_1_SOME_F16", 7: "Q8_0", 8: "Q5_0",
    9: "Q5_1", 10: "Q2_K", 11: "Q3_K_S", 12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S",
    15: "Q4_K_M", 16: "Q5_K_S", 17: "Q5_K_M", 18: "Q6_K", 19: "IQ2_XXS", 20: "IQ2_XS",
    21: "Q2_K_S", 22: "IQ3_XS", 23: "IQ3_XXS", 24: "IQ1_S", 25: "IQ4_NL", 26: "IQ3_S",
    27: "IQ3_M", 28: "IQ2_S", 29: "IQ2_M", 30: "IQ4_XS", 31: "IQ1_M", 32: "BF16",
    36: "TQ1_0", 37: "TQ2_0", 38: "MXFP4_MOE",
}
FTYPE_GUESSED = 1024

# GGUF metadata value types: id -> struct format of one element (None: not fixed-size).
_T_STRING, _T_ARRAY = 8, 9
_SCALAR_FORMATS = {
    0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "B", 10: "Q", 11: "q", 12: "d",
}
_SCALARS = {t: struct.Struct("<" + f) for t, f in _SCALAR_FORMATS.items()}
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_BLK = re.compile(r"blk\.(\d+)\.")


@dataclass(frozen=True)
class TensorInfo:
    name: str
    ggml_type: int
    shape: tuple[int, ...]
    offset: int  # relative to GGUFInfo.data_offset
    n_bytes: int

    def __post_init__(self):
        if self.ggml_type not in GGML_TYPES:
            raise ValueError(f"tensor {self.name!r}: unknown ggml type {self.ggml_type}")
        if self.offset < 0 or self.n_bytes < 0 or any(d < 0 for d in self.shape):
            raise ValueError(f"tensor {self.name!r}: negative offset, size or dimension")

    @property
    def type_name(self) -> str:
        return GGML_TYPES[self.ggml_type][0]

    @property
    def n_elements(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


@dataclass(frozen=True)
class VocabInfo:
    model: str  # tokenizer.ggml.model: "gpt2", "llama", ...
    pre: str | None
    n_tokens: int
    bos_id: int | None
    eos_id: int | None
    eot_id: int | None
    add_bos: bool | None
    tokens: tuple[str, ...] = field(repr=False)
    token_types: tuple[int, ...] | None = field(default=None, repr=False)

    def __post_init__(self):
        if self.n_tokens != len(self.tokens):
            raise ValueError(f"n_tokens is {self.n_tokens} but {len(self.tokens)} tokens given")
        if self.token_types is not None and len(self.token_types) != len(self.tokens):
            raise ValueError(
                f"{len(self.token_types)} token types for {len(self.tokens)} tokens"
            )


@dataclass(frozen=True)
class GGUFInfo:
    path: Path
    file_size: int
    version: int
    alignment: int
    data_offset: int
    metadata: dict = field(repr=False)
    tensors: tuple[TensorInfo, ...] = field(repr=False)
    vocab: VocabInfo | None = field(default=None, repr=False)
    # Lengths of arrays left out of `metadata` (tokenizer tables), by key.
    array_lengths: dict = field(default_factory=dict, repr=False)

    def __post_init__(self):
        if self.version not in SUPPORTED_VERSIONS:
            raise ValueError(f"unsupported GGUF version {self.version}")
        if self.alignment <= 0 or self.alignment & (self.alignment - 1):
            raise ValueError(f"alignment {self.alignment} is not a power of two")
        if "general.architecture" not in self.metadata:
            raise ValueError("missing general.architecture")

    # -- identity -------------------------------------------------------------

    @property
    def architecture(self) -> str:
        return str(self.metadata["general.architecture"])

    @property
    def name(self) -> str | None:
        value = self.metadata.get("general.name")
        return str(value) if value is not None else None

    @property
    def quant(self) -> str:
        ftype = self.metadata.get("general.file_type")
        if isinstance(ftype, int) and (ftype & ~FTYPE_GUESSED) in LLAMA_FTYPES:
            return LLAMA_FTYPES[ftype & ~FTYPE_GUESSED]
        return self._dominant_tensor_type()

    def _dominant_tensor_type(self) -> str:
        # 1-D tensors (norms, biases) are F32 in every quant, so they say nothing.
        weights = [t for t in self.tensors if len(t.shape) >= 2] or list(self.tensors)
        if not weights:
            return "unknown"
        return Counter(t.type_name for t in weights).most_common(1)[0][0]

    @property
    def chat_template(self) -> str | None:
        value = self.metadata.get("tokenizer.chat_template")
        return value if isinstance(value, str) else None

    # -- hyperparameters ------------------------------------------------------

    def arch_value(self, key: str, default=None):
        """`{architecture}.{key}` from the metadata; per-layer arrays give their max."""
        value = self.metadata.get(f"{self.architecture}.{key}", default)
        if isinstance(value, tuple):
            return max(value) if value else default
        return value

    def _required_int(self, key: str) -> int:
        value = self.arch_value(key)
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ModelFileError(
                f"{self.path}: metadata {self.architecture}.{key} is missing or invalid"
            )
        return value

    @cached_property
    def n_layers(self) -> int:
        value = self.arch_value("block_count")
        blocks = [b for b in self._blk_indices if b is not None]
        if value is None and blocks:
            return max(blocks) + 1
        value = self._required_int("block_count")
        if value > MAX_LAYERS:
            raise ModelFileError(
                f"{self.path}: implausible {self.architecture}.block_count {value}"
            )
        return value

    @property
    def n_ctx_train(self) -> int:
        return self._required_int("context_length")

    @property
    def n_embd(self) -> int:
        return self._required_int("embedding_length")

    @property
    def n_head(self) -> int:
        return self._required_int("attention.head_count")

    @property
    def n_head_kv(self) -> int:
        value = self.arch_value("attention.head_count_kv")
        return value if isinstance(value, int) and value > 0 else self.n_head

    @property
    def head_dim_k(self) -> int:
        value = self.arch_value("attention.key_length")
        return value if isinstance(value, int) and value > 0 else self.n_embd // self.n_head

    @property
    def head_dim_v(self) -> int:
        value = self.arch_value("attention.value_length")
        return value if isinstance(value, int) and value > 0 else self.n_embd // self.n_head

    @property
    def n_vocab(self) -> int | None:
        """Vocabulary size, known without reading the vocabulary."""
        value = self.arch_value("vocab_size")
        if isinstance(value, int) and value > 0:
            return value
        if self.vocab is not None:
            return self.vocab.n_tokens
        return self.array_lengths.get("tokenizer.ggml.tokens")

    # -- sizes ----------------------------------------------------------------

    @cached_property
    def _blk_indices(self) -> tuple[int | None, ...]:
        return tuple(_block_index(t.name) for t in self.tensors)

    @cached_property
    def layer_bytes(self) -> tuple[int, ...]:
        sizes = [0] * self.n_layers
        for tensor, block in zip(self.tensors, self._blk_indices):
            if block is not None and block < self.n_layers:
                sizes[block] += tensor.n_bytes
        return tuple(sizes)

    @cached_property
    def tensor_bytes(self) -> int:
        return sum(t.n_bytes for t in self.tensors)

    @property
    def nonlayer_bytes(self) -> int:
        # Blocks past block_count (e.g. next-token-prediction heads) count here, so
        # sum(layer_bytes) + nonlayer_bytes == tensor_bytes always holds.
        return self.tensor_bytes - sum(self.layer_bytes)

    @property
    def tied_output(self) -> bool:
        """No output.weight: the output projection reuses the token embedding."""
        return self.tensor("output.weight") is None and self.tensor("token_embd.weight") is not None

    @property
    def output_bytes(self) -> int:
        by_name = {t.name: t for t in self.tensors}
        tensor = by_name.get("output.weight") or by_name.get("token_embd.weight")
        return tensor.n_bytes if tensor else 0

    @cached_property
    def n_params(self) -> int:
        return sum(t.n_elements for t in self.tensors)

    def tensor(self, name: str) -> TensorInfo | None:
        return next((t for t in self.tensors if t.name == name), None)


def _block_index(name: str) -> int | None:
    match = _BLK.match(name)
    return int(match.group(1)) if match else None


def tensor_nbytes(ggml_type: int, shape: tuple[int, ...]) -> int:
    """Bytes a tensor of this type and shape occupies (rows of whole blocks)."""
    _, block, size = GGML_TYPES[ggml_type]
    if not shape:
        return size
    if shape[0] % block:
        raise ValueError(f"row length {shape[0]} is not a multiple of block size {block}")
    n = shape[0] // block * size
    for d in shape[1:]:
        n *= d
    return n


# -- reading ----------------------------------------------------------------------


class _Bad(Exception):
    """Internal: the file is malformed; the message says how."""


class _Cursor:
    """Bounds-checked little-endian reads over the mapped file."""

    def __init__(self, buf, size: int):
        self.buf = buf
        self.size = size
        self.pos = 0
        self.section = "header"

    def need(self, n: int) -> None:
        if n < 0 or self.pos + n > self.size:
            raise _Bad(
                f"truncated {self.section}: needs {n} bytes at offset {self.pos}, "
                f"file has {self.size}"
            )

    def unpack(self, st: struct.Struct):
        self.need(st.size)
        value = st.unpack_from(self.buf, self.pos)
        self.pos += st.size
        return value

    def u32(self) -> int:
        return self.unpack(_U32)[0]

    def u64(self) -> int:
        return self.unpack(_U64)[0]

    def raw_string(self) -> bytes:
        n = self.u64()
        if n > self.size - self.pos:
            raise _Bad(
                f"malformed {self.section}: string of {n} bytes at offset {self.pos} "
                f"runs past the end of the file ({self.size} bytes)"
            )
        start = self.pos
        self.pos += n
        return self.buf[start : self.pos]

    def string(self) -> str:
        return self.raw_string().decode("utf-8", errors="surrogateescape")

    def skip_strings(self, count: int) -> None:
        buf, size, unpack = self.buf, self.size, _U64.unpack_from
        pos = self.pos
        for _ in range(count):
            if pos + 8 > size:
                self.pos = pos
                self.need(8)
            pos += 8 + unpack(buf, pos)[0]
            if pos > size:
                raise _Bad(f"malformed {self.section}: string array runs past the end of the file")
        self.pos = pos

    def strings(self, count: int) -> tuple[str, ...]:
        buf, size, unpack = self.buf, self.size, _U64.unpack_from
        pos, out = self.pos, []
        append = out.append
        for _ in range(count):
            if pos + 8 > size:
                self.pos = pos
                self.need(8)
            n = unpack(buf, pos)[0]
            pos += 8
            if pos + n > size:
                raise _Bad(f"malformed {self.section}: string array runs past the end of the file")
            append(buf[pos : pos + n].decode("utf-8", errors="surrogateescape"))
            pos += n
        self.pos = pos
        return tuple(out)


# Keys whose arrays are read only when the vocabulary is asked for.
_VOCAB_ARRAYS = ("tokenizer.ggml.tokens", "tokenizer.ggml.token_type")


# One start reads each model's header up to three times (resolve, plan, vocabulary check): keep
# what was parsed, keyed by the file's identity and mtime so a replaced file is read afresh.
_CACHE: dict[tuple, GGUFInfo] = {}
_CACHE_MAX = 16


def read_gguf(path, *, vocab: bool = False) -> GGUFInfo:
    """Read a GGUF file's header, metadata and tensor table.

    With vocab=True the token list and types are read too (for compat checks).
    Raises ModelNotFoundError if the file is missing, ModelFileError for anything else.
    """
    path = Path(path)
    try:
        with open(path, "rb") as f:
            st = os.fstat(f.fileno())
            key = (str(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
            cached = _CACHE.get(key + (True,)) or _CACHE.get(key + (vocab,))
            if cached is not None:
                return cached
            if st.st_size < 4:
                raise ModelFileError(f"{path}: not a GGUF file (only {st.st_size} bytes)")
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
                info = _parse(path, buf, st.st_size, vocab)
            if len(_CACHE) >= _CACHE_MAX:
                _CACHE.clear()
            _CACHE[key + (vocab,)] = info
            return info
    except FileNotFoundError:
        raise ModelNotFoundError(f"no such file: {path}") from None
    except IsADirectoryError:
        raise ModelFileError(f"{path}: is a directory, not a GGUF file") from None
    except _Bad as err:
        raise ModelFileError(f"{path}: {err}") from None
    except (struct.error, ValueError, OverflowError, MemoryError, IndexError) as err:
        raise ModelFileError(f"{path}: malformed GGUF ({err})") from None
    except OSError as err:
        raise ModelFileError(f"{path}: cannot read ({err.strerror or err})") from None


def _parse(path: Path, buf, size: int, want_vocab: bool) -> GGUFInfo:
    cur = _Cursor(buf, size)
    version, n_tensors, n_kv = _read_header(cur)
    cur.section = "metadata"
    metadata, arrays, lengths = _read_metadata(cur, n_kv, want_vocab)
    alignment = _alignment(metadata)
    cur.section = "tensor table"
    tensors = _read_tensor_table(cur, n_tensors, alignment)
    data_offset = _align(cur.pos, alignment)
    _check_layout(tensors, alignment)
    _check_data_present(tensors, data_offset, size)
    if "general.architecture" not in metadata:
        raise _Bad("metadata has no general.architecture")
    return GGUFInfo(
        path=path,
        file_size=size,
        version=version,
        alignment=alignment,
        data_offset=data_offset,
        metadata=metadata,
        tensors=tensors,
        vocab=_vocab(metadata, arrays) if want_vocab else None,
        array_lengths=lengths,
    )


def _read_header(cur: _Cursor) -> tuple[int, int, int]:
    magic = bytes(cur.buf[0:4])
    if magic != GGUF_MAGIC:
        raise _Bad(f"not a GGUF file (starts with {magic!r}, expected {GGUF_MAGIC!r})")
    cur.pos = 4
    version = cur.u32()
    if version not in SUPPORTED_VERSIONS:
        if version & 0xFFFF == 0 and (version >> 16) in SUPPORTED_VERSIONS:
            raise _Bad("big-endian GGUF is not supported")
        raise _Bad(f"unsupported GGUF version {version} (supported: 2, 3)")
    n_tensors, n_kv = cur.u64(), cur.u64()
    # A tensor entry takes at least 24 bytes and a KV at least 13: bigger counts are garbage.
    if n_tensors > cur.size // 24:
        raise _Bad(f"malformed header: tensor count {n_tensors} is impossible for this file size")
    if n_kv > cur.size // 13:
        raise _Bad(f"malformed header: metadata count {n_kv} is impossible for this file size")
    return version, n_tensors, n_kv


def _read_metadata(cur: _Cursor, n_kv: int, want_vocab: bool):
    metadata: dict = {}
    arrays: dict = {}  # the vocabulary arrays, when asked for
    lengths: dict = {}
    for _ in range(n_kv):
        key = cur.string()
        if key in metadata or key in lengths:
            raise _Bad(f"malformed metadata: duplicate key {key!r}")
        vtype = cur.u32()
        if vtype != _T_ARRAY:
            metadata[key] = _read_scalar(cur, vtype, key)
            continue
        etype, count = cur.u32(), cur.u64()
        keep = want_vocab and key in _VOCAB_ARRAYS
        if count <= MAX_STORED_ARRAY and not keep:
            metadata[key] = _read_array(cur, etype, count, key)
        elif keep:
            arrays[key] = _read_array(cur, etype, count, key)
            lengths[key] = count
        else:
            _skip_array(cur, etype, count, key)
            lengths[key] = count
    return metadata, arrays, lengths


def _read_scalar(cur: _Cursor, vtype: int, key: str):
    if vtype == _T_STRING:
        return cur.string()
    st = _SCALARS.get(vtype)
    if st is None:
        raise _Bad(f"malformed metadata: key {key!r} has unknown value type {vtype}")
    value = cur.unpack(st)[0]
    return bool(value) if vtype == 7 else value


def _array_check(cur: _Cursor, etype: int, count: int, key: str) -> str | None:
    if etype == _T_ARRAY:
        raise _Bad(f"malformed metadata: key {key!r} is a nested array")
    if etype == _T_STRING:
        if count > (cur.size - cur.pos) // 8:
            raise _Bad(f"malformed metadata: array {key!r} of {count} strings cannot fit the file")
        return None
    fmt = _SCALAR_FORMATS.get(etype)
    if fmt is None:
        raise _Bad(f"malformed metadata: array {key!r} has unknown element type {etype}")
    cur.need(count * struct.calcsize("<" + fmt))
    return fmt


def _read_array(cur: _Cursor, etype: int, count: int, key: str) -> tuple:
    fmt = _array_check(cur, etype, count, key)
    if fmt is None:
        return cur.strings(count)
    st = struct.Struct(f"<{count}{fmt}")
    values = st.unpack_from(cur.buf, cur.pos)
    cur.pos += st.size
    return tuple(bool(v) for v in values) if etype == 7 else values


def _skip_array(cur: _Cursor, etype: int, count: int, key: str) -> None:
    fmt = _array_check(cur, etype, count, key)
    if fmt is None:
        cur.skip_strings(count)
    else:
        cur.pos += count * struct.calcsize("<" + fmt)


def _alignment(metadata: dict) -> int:
    value = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0 or value & (value - 1):
        raise _Bad(f"malformed metadata: general.alignment {value!r} is not a power of two")
    return value


def _read_tensor_table(cur: _Cursor, n_tensors: int, alignment: int) -> tuple[TensorInfo, ...]:
    tensors, seen = [], set()
    for _ in range(n_tensors):
        tensor = _read_tensor_info(cur, alignment)
        if tensor.name in seen:
            raise _Bad(f"malformed tensor table: duplicate tensor {tensor.name!r}")
        seen.add(tensor.name)
        tensors.append(tensor)
    return tuple(tensors)


def _read_tensor_info(cur: _Cursor, alignment: int) -> TensorInfo:
    name = cur.string()
    if len(name.encode("utf-8", errors="surrogateescape")) >= MAX_NAME:
        raise _Bad(f"malformed tensor table: tensor name {name[:40]!r}... is longer than {MAX_NAME - 1} bytes")
    n_dims = cur.u32()
    if n_dims > MAX_DIMS:
        raise _Bad(f"malformed tensor table: tensor {name!r} has {n_dims} dimensions")
    shape = tuple(cur.u64() for _ in range(n_dims))
    _check_shape(name, shape)
    ggml_type, offset = cur.u32(), cur.u64()
    if ggml_type not in GGML_TYPES:
        raise _Bad(f"tensor {name!r} has unknown ggml type {ggml_type} (newer llama.cpp format?)")
    if offset % alignment:
        raise _Bad(f"malformed tensor table: tensor {name!r} offset {offset} is not aligned")
    try:
        n_bytes = tensor_nbytes(ggml_type, shape)
    except ValueError as err:
        raise _Bad(f"malformed tensor table: tensor {name!r}: {err}") from None
    return TensorInfo(name=name, ggml_type=ggml_type, shape=shape, offset=offset, n_bytes=n_bytes)


def _check_shape(name: str, shape: tuple[int, ...]) -> None:
    # ggml holds dimensions and element counts in int64: anything larger is garbage it would refuse.
    n = 1
    for d in shape:
        if d > INT64_MAX:
            raise _Bad(f"malformed tensor table: tensor {name!r} has dimension {d}, beyond int64")
        n *= d
    if n > INT64_MAX:
        raise _Bad(f"malformed tensor table: tensor {name!r} shape {list(shape)} has more than 2^63 elements")


def _check_layout(tensors, alignment: int) -> None:
    """Tensor data must lie back to back in table order, each padded to the alignment (llama.cpp
    refuses anything else): so no two tensors share bytes, and each one's stretch of the data
    section is exactly what its type and shape need."""
    expected, prev = 0, None
    for t in tensors:
        if t.offset < expected:
            raise _Bad(
                f"malformed tensor table: tensor {t.name!r} at data offset {t.offset} overlaps "
                f"{prev.name!r} (offset {prev.offset}, {prev.n_bytes} bytes)"
            )
        if t.offset > expected:
            before = (
                f"{prev.name!r} ({prev.type_name} {list(prev.shape)} = {prev.n_bytes} bytes) ends at {expected}"
                if prev else "the data section starts at 0"
            )
            raise _Bad(
                f"malformed tensor table: tensor {t.name!r} starts at data offset {t.offset} but {before}: "
                "a stored size does not match its type and shape"
            )
        expected = _align(t.offset + t.n_bytes, alignment)
        prev = t


def _align(n: int, alignment: int) -> int:
    return (n + alignment - 1) // alignment * alignment


def _check_data_present(tensors, data_offset: int, size: int) -> None:
    if not tensors:  # vocab-only files end with the metadata, unpadded
        return
    end = data_offset + max(t.offset + t.n_bytes for t in tensors)
    if end > size:
        raise _Bad(f"truncated: expected at least {end} bytes, file has {size}")


def _vocab(metadata: dict, arrays: dict) -> VocabInfo | None:
    model = metadata.get("tokenizer.ggml.model")
    tokens = arrays.get("tokenizer.ggml.tokens", metadata.get("tokenizer.ggml.tokens"))
    if not isinstance(model, str) or tokens is None:
        return None
    if not all(isinstance(t, str) for t in tokens[:1]):
        raise _Bad("malformed metadata: tokenizer.ggml.tokens is not an array of strings")
    types = arrays.get("tokenizer.ggml.token_type", metadata.get("tokenizer.ggml.token_type"))
    if types is not None and len(types) != len(tokens):
        raise _Bad(f"malformed metadata: {len(types)} token types for {len(tokens)} tokens")
    add_bos = metadata.get("tokenizer.ggml.add_bos_token")
    return VocabInfo(
        model=model,
        pre=_str_or_none(metadata.get("tokenizer.ggml.pre")),
        n_tokens=len(tokens),
        bos_id=_int_or_none(metadata.get("tokenizer.ggml.bos_token_id")),
        eos_id=_int_or_none(metadata.get("tokenizer.ggml.eos_token_id")),
        eot_id=_int_or_none(metadata.get("tokenizer.ggml.eot_token_id")),
        add_bos=add_bos if isinstance(add_bos, bool) else None,
        tokens=tuple(tokens),
        token_types=tuple(int(t) for t in types) if types is not None else None,
    )


def _int_or_none(value) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _str_or_none(value) -> str | None:
    return value if isinstance(value, str) else None
