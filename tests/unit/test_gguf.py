"""The GGUF reader against files built byte by byte here."""

from __future__ import annotations

import random
import struct
import sys

import pytest

from edgespec.errors import ModelFileError, ModelNotFoundError
from edgespec.gguf import GGML_TYPES, read_gguf, tensor_nbytes

# -- a tiny GGUF writer ----------------------------------------------------------------

U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 = range(13)
_FMT = {U8: "B", I8: "b", U16: "H", I16: "h", U32: "I", I32: "i", F32: "f", BOOL: "B",
        U64: "Q", I64: "q", F64: "d"}
F32_T, F16_T, Q4_0_T, Q8_0_T, Q4_K_T, Q6_K_T = 0, 1, 2, 8, 12, 14


def s(text: str | bytes) -> bytes:
    raw = text.encode() if isinstance(text, str) else text
    return struct.pack("<Q", len(raw)) + raw


def value(vtype: int, v) -> bytes:
    if vtype == STR:
        return s(v)
    if vtype == ARR:
        etype, items = v
        return struct.pack("<IQ", etype, len(items)) + b"".join(value(etype, x) for x in items)
    return struct.pack("<" + _FMT[vtype], v)


def kv(key: str, vtype: int, v) -> bytes:
    return s(key) + struct.pack("<I", vtype) + value(vtype, v)


