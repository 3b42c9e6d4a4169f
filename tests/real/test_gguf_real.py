"""The GGUF reader and compat rules against the real registry models.

Models come through models.resolve, so an empty cache (CI) pulls them first.
"""

from __future__ import annotations

import pytest

from edgespec import models
from edgespec.compat import check_pair, compatible
from edgespec.errors import IncompatibleModelsError, ModelFileError
from edgespec.gguf import read_gguf

pytestmark = pytest.mark.real

QWEN_15 = "qwen2.5-coder-1.5b-instruct-q4_k_m"
QWEN_05 = "qwen2.5-coder-0.5b-instruct-q4_k_m"
SMOL = "smollm2-135m-instruct-q4_1"
GEMMA = "gemma-3-270m-q4_k_m"

# name -> (architecture, quant, layers, vocabulary size, tokenizer model)
FACTS = {
    QWEN_15: ("qwen2", "Q4_K_M", 28, 151936, "gpt2"),
    QWEN_05: ("qwen2", "Q4_K_M", 24, 151936, "gpt2"),
    SMOL: ("llama", "Q4_1", 30, 49152, "gpt2"),
    GEMMA: ("gemma3", "Q4_K_M", 18, 262144, "llama"),
}


@pytest.fixture(scope="session")
def info_of(model_path):
    cache = {}

    def get(name):
        if name not in cache:
            cache[name] = read_gguf(model_path(name), vocab=True)
        return cache[name]

    return get


@pytest.mark.parametrize("name", list(FACTS))
def test_model_facts(info_of, name):
    info = info_of(name)
    arch, quant, layers, n_vocab, tokenizer = FACTS[name]
    assert (info.architecture, info.quant, info.n_layers) == (arch, quant, layers)
    assert len(info.layer_bytes) == layers and all(b > 0 for b in info.layer_bytes)
    assert info.vocab.n_tokens == n_vocab and info.n_vocab == n_vocab
    assert info.vocab.model == tokenizer
    assert info.file_size == models.load_registry().models[name].size


@pytest.mark.parametrize("name", list(FACTS))
def test_sizes_add_up(info_of, name):
    info = info_of(name)
    assert sum(info.layer_bytes) + info.nonlayer_bytes == info.tensor_bytes
    data = info.file_size - info.data_offset
    assert abs(data - info.tensor_bytes) <= 0.01 * data
    assert 0 < info.output_bytes < info.nonlayer_bytes + 1


def test_qwen_hyperparameters(info_of):
    info = info_of(QWEN_15)
    assert (info.n_embd, info.n_head, info.n_head_kv, info.head_dim_k) == (1536, 12, 2, 128)
    assert info.n_ctx_train == 32768
    assert "<|im_start|>" in info.chat_template
    assert info.vocab.eos_id == 151645


def test_gemma_head_dim_from_key_length(info_of):
    info = info_of(GEMMA)
    assert (info.n_embd, info.n_head, info.head_dim_k, info.head_dim_v) == (640, 4, 256, 256)


def test_qwen_pair_is_compatible(info_of):
    target, draft = info_of(QWEN_15).vocab, info_of(QWEN_05).vocab
    check_pair(target, draft, target_name=QWEN_15, draft_name=QWEN_05)
    assert compatible(target, draft, target_name=QWEN_15, draft_name=QWEN_05)[0]


def test_smollm_cannot_draft_for_qwen(info_of):
    with pytest.raises(IncompatibleModelsError) as err:
        check_pair(info_of(QWEN_15).vocab, info_of(SMOL).vocab, target_name=QWEN_15, draft_name=SMOL)
    assert str(err.value) == (
        f"{SMOL} cannot draft for {QWEN_15}: BOS token id is 151643 in {QWEN_15} but 1 in {SMOL}"
    )


def test_gemma_cannot_draft_for_qwen(info_of):
    ok, why = compatible(info_of(QWEN_15).vocab, info_of(GEMMA).vocab,
                         target_name=QWEN_15, draft_name=GEMMA)
    assert not ok and "tokenizer types differ" in why


@pytest.mark.parametrize("keep", [10, 5000, 2_000_000, -1000])
def test_truncated_copy_is_rejected(model_path, tmp_path, keep):
    source = model_path(SMOL)
    size = source.stat().st_size
    n = keep if keep > 0 else size + keep
    with open(source, "rb") as f:
        (tmp_path / "cut.gguf").write_bytes(f.read(n))
    with pytest.raises(ModelFileError, match="truncated"):
        read_gguf(tmp_path / "cut.gguf")


def test_real_file_cached_after_resolve(model_path):
    entry = models.load_registry().models[SMOL]
    assert model_path(SMOL) == models.cached_path(entry) and models.is_cached(entry)
