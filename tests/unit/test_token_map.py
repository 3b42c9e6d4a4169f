"""Near-compatible vocabularies: the pairing found from two headers, the id map, and a ModelDrafter
drafting through it (greedy output equal to the target's plain greedy decoding)."""

from __future__ import annotations

import numpy as np
import pytest

from edgespec.compat import BYTE, CONTROL, NORMAL, UNUSED, USER_DEFINED, compatible, pair_vocabularies
from edgespec.controller import Controller, CostModel
from edgespec.errors import IncompatibleModelsError
from edgespec.gguf import VocabInfo
from edgespec.sampling import SamplingConfig
from edgespec.drafters import ModelDrafter
from edgespec.speculative import SpecSettings, SpeculativeDecoder

from .fakes import FakeModel, plain_greedy, table_lm

ORD = 40  # ordinary tokens shared id for id


def vocab(specials, *, pads=0, bos=None, add_bos=False, ordinary=None, eos=None) -> VocabInfo:
    """ORD ordinary tokens (the first two byte tokens), then (text, type) specials, then pads."""
    tokens = list(ordinary or [f"t{i}" for i in range(ORD)])
    types = [BYTE, BYTE] + [NORMAL] * (len(tokens) - 2)
    for text, kind in specials:
        tokens.append(text)
        types.append(kind)
    for i in range(pads):
        tokens.append(f"[PAD{len(tokens)}]")
        types.append(UNUSED)
    ids = {t: i for i, t in enumerate(tokens)}
    return VocabInfo(model="gpt2", pre="qwen2", n_tokens=len(tokens), bos_id=ids.get(bos), eos_id=ids.get(eos),
                     eot_id=None, add_bos=add_bos, tokens=tuple(tokens), token_types=tuple(types))


# The DeepSeek-R1-Distill-Qwen / Qwen2.5 shape: the same BPE tokens; specials differ, BOS differs.
TARGET = vocab([("<|end|>", CONTROL), ("<bos>", CONTROL), ("<think>", USER_DEFINED), ("<|im_start|>", CONTROL)],
               pads=4, bos="<bos>", add_bos=True, eos="<|end|>")
DRAFT = vocab([("<|im_start|>", CONTROL), ("<|end|>", CONTROL), ("<|fim|>", CONTROL)], pads=1, eos="<|end|>")


def pair(target=TARGET, draft=DRAFT):
    return pair_vocabularies(target, draft, target_name="big", draft_name="small")


def test_identical_vocabularies_need_no_map():
    p = pair(DRAFT, DRAFT)
    assert p.kind == "identical" and p.token_map is None


def test_special_differences_give_a_map():
    p = pair()
    m = p.token_map
    assert p.kind == "mapped" and m.n_special == 2
    assert m.target_to_draft[:ORD].tolist() == list(range(ORD)) == m.draft_to_target[:ORD].tolist()
    assert m.target_to_draft[ORD:].tolist() == [ORD + 1, -1, -1, ORD, -1, -1, -1, -1]  # end, bos, think, im_start, pads
    assert m.draft_to_target[ORD:].tolist() == [ORD + 3, ORD, -1, -1]  # im_start, end, fim, pad
    assert (m.target_bos, m.draft_bos) == (ORD + 1, None)
    assert p.summary == "compatible through a map of 2 special tokens (2 only in big, 1 only in small: never drafted)"
    ok, why = compatible(TARGET, DRAFT, target_name="big", draft_name="small")
    assert ok and why == p.summary


def test_draft_context_drops_the_target_bos_and_what_the_draft_lacks():
    m = pair().token_map
    think, im_start = ORD + 2, ORD + 3
    assert m.draft_context([ORD + 1, im_start, 5, think, 6]) == [ORD, 5, 6]
    # a prefix maps to a prefix: the draft's KV cache stays reusable
    assert m.draft_context([ORD + 1, im_start, 5]) == m.draft_context([ORD + 1, im_start, 5, think, 6])[:2]
    # the other way round the draft's own BOS comes first
    back = pair(DRAFT, TARGET).token_map
    assert back.draft_bos == ORD + 1 and back.draft_context([ORD, 5]) == [ORD + 1, ORD + 3, 5]


def test_one_changed_ordinary_token_is_refused_naming_it():
    ordinary = [f"t{i}" for i in range(ORD)]
    ordinary[17] = "zz"
    draft = vocab([("<|im_start|>", CONTROL)], ordinary=ordinary)
    with pytest.raises(IncompatibleModelsError) as err:
        pair(TARGET, draft)
    assert str(err.value) == "small cannot draft for big: token 17 is 't17' in big but 'zz' in small"
    ok, why = compatible(TARGET, draft, target_name="big", draft_name="small")
    assert not ok and why.startswith("incompatible: small cannot draft for big: token 17")


def test_shifted_ids_are_refused():
    # the draft has one special where the target has an ordinary token: every id after it is shifted
    shifted = vocab([("<|im_start|>", CONTROL)], ordinary=[f"t{i}" for i in range(ORD - 1)] + ["<x>"])
    shifted = VocabInfo(**{**shifted.__dict__, "token_types": shifted.token_types[:ORD - 1] + (CONTROL,) + shifted.token_types[ORD:]})
    with pytest.raises(IncompatibleModelsError, match=rf"token {ORD - 1} is 't{ORD - 1}' in big but special '<x>' in small"):
        pair(TARGET, shifted)
    # and an ordinary token one side lacks is no padding row
    longer = vocab([], ordinary=[f"t{i}" for i in range(ORD)] + ["extra"])
    with pytest.raises(IncompatibleModelsError, match=rf"token {ORD} is special '<\|end\|>' in big but 'extra' in small"):
        pair(TARGET, longer)


