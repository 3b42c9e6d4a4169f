"""Property-based fuzzing of the GGUF reader (hypothesis, derandomized: the same examples every run).

Files are built from a grammar (header, typed metadata, tensor table, data) and then mutated where a
parser is most easily fooled: counts, string lengths, value and element types, array lengths,
dimension counts, dimensions, ggml types, offsets; plus raw byte flips and truncation. Whatever the
bytes, `read_gguf` must either return a header whose facts hold (unique names, tensors back to back
in the data section, inside the file) or raise ModelFileError; it must finish (a SIGALRM guard turns
a hang into a failure) and must not allocate more than a small multiple of the file's size.

CI runs FUZZ_EXAMPLES examples per property; `scripts/fuzz` runs a longer, randomized campaign
(EDGESPEC_FUZZ_EXAMPLES, EDGESPEC_FUZZ_RANDOM=1).
"""

from __future__ import annotations

import itertools
import os
import signal
import struct
import tracemalloc
from contextlib import contextmanager
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edgespec import gguf
from edgespec.errors import ModelFileError
from edgespec.gguf import GGML_TYPES, read_gguf, tensor_nbytes

FUZZ_EXAMPLES = int(os.environ.get("EDGESPEC_FUZZ_EXAMPLES", "300"))
SETTINGS = settings(
    max_examples=FUZZ_EXAMPLES,
    derandomize=os.environ.get("EDGESPEC_FUZZ_RANDOM") != "1",
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture],
)
HANG_SECONDS = 30  # a parse of a few KiB takes milliseconds; this only catches an endless loop
MEMORY_FACTOR = 64  # peak Python allocation while parsing <= 64 x file size + 1 MiB
MEMORY_SLACK = 1 << 20

# -- the grammar ------------------------------------------------------------------------------

STRING, ARRAY = 8, 9
SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "B", 10: "Q", 11: "q", 12: "d"}


@dataclass
class Built:
    data: bytearray
    # (kind, position, width in bytes) of every field a mutation may target
    fields: list[tuple[str, int, int]] = field(default_factory=list)
    name_spans: list[tuple[int, int]] = field(default_factory=list)  # (position, length) of tensor names
    metadata: dict = field(default_factory=dict)
    tensors: list[tuple[str, int, tuple[int, ...], int]] = field(default_factory=list)


class Writer:
    def __init__(self):
        self.out = bytearray()
        self.fields: list[tuple[str, int, int]] = []

    def field(self, kind: str, fmt: str, value) -> None:
        packed = struct.pack("<" + fmt, value)
        self.fields.append((kind, len(self.out), len(packed)))
        self.out += packed

    def string(self, raw: bytes, kind: str = "strlen") -> None:
        self.field(kind, "Q", len(raw))
        self.out += raw


def scalar_value(vtype: int):
    fmt = SCALARS[vtype]
    if vtype == 7:
        return st.booleans()
    if fmt in "fd":
        return st.floats(allow_nan=False, width=32 if fmt == "f" else 64)
    bits = struct.calcsize(fmt) * 8
    if fmt.islower():
        return st.integers(-(1 << (bits - 1)), (1 << (bits - 1)) - 1)
    return st.integers(0, (1 << bits) - 1)


names = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=12)


@st.composite
def kv_values(draw):
    kind = draw(st.sampled_from(["scalar", "string", "array", "string_array"]))
    if kind == "scalar":
        vtype = draw(st.sampled_from(sorted(SCALARS)))
        return vtype, draw(scalar_value(vtype))
    if kind == "string":
        return STRING, draw(st.text(max_size=20))
    if kind == "array":
        etype = draw(st.sampled_from(sorted(SCALARS)))
        return ARRAY, (etype, draw(st.lists(scalar_value(etype), max_size=8)))
    return ARRAY, (STRING, draw(st.lists(st.text(max_size=6), max_size=8)))


@st.composite
def tensor_specs(draw):
    gtype = draw(st.sampled_from(sorted(GGML_TYPES)))
    block = GGML_TYPES[gtype][1]
    n_dims = draw(st.integers(1, 4))
    shape = [block * draw(st.integers(0, 3))] + [draw(st.integers(0, 3)) for _ in range(n_dims - 1)]
    return gtype, tuple(shape)


TENSOR_FIELDS = ("tensor_name", "n_dims", "dim", "ggml_type", "offset")


