"""Test helper, run as its own process: copy a GGUF with its tokenizer metadata rewritten.

    python gguf_rewrite.py SRC DST SPEC.json

SPEC: {"rename": {"ID": "new text"}, "bos": ID, "add_bos": bool, "n_vocab": N}. n_vocab drops
padding rows at the end: the token arrays and the embedding/output rows are cut to N.

gguf-py (the `gguf` package) does the reading and writing. It stays in this process: its
dependencies (sentencepiece in some versions) must never share a process with a loaded model.
"""

from __future__ import annotations

import json
import sys

import gguf

VOCAB_ROWS = ("token_embd.weight", "output.weight")  # tensors with one row per token


def rewrite(src: str, dst: str, spec: dict) -> None:
    reader = gguf.GGUFReader(src)
    arch = reader.fields[gguf.Keys.General.ARCHITECTURE].contents()
    writer = gguf.GGUFWriter(dst, arch=arch, endianess=reader.endianess)
    tokens = list(reader.fields[gguf.Keys.Tokenizer.LIST].contents())
    types = list(reader.fields[gguf.Keys.Tokenizer.TOKEN_TYPE].contents())
    for token_id, text in spec.get("rename", {}).items():
        tokens[int(token_id)] = text
    n_vocab = spec.get("n_vocab", len(tokens))
    new = {
        gguf.Keys.Tokenizer.LIST: tokens[:n_vocab],
        gguf.Keys.Tokenizer.TOKEN_TYPE: types[:n_vocab],
    }
    if "bos" in spec:
        new[gguf.Keys.Tokenizer.BOS_ID] = spec["bos"]
    if "add_bos" in spec:
        new[gguf.Keys.Tokenizer.ADD_BOS] = spec["add_bos"]
    for field in reader.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue  # the writer writes these itself
        kind = field.types[0]
        sub = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
        value = new.pop(field.name, None)
        writer.add_key_value(field.name, field.contents() if value is None else value, kind, sub_type=sub)
    for key, value in new.items():  # keys the source did not have
        kind = gguf.GGUFValueType.BOOL if isinstance(value, bool) else gguf.GGUFValueType.UINT32
        writer.add_key_value(key, value, kind)
    datas = []
    for tensor in reader.tensors:
        data = tensor.data[:n_vocab] if tensor.name in VOCAB_ROWS else tensor.data
        writer.add_tensor_info(tensor.name, data.shape, data.dtype, data.nbytes, tensor.tensor_type)
        datas.append(data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for data in datas:
        writer.write_tensor_data(data, tensor_endianess=reader.endianess)
    writer.close()


if __name__ == "__main__":
    rewrite(sys.argv[1], sys.argv[2], json.loads(sys.argv[3]))