def build(kvs, tensors, *, version=3, alignment=32, magic=b"GGUF", data=True) -> bytes:
    """kvs: [(key, type, value)]; tensors: [(name, ggml_type, shape)]."""
    head = magic + struct.pack("<IQQ", version, len(tensors), len(kvs))
    head += b"".join(kv(*item) for item in kvs)
    offset, infos, total = 0, b"", 0
    for name, gtype, shape in tensors:
        infos += s(name) + struct.pack("<I", len(shape)) + struct.pack(f"<{len(shape)}Q", *shape)
        infos += struct.pack("<IQ", gtype, offset)
        total = offset + (tensor_nbytes(gtype, tuple(shape)) if valid(gtype, shape) else 0)
        offset = -(-total // alignment) * alignment
    out = head + infos
    out += b"\0" * (-len(out) % alignment)
    return out + (b"\x5a" * total if data else b"")


def valid(gtype, shape) -> bool:
    return gtype in GGML_TYPES and shape[0] % GGML_TYPES[gtype][1] == 0


def tokens(n: int) -> list[str]:
    return ["<unk>", "<s>", "</s>", "<pad>", "<x>"] + [f"tok{i}" for i in range(5, n)]


def model_kvs(n_vocab=40, *, file_type=15, extra=()):
    toks = tokens(n_vocab)
    kvs = [
        ("general.architecture", STR, "llama"),
        ("general.name", STR, "Tiny Test"),
        ("llama.block_count", U32, 2),
        ("llama.context_length", U32, 4096),
        ("llama.embedding_length", U32, 256),
        ("llama.attention.head_count", U32, 4),
        ("llama.attention.head_count_kv", U32, 2),
        ("tokenizer.ggml.model", STR, "gpt2"),
        ("tokenizer.ggml.pre", STR, "qwen2"),
        ("tokenizer.ggml.tokens", ARR, (STR, toks)),
        ("tokenizer.ggml.token_type", ARR, (I32, [1] * n_vocab)),
        ("tokenizer.ggml.bos_token_id", U32, 1),
        ("tokenizer.ggml.eos_token_id", U32, 2),
        ("tokenizer.ggml.add_bos_token", BOOL, 0),
        ("tokenizer.chat_template", STR, "{{ messages }}"),
        ("general.tags", ARR, (STR, ["a", "b"])),
    ]
    if file_type is not None:
        kvs.append(("general.file_type", U32, file_type))
    return kvs + list(extra)


TENSORS = [
    ("token_embd.weight", Q8_0_T, [256, 40]),
    ("blk.0.attn_norm.weight", F32_T, [256]),
    ("blk.0.attn_q.weight", Q4_K_T, [256, 256]),
    ("blk.0.ffn_down.weight", Q6_K_T, [256, 512]),
    ("blk.1.attn_norm.weight", F32_T, [256]),
    ("blk.1.attn_q.weight", Q4_K_T, [256, 256]),
    ("output_norm.weight", F32_T, [256]),
    ("output.weight", Q6_K_T, [256, 40]),
]


@pytest.fixture
def write(tmp_path):
    def _write(data: bytes, name="m.gguf"):
        path = tmp_path / name
        path.write_bytes(data)
        return path

    return _write


# -- good files --------------------------------------------------------------------------


def test_good_file_parses(write):
    path = write(build(model_kvs(), TENSORS))
    info = read_gguf(path)
    assert (info.version, info.alignment, info.architecture, info.name) == (3, 32, "llama", "Tiny Test")
    assert info.quant == "Q4_K_M"
    assert (info.n_layers, info.n_ctx_train, info.n_embd, info.n_head, info.n_head_kv) == (
        2, 4096, 256, 4, 2)
    assert info.head_dim_k == info.head_dim_v == 64
    q4k, q6k, q80 = 144 * 256 // 256, 210, 34
    blk0 = 256 * 4 + 256 * q4k + 512 * q6k
    blk1 = 256 * 4 + 256 * q4k
    assert info.layer_bytes == (blk0, blk1)
    assert info.output_bytes == 40 * q6k
    assert info.nonlayer_bytes == 40 * 8 * q80 + 256 * 4 + 40 * q6k
    assert sum(info.layer_bytes) + info.nonlayer_bytes == info.tensor_bytes
    assert info.tensor_bytes <= info.file_size - info.data_offset
    assert info.data_offset % 32 == 0
    assert info.n_params == 256 * 40 + 256 + 256 * 256 + 256 * 512 + 256 + 256 * 256 + 256 + 256 * 40
    assert info.metadata["general.tags"] == ("a", "b")
    assert info.metadata["tokenizer.ggml.add_bos_token"] is False
    assert info.chat_template == "{{ messages }}"
    assert info.vocab is None
    assert info.tensor("blk.0.attn_q.weight").shape == (256, 256)


def test_headers_are_read_once_per_file_version(write):
    path = write(build(model_kvs(), TENSORS))
    with_vocab = read_gguf(path, vocab=True)
    assert read_gguf(path) is with_vocab and read_gguf(path, vocab=True) is with_vocab
    # the file replaced (a new pull, a truncation): read again, never the stale parse
    path.write_bytes(build(model_kvs(), TENSORS)[:200])
    with pytest.raises(ModelFileError):
        read_gguf(path)


def test_vocab(write):
    info = read_gguf(write(build(model_kvs(), TENSORS)), vocab=True)
    v = info.vocab
    assert (v.model, v.pre, v.n_tokens, v.bos_id, v.eos_id, v.eot_id, v.add_bos) == (
        "gpt2", "qwen2", 40, 1, 2, None, False)
    assert v.tokens[:3] == ("<unk>", "<s>", "</s>") and v.tokens[-1] == "tok39"
    assert v.token_types == (1,) * 40
    assert info.n_vocab == 40


def test_big_arrays_stay_out_of_metadata(write):
    path = write(build(model_kvs(n_vocab=3000), TENSORS))
    info = read_gguf(path)
    assert "tokenizer.ggml.tokens" not in info.metadata
    assert info.array_lengths["tokenizer.ggml.tokens"] == 3000
    assert info.n_vocab == 3000
    assert read_gguf(path, vocab=True).vocab.tokens[2999] == "tok2999"


def test_tied_output_uses_token_embd(write):
    tensors = [t for t in TENSORS if t[0] != "output.weight"]
    info = read_gguf(write(build(model_kvs(), tensors)))
    assert info.output_bytes == 40 * 8 * 34 and info.tied_output
    assert not read_gguf(write(build(model_kvs(), TENSORS), "untied.gguf")).tied_output


def test_quant_falls_back_to_dominant_tensor_type(write):
    info = read_gguf(write(build(model_kvs(file_type=None), TENSORS)))
    assert info.quant == "Q4_K"
    info = read_gguf(write(build(model_kvs(file_type=1024 | 2), TENSORS)))
    assert info.quant == "Q4_0"


def test_head_dims_from_key_length(write):
    extra = [("llama.attention.key_length", U32, 128), ("llama.attention.value_length", U32, 96)]
    info = read_gguf(write(build(model_kvs(extra=extra), TENSORS)))
    assert (info.head_dim_k, info.head_dim_v) == (128, 96)


def test_custom_alignment_and_v2(write):
    extra = [("general.alignment", U32, 64)]
    info = read_gguf(write(build(model_kvs(extra=extra), TENSORS, alignment=64, version=2)))
    assert info.alignment == 64 and info.version == 2 and info.data_offset % 64 == 0


def test_blocks_past_block_count_are_nonlayer(write):
    tensors = TENSORS + [("blk.2.nextn.weight", F32_T, [256])]
    info = read_gguf(write(build(model_kvs(), tensors)))
    assert len(info.layer_bytes) == 2
    assert sum(info.layer_bytes) + info.nonlayer_bytes == info.tensor_bytes


def test_missing_hyperparameter_is_a_model_file_error(write):
    kvs = [k for k in model_kvs() if k[0] != "llama.embedding_length"]
    info = read_gguf(write(build(kvs, TENSORS)))
    with pytest.raises(ModelFileError, match="llama.embedding_length"):
        info.n_embd


def test_type_table_matches_ggml():
    expected = {"Q4_0": (32, 18), "Q8_0": (32, 34), "Q2_K": (256, 84), "Q3_K": (256, 110),
                "Q4_K": (256, 144), "Q5_K": (256, 176), "Q6_K": (256, 210), "Q8_K": (256, 292),
                "IQ4_XS": (256, 136), "BF16": (1, 2), "TQ1_0": (256, 54), "MXFP4": (32, 17)}
    table = {name: (block, size) for name, block, size in GGML_TYPES.values()}
    for name, sizes in expected.items():
        assert table[name] == sizes
    assert tensor_nbytes(12, (512, 3)) == 2 * 144 * 3


def python_calls(fn):
    """fn's result and how many Python-level function calls it made (C calls not counted)."""
    calls = 0

    def profile(frame, event, arg):
        nonlocal calls
        if event == "call":
            calls += 1

    sys.setprofile(profile)
    try:
        result = fn()
    finally:
        sys.setprofile(None)
    return result, calls


def test_large_vocab_is_fast(write):
    # Bound the work, not the clock: a 152k-token vocabulary is read in C-level loops (at most
    # one generator step per token), never through the cursor's checked reads per token (five
    # Python calls per string); skipping the vocabulary costs no per-token Python call at all.
    n = 152_000
    path = write(build(model_kvs(n_vocab=n), TENSORS))
    info, calls = python_calls(lambda: read_gguf(path, vocab=True))
    assert info.vocab.n_tokens == n and info.vocab.tokens[-1] == tokens(n)[-1]
    small = write(build(model_kvs(n_vocab=1_000), TENSORS), name="small.gguf")
    _, calls_small = python_calls(lambda: read_gguf(small, vocab=True))
    per_token = (calls - calls_small) / (n - 1_000)
    assert per_token <= 1.5, (calls, calls_small)
    skip = write(build(model_kvs(n_vocab=n), TENSORS), name="skip.gguf")
    header, calls_skip = python_calls(lambda: read_gguf(skip))
    assert header.n_vocab == n
    assert calls_skip < 2_000, calls_skip


# -- bad files: always ModelFileError ---------------------------------------------------------


def expect_bad(path, match=None):
    with pytest.raises(ModelFileError, match=match) as err:
        read_gguf(path)
    assert str(path) in str(err.value) and "\n" not in str(err.value)
    return str(err.value)


def test_bad_magic(write):
    expect_bad(write(build(model_kvs(), TENSORS, magic=b"GGML")), "not a GGUF")
    expect_bad(write(b"PK\x03\x04" + b"\0" * 100), "not a GGUF")
    expect_bad(write(b""), "not a GGUF")


@pytest.mark.parametrize("version, match", [(1, "version 1"), (4, "version 4"),
                                            (3 << 16, "big-endian")])
def test_unsupported_version(write, version, match):
    expect_bad(write(build(model_kvs(), TENSORS, version=version)), match)


def test_truncated_everywhere(write):
    data = build(model_kvs(), TENSORS)
    info = read_gguf(write(data))
    header_end = info.data_offset
    cuts = list(range(0, header_end + 1)) + [header_end + 100, len(data) - 1]
    for cut in cuts:
        path = write(data[:cut], f"cut{cut}.gguf")
        expect_bad(path)


def test_truncated_data_says_sizes(write):
    data = build(model_kvs(), TENSORS)
    message = expect_bad(write(data[:-10]), "truncated: expected at least")
    assert f"expected at least {len(data)} bytes, file has {len(data) - 10}" in message


@pytest.mark.parametrize("section", ["header", "metadata", "tensor table"])
def test_truncated_names_section(write, section):
    data = build(model_kvs(), TENSORS)
    info = read_gguf(write(data))
    # header ends at 24; metadata ends where the first tensor name starts
    meta_end = data.index(s("token_embd.weight"))
    cut = {"header": 20, "metadata": meta_end - 3, "tensor table": info.data_offset - 40}[section]
    expect_bad(write(data[:cut]), f"truncated {section}")


def test_garbage_string_length(write):
    data = bytearray(build(model_kvs(), TENSORS))
    data[24:32] = struct.pack("<Q", 2**63)  # length of the first key
    expect_bad(write(bytes(data)), "runs past the end")


def test_absurd_counts(write):
    data = bytearray(build(model_kvs(), TENSORS))
    data[8:16] = struct.pack("<Q", 2**60)
    expect_bad(write(bytes(data)), "tensor count")
    data = bytearray(build(model_kvs(), TENSORS))
    data[16:24] = struct.pack("<Q", 2**40)
    expect_bad(write(bytes(data)), "metadata count")


def test_absurd_array_length(write):
    kvs = model_kvs() + [("x.arr", ARR, (U64, [1, 2]))]
    data = bytearray(build(kvs, TENSORS))
    at = data.index(s("x.arr")) + len(s("x.arr")) + 8  # after key, type, element type
    data[at:at + 8] = struct.pack("<Q", 2**59)
    expect_bad(write(bytes(data)))


@pytest.mark.parametrize("extra", [
    [("x", 13, 0)],  # unknown value type: written as a 1-byte-less garbage payload
])
def test_unknown_value_type(write, extra):
    data = build(model_kvs(), TENSORS)
    patched = data.replace(kv("general.name", STR, "Tiny Test"),
                           s("general.name") + struct.pack("<I", 13) + s("Tiny Test"))
    expect_bad(write(patched), "unknown value type 13")


def test_nested_array(write):
    raw = s("x.nested") + struct.pack("<IIQ", ARR, ARR, 1) + struct.pack("<IQ", U8, 0)
    data = build(model_kvs(), TENSORS)
    data = data[:16] + struct.pack("<Q", len(model_kvs()) + 1) + data[24:]
    at = data.index(s("general.architecture"))
    expect_bad(write(data[:at] + raw + data[at:]), "nested array")


def test_duplicate_key(write):
    kvs = model_kvs() + [("general.name", STR, "again")]
    expect_bad(write(build(kvs, TENSORS)), "duplicate key")


def test_missing_architecture(write):
    kvs = [k for k in model_kvs() if k[0] != "general.architecture"]
    expect_bad(write(build(kvs, TENSORS)), "general.architecture")


@pytest.mark.parametrize("tensors, match", [
    ([("a", 77, [32])], "unknown ggml type 77"),
    ([("a", Q4_K_T, [100, 2])], "not a multiple of block size"),
    ([("a", F32_T, [1, 1, 1, 1, 1])], "5 dimensions"),
    ([("a", F32_T, [8]), ("a", F32_T, [8])], "duplicate tensor"),
])
def test_bad_tensor_table(write, tensors, match):
    expect_bad(write(build(model_kvs(), tensors)), match)


def test_misaligned_offset(write):
    data = bytearray(build(model_kvs(), TENSORS))
    name = s("blk.0.attn_norm.weight")
    at = data.index(name) + len(name) + 4 + 8 + 4  # n_dims, one dim, type
    data[at:at + 8] = struct.pack("<Q", 33)
    expect_bad(write(bytes(data)), "not aligned")


def test_bad_alignment_value(write):
    kvs = model_kvs(extra=[("general.alignment", U32, 48)])
    expect_bad(write(build(kvs, TENSORS)), "power of two")


def test_random_corruption_only_raises_model_file_error(write):
    data = build(model_kvs(), TENSORS)
    header_end = read_gguf(write(data)).data_offset
    rng = random.Random(1234)
    for i in range(400):
        corrupt = bytearray(data)
        for _ in range(rng.randint(1, 8)):
            at = rng.randrange(4, header_end)
            corrupt[at] = rng.randrange(256)
        path = write(bytes(corrupt), "fuzz.gguf")
        try:
            info = read_gguf(path, vocab=bool(i % 2))
            info.layer_bytes, info.quant, info.n_params
        except ModelFileError:
            pass


def test_missing_file_and_directory(tmp_path):
    with pytest.raises(ModelNotFoundError, match="no such file"):
        read_gguf(tmp_path / "nope.gguf")
    with pytest.raises(ModelFileError, match="directory"):
        read_gguf(tmp_path)