def test_without_token_types_the_strict_rules_apply():
    bare = VocabInfo(**{**DRAFT.__dict__, "token_types": None})
    with pytest.raises(IncompatibleModelsError, match="BOS token id"):
        pair(TARGET, bare)


# -- drafting through the map --------------------------------------------------------------------

N_T, N_D = TARGET.n_tokens, DRAFT.n_tokens
FIM = ORD + 2  # a draft-only special the draft model loves


def target_lm():
    base = table_lm(3, vocab=ORD)

    def lm(ctx):
        out = np.full(N_T, -1e9, dtype=np.float32)
        out[:ORD] = base([t for t in ctx if t < ORD] or [1])
        return out

    return lm


def draft_lm(token_map):
    """The target's language seen through the map, plus a strong wish for a token the target lacks."""
    base = table_lm(3, vocab=ORD)

    def lm(ctx):
        out = np.full(N_D, -1e9, dtype=np.float32)
        out[:ORD] = base([t for t in ctx if t < ORD] or [1])
        if len(ctx) % 3 == 0:
            out[FIM] = 1e9
        return out

    return lm


def decoder(sampling, token_map, draft_model):
    target = FakeModel(target_lm(), vocab=N_T, eos=-1)
    drafter = ModelDrafter(draft_model, sampling, n_vocab_target=N_T, token_map=token_map)
    ctl = Controller(CostModel(draft_cost=0.1), k_min=1, k_max=4, learn_timing=False)
    return SpeculativeDecoder(target, sampling, ctl, SpecSettings(mode="draft"), drafter=drafter), drafter


PROMPT = [ORD + 1, ORD + 3, 5, 9, ORD + 2, 7]  # target BOS, <|im_start|>, text, <think>, text


def test_mapped_greedy_equals_plain_greedy_and_never_drafts_an_unmapped_token():
    m = pair().token_map
    draft_model = FakeModel(draft_lm(m), vocab=N_D, eos=-1)
    dec, drafter = decoder(SamplingConfig(temperature=0.0), m, draft_model)
    proposals = []
    propose = drafter.propose
    drafter.propose = lambda ctx, n: proposals.append(propose(ctx, n)) or proposals[-1]
    out = [e.token for e in dec.generate(PROMPT, 30)]
    assert out == plain_greedy(target_lm(), PROMPT, 30, eos=-1)
    drafted = [t for d in proposals for t in d.tokens]
    assert drafted and all(0 <= t < ORD for t in drafted)  # only ids the target has; never <|fim|>
    assert sum(r.accepted for r in dec.stats.rounds) > 0
    assert FIM not in draft_model.tokens and ORD + 2 not in draft_model.tokens[:1]


def test_mapped_sampling_gives_q_rows_over_the_target_vocabulary():
    m = pair().token_map
    sampling = SamplingConfig(temperature=0.8, top_k=0, top_p=1.0, min_p=0.0, seed=4)
    drafter = ModelDrafter(FakeModel(draft_lm(m), vocab=N_D, eos=-1), sampling, n_vocab_target=N_T, token_map=m)
    for n in range(3, 9):
        d = drafter.propose(PROMPT[:n] if n <= len(PROMPT) else PROMPT + [5] * (n - len(PROMPT)), 3)
        assert d.probs is not None and len(d.probs) == len(d.tokens)
        for tok, q in zip(d.tokens, d.probs):
            assert q.shape == (N_T,) and abs(q.sum() - 1) < 1e-9 and q[tok] > 0
            assert q[ORD:].sum() == 0  # nothing on ids the draft cannot map (its fim, the target's own specials)
    dec, _ = decoder(sampling, m, FakeModel(draft_lm(m), vocab=N_D, eos=-1))
    out = [e.token for e in dec.generate(PROMPT, 20)]
    assert len(out) == 20 and all(0 <= t < ORD for t in out)


def test_drafter_says_how_far_behind_its_view_is_and_settles_to_it():
    # What the decoder needs instead of comparing the draft's cache (draft ids) with target ids.
    m = pair().token_map
    draft_model = FakeModel(draft_lm(m), vocab=N_D, eos=-1)
    drafter = ModelDrafter(draft_model, SamplingConfig(temperature=0.0), n_vocab_target=N_T, token_map=m)
    assert drafter.behind(PROMPT) == len(m.draft_context(PROMPT)) == 4
    drafter.propose(PROMPT, 2)
    assert drafter.behind(PROMPT) == 0  # its cache holds the view (and maybe drafts beyond it)
    drafter.settle(PROMPT[:3])  # BOS, <|im_start|>, 5 -> the draft's <|im_start|>, 5
    assert draft_model.tokens == [ORD, 5]
    plain = ModelDrafter(FakeModel(target_lm(), vocab=N_T, eos=-1), SamplingConfig(temperature=0.0))
    assert plain.view(PROMPT) is PROMPT and plain.behind(PROMPT) == len(PROMPT)
