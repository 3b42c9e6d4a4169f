"""Draft/target vocabulary compatibility rules."""

from __future__ import annotations

import pytest

from edgespec.compat import check_pair, compatible
from edgespec.errors import IncompatibleModelsError
from edgespec.gguf import VocabInfo


def vocab(n=300, *, model="gpt2", bos=1, eos=2, add_bos=False, tokens=None) -> VocabInfo:
    tokens = tuple(tokens or [f"t{i}" for i in range(n)])
    return VocabInfo(model=model, pre=None, n_tokens=len(tokens), bos_id=bos, eos_id=eos,
                     eot_id=None, add_bos=add_bos, tokens=tokens)


def check(target, draft):
    check_pair(target, draft, target_name="big", draft_name="small")


def mismatch(target, draft) -> str:
    with pytest.raises(IncompatibleModelsError) as err:
        check(target, draft)
    message = str(err.value)
    assert message.startswith("small cannot draft for big: ") and "\n" not in message
    return message


def test_identical_vocabularies_pass():
    check(vocab(), vocab())
    ok, why = compatible(vocab(), vocab(), target_name="big", draft_name="small")
    assert ok and "300" in why


def test_tokenizer_model_differs():
    message = mismatch(vocab(model="gpt2"), vocab(model="llama"))
    assert "tokenizer types differ ('gpt2' in big, 'llama' in small)" in message


@pytest.mark.parametrize("kw, text", [
    ({"bos": 7}, "BOS token id is 1 in big but 7 in small"),
    ({"eos": None}, "EOS token id is 2 in big but None in small"),
    ({"add_bos": True}, "add_bos is False in big but True in small"),
])
def test_special_tokens_differ(kw, text):
    assert text in mismatch(vocab(), vocab(**kw))


def test_unknown_add_bos_is_not_a_mismatch():
    check(vocab(add_bos=None), vocab(add_bos=True))


def test_size_difference_limit():
    check(vocab(300), vocab(300 + 128))
    message = mismatch(vocab(300), vocab(300 + 129))
    assert "differ by 129" in message and "300 in big, 429 in small" in message


def test_token_text_differs():
    tokens = [f"t{i}" for i in range(300)]
    tokens[123] = "foo"
    message = mismatch(vocab(), vocab(tokens=tokens))
    assert "token 123 is 't123' in big but 'foo' in small" in message


def test_first_ids_are_exempt():
    tokens = [f"t{i}" for i in range(300)]
    tokens[:5] = ["a", "b", "c", "d", "e"]
    check(vocab(), vocab(tokens=tokens))


def test_first_mismatch_wins():
    # type differs and BOS differs: the type is reported
    assert "tokenizer types" in mismatch(vocab(), vocab(model="llama", bos=9))
    # BOS differs and the size differs a lot: BOS is reported
    assert "BOS" in mismatch(vocab(), vocab(1000, bos=9))
    # size differs and tokens differ: size is reported
    assert "sizes differ" in mismatch(vocab(), vocab(tokens=["x"] * 1000))


def test_compatible_reports_reason():
    ok, why = compatible(vocab(), vocab(model="llama"), target_name="big", draft_name="small")
    assert not ok and "tokenizer types differ" in why


def test_vocab_info_validates():
    with pytest.raises(ValueError):
        VocabInfo(model="gpt2", pre=None, n_tokens=3, bos_id=None, eos_id=None, eot_id=None,
                  add_bos=None, tokens=("a",))