@st.composite
def gguf_files(draw, min_tensors: int = 0) -> Built:
    """A valid GGUF: the reader must accept it and give back what was written."""
    version = draw(st.sampled_from([2, 3]))
    alignment = draw(st.sampled_from([None, 1, 8, 32, 64]))
    kvs = {"general.architecture": (STRING, draw(st.sampled_from(["llama", "qwen2", "gemma3", "x"])))}
    if alignment is not None:
        kvs["general.alignment"] = (4, alignment)
    if draw(st.booleans()):
        n_vocab = draw(st.integers(1, 12))
        kvs["tokenizer.ggml.model"] = (STRING, "gpt2")
        kvs["tokenizer.ggml.tokens"] = (ARRAY, (STRING, [f"t{i}" for i in range(n_vocab)]))
        kvs["tokenizer.ggml.token_type"] = (ARRAY, (5, [1] * n_vocab))
    arch = kvs["general.architecture"][1]
    for key in ("block_count", "context_length", "embedding_length", "attention.head_count"):
        if draw(st.booleans()):
            kvs[f"{arch}.{key}"] = (4, draw(st.integers(0, 64)))
    for key, value in draw(st.dictionaries(names, kv_values(), max_size=6)).items():
        kvs.setdefault(key, value)
    tensor_names = draw(st.lists(st.sampled_from(["token_embd.weight", "output.weight", "output_norm.weight"])
                                 | st.builds("blk.{}.{}".format, st.integers(0, 5), st.sampled_from(["a.weight", "b.bias"])),
                                 min_size=min_tensors, max_size=8, unique=True))
    tensors = [(name, *draw(tensor_specs())) for name in tensor_names]
    return build(version, alignment or 32, kvs, tensors)


def build(version: int, alignment: int, kvs: dict, tensors) -> Built:
    w = Writer()
    w.out += b"GGUF"
    w.field("version", "I", version)
    w.field("n_tensors", "Q", len(tensors))
    w.field("n_kv", "Q", len(kvs))
    for key, (vtype, value) in kvs.items():
        w.string(key.encode())
        w.field("vtype", "I", vtype)
        write_value(w, vtype, value)
    offset, layout = 0, []
    spans = []
    for name, gtype, shape in tensors:
        w.string(name.encode(), kind="tensor_name")
        spans.append((len(w.out) - len(name.encode()), len(name.encode())))
        w.field("n_dims", "I", len(shape))
        for d in shape:
            w.field("dim", "Q", d)
        w.field("ggml_type", "I", gtype)
        w.field("offset", "Q", offset)
        layout.append((name, gtype, shape, offset))
        end = offset + tensor_nbytes(gtype, shape)
        offset = -(-end // alignment) * alignment
    if tensors:
        w.out += b"\0" * (-len(w.out) % alignment)
        w.out += b"\x11" * offset
    metadata = {k: stored(v) for k, v in kvs.items() if not (v[0] == ARRAY and len(v[1][1]) > gguf.MAX_STORED_ARRAY)}
    return Built(w.out, w.fields, spans, metadata, layout)


def write_value(w: Writer, vtype: int, value) -> None:
    if vtype == STRING:
        w.string(value.encode())
    elif vtype == ARRAY:
        etype, items = value
        w.field("etype", "I", etype)
        w.field("array_len", "Q", len(items))
        for item in items:
            write_value(w, etype, item)
    else:
        w.out += struct.pack("<" + SCALARS[vtype], value)


def stored(value):
    """What the reader gives back for a written value."""
    vtype, v = value
    if vtype == ARRAY:
        etype, items = v
        return tuple(float(struct.unpack("<f", struct.pack("<f", x))[0]) if etype == 6 else x for x in items)
    if vtype == 6:
        return struct.unpack("<f", struct.pack("<f", v))[0]
    return v


# -- mutations ----------------------------------------------------------------------------------

INTERESTING = [0, 1, 2, 3, 4, 5, 7, 8, 9, 12, 13, 31, 32, 33, 63, 64, 255, 256, 1023, 1024, 1025,
               (1 << 15), (1 << 16) - 1, (1 << 31) - 1, 1 << 31, (1 << 32) - 1, 1 << 32, (1 << 62),
               (1 << 63) - 1, 1 << 63, (1 << 64) - 32, (1 << 64) - 1]


@st.composite
def mutations(draw, built: Built, only: tuple[str, ...] = ()):
    """1-4 edits: mostly a structural field set to a value chosen to fool a parser (a boundary,
    off by one or by an alignment step, another field's value of the same kind: another tensor's
    offset, a neighbouring string's length), sometimes a flipped byte or a truncation."""
    ops = []
    kinds = sorted({k for k, _, _ in built.fields if not only or k in only})
    for _ in range(draw(st.integers(1, 2 if only else 4))):
        choices = ["field", "field", "name"] if only else ["field", "field", "field", "name", "flip", "truncate"]
        op = draw(st.sampled_from(choices))
        if op == "name" and built.name_spans:
            # another tensor's name over this one where they are as long (two now share it), else
            # one byte of it nudged (blk.0 -> blk.1)
            start, length = draw(st.sampled_from(built.name_spans))
            twins = [p for p, n in built.name_spans if n == length and p != start]
            if twins:
                ops.append(("copy", start, length, draw(st.sampled_from(twins))))
            elif length:
                ops.append(("flip", start + draw(st.integers(0, length - 1)), 0, draw(st.integers(1, 3))))
        elif op == "field" and kinds:
            kind = draw(st.sampled_from(kinds))  # every kind of field as likely as any other
            same = [(p, w) for k, p, w in built.fields if k == kind]
            pos, width = draw(st.sampled_from(same))
            old = int.from_bytes(built.data[pos : pos + width], "little")
            siblings = [int.from_bytes(built.data[p : p + w], "little") for p, w in same]
            new = draw(st.sampled_from(INTERESTING) | st.sampled_from(siblings)
                       | st.sampled_from([old - 1, old + 1, old * 2, old - 32, old + 32, old + 64])
                       | st.integers(0, (1 << (8 * width)) - 1))
            ops.append(("field", pos, width, new % (1 << (8 * width))))
        elif op == "truncate":
            ops.append(("truncate", draw(st.integers(0, len(built.data))), 0, 0))
        else:
            ops.append(("flip", draw(st.integers(0, max(len(built.data) - 1, 0))), 0, draw(st.integers(1, 255))))
    return ops


def apply(data: bytearray, ops) -> bytes:
    out = bytearray(data)
    for op, pos, width, value in ops:
        if op == "field":
            out[pos : pos + width] = value.to_bytes(width, "little")
        elif op == "copy":
            out[pos : pos + width] = data[value : value + width]
        elif op == "flip" and pos < len(out):
            out[pos] ^= value
        elif op == "truncate":
            del out[pos:]
    return bytes(out)


# -- running the reader ---------------------------------------------------------------------------

_counter = itertools.count()


@contextmanager
def hang_guard():
    def alarm(signum, frame):
        raise AssertionError(f"the reader did not finish within {HANG_SECONDS} s")

    old = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(HANG_SECONDS)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def read(tmp_path, data: bytes, vocab: bool):
    """read_gguf on the bytes: (info or None, error or None, peak bytes allocated)."""
    path = tmp_path / f"f{next(_counter)}.gguf"  # a new name each time: the reader caches by file
    path.write_bytes(data)
    tracemalloc.start()
    try:
        with hang_guard():
            try:
                return read_gguf(path, vocab=vocab), None, tracemalloc.get_traced_memory()[1]
            except ModelFileError as err:
                return None, err, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
        path.unlink()


def check_facts(info, size: int) -> None:
    """What every accepted header must satisfy, and its derived facts raise only ModelFileError."""
    names = [t.name for t in info.tensors]
    assert len(names) == len(set(names))
    expected = 0
    for t in info.tensors:
        assert t.offset == expected, "tensors back to back, none overlapping"
        assert t.n_bytes == tensor_nbytes(t.ggml_type, t.shape)
        assert info.data_offset + t.offset + t.n_bytes <= size
        expected = -(-(t.offset + t.n_bytes) // info.alignment) * info.alignment
    try:
        assert sum(info.layer_bytes) + info.nonlayer_bytes == info.tensor_bytes
    except ModelFileError:
        pass
    for attr in ("architecture", "name", "quant", "chat_template", "n_vocab", "n_params", "output_bytes",
                 "tied_output", "n_layers", "n_ctx_train", "n_embd", "n_head", "n_head_kv", "head_dim_k"):
        try:
            getattr(info, attr)
        except ModelFileError:
            pass


# -- the properties -------------------------------------------------------------------------------


@SETTINGS
@given(built=gguf_files(), vocab=st.booleans())
def test_valid_files_read_back_exactly(tmp_path, built, vocab):
    info, err, _ = read(tmp_path, bytes(built.data), vocab)
    assert err is None, err
    for key, value in built.metadata.items():
        if vocab and key in ("tokenizer.ggml.tokens", "tokenizer.ggml.token_type"):
            continue
        got = info.metadata[key]
        assert got == value or (value != value and got != got), key
    assert [(t.name, t.ggml_type, t.shape, t.offset) for t in info.tensors] == built.tensors
    check_facts(info, len(built.data))


@SETTINGS
@given(data=st.data(), vocab=st.booleans())
def test_mutated_files_are_read_or_refused(tmp_path, data, vocab):
    built = data.draw(gguf_files())
    ops = data.draw(mutations(built))
    mutated = apply(built.data, ops)
    info, err, peak = read(tmp_path, mutated, vocab)
    assert peak <= MEMORY_FACTOR * len(mutated) + MEMORY_SLACK, f"{peak} bytes allocated for a {len(mutated)}-byte file"
    if err is not None:
        assert str(err).startswith(str(tmp_path)) and "\n" not in str(err)
    else:
        check_facts(info, len(mutated))


@SETTINGS
@given(data=st.data(), vocab=st.booleans())
def test_tensor_table_mutations(tmp_path, data, vocab):
    """Names, dimension counts, dimensions, types and offsets of files with several tensors."""
    built = data.draw(gguf_files(min_tensors=2))
    ops = data.draw(mutations(built, only=TENSOR_FIELDS))
    mutated = apply(built.data, ops)
    info, err, peak = read(tmp_path, mutated, vocab)
    assert peak <= MEMORY_FACTOR * len(mutated) + MEMORY_SLACK
    if err is not None:
        assert str(err).startswith(str(tmp_path)) and "\n" not in str(err)
    else:
        check_facts(info, len(mutated))


@SETTINGS
@given(raw=st.binary(max_size=512), vocab=st.booleans())
def test_arbitrary_bytes_after_the_magic(tmp_path, raw, vocab):
    data = b"GGUF" + struct.pack("<I", 3) + raw
    info, err, peak = read(tmp_path, data, vocab)
    assert peak <= MEMORY_FACTOR * len(data) + MEMORY_SLACK
    if info is not None:
        check_facts(info, len(data))


# -- the checks fuzzing asked for, pinned by hand ---------------------------------------------------

ARCH = {"general.architecture": (STRING, "llama")}


def _one(tmp_path, tensors, edit=None):
    built = build(3, 32, ARCH, tensors)
    data = bytearray(built.data)
    if edit:
        edit(built, data)
    return read(tmp_path, bytes(data), False)


def _set_field(built, data, kind, index, value):
    pos, width = [(p, w) for k, p, w in built.fields if k == kind][index]
    data[pos : pos + width] = value.to_bytes(width, "little")


def test_overlapping_tensor_data_is_refused(tmp_path):
    tensors = [("a", 0, (64, 2)), ("b", 0, (64,))]  # a: 512 bytes at 0; b at 512
    _, err, _ = _one(tmp_path, tensors, lambda b, d: _set_field(b, d, "offset", 1, 256))
    assert err is not None and "'b' at data offset 256 overlaps 'a'" in str(err)


def test_size_not_matching_type_and_dims_is_refused(tmp_path):
    # b placed after more bytes than a's F32 x 64 x 2 = 512: a stored size the shape does not explain
    tensors = [("a", 0, (64, 2)), ("b", 0, (64,))]
    _, err, _ = _one(tmp_path, tensors, lambda b, d: _set_field(b, d, "offset", 1, 1024))
    assert err is not None and "a stored size does not match its type and shape" in str(err)
    assert "'a' (F32 [64, 2] = 512 bytes) ends at 512" in str(err)


def test_duplicate_tensor_names_are_refused(tmp_path):
    _, err, _ = _one(tmp_path, [("same", 0, (32,)), ("same", 0, (32,))])
    assert err is not None and "duplicate tensor 'same'" in str(err)


def test_dimensions_beyond_int64_are_refused(tmp_path):
    _, err, _ = _one(tmp_path, [("a", 0, (32, 1))], lambda b, d: _set_field(b, d, "dim", 1, 1 << 63))
    assert err is not None and "beyond int64" in str(err)
    _, err, _ = _one(tmp_path, [("a", 0, (32, 1, 1))], lambda b, d: (
        _set_field(b, d, "dim", 1, 1 << 40), _set_field(b, d, "dim", 2, 1 << 40)))
    assert err is not None and "more than 2^63 elements" in str(err)


def test_tensor_names_llama_cpp_would_refuse(tmp_path):
    _, err, _ = _one(tmp_path, [("x" * 64, 0, (32,))])
    assert err is not None and "longer than 63 bytes" in str(err)
    info, err, _ = _one(tmp_path, [("x" * 63, 0, (32,))])
    assert err is None and info.tensors[0].name == "x" * 63


def test_a_hang_would_fail(tmp_path, monkeypatch):
    """The guard itself: a reader that never returns is reported, not waited on forever."""
    monkeypatch.setattr("tests.unit.test_fuzz_gguf.HANG_SECONDS", 1)

    def forever(*args, **kwargs):
        while True:
            pass

    monkeypatch.setattr("tests.unit.test_fuzz_gguf.read_gguf", forever)
    with pytest.raises(AssertionError, match="did not finish"):
        read(tmp_path, b"GGUF", False)
