"""The copy-following n-gram drafter, driven token by token as the decoder drives it."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, strategies as st

from edgespec.controller import Controller
from edgespec.costs import CostModel
from edgespec.drafters import (EMPTY, PRIORS, Draft, Fork, ModelDrafter, NgramDrafter, NgramState, RunHistory,
                               common_prefix_len, copy_path, run_bucket)
from edgespec.sampling import SamplingConfig
from edgespec.speculative import SpecSettings, SpeculativeDecoder

from .fakes import EOS, FakeModel


def follow(drafter: NgramDrafter, prompt: list[int], output: list[int], k: int = 64):
    """Feed `output` one token at a time (as accepted text arrives); return each proposal made before a token."""
    proposals = []
    ctx = list(prompt)
    for tok in output:
        proposals.append(drafter.propose(ctx, k))
        ctx.append(tok)
    return proposals


SOURCE = list(range(100, 160))  # 60 distinct "code" tokens
PROMPT = [1, 2, *SOURCE, 3, 4]


def test_run_buckets():
    assert [run_bucket(r) for r in (0, 1, 2, 3, 4, 7, 8, 15, 16, 63, 64, 500)] == [1, 1, 2, 2, 4, 4, 8, 8, 16, 32, 64, 64]


def test_the_states_are_the_twenty_the_drafter_can_produce():
    states = [NgramState(kind, run) for kind, run in PRIORS]
    assert len(states) == 20  # copy x 7 run buckets, resume, find and echo below a long run x 4, edit
    assert {s.kind for s in states} == {"copy", "resume", "find", "echo", "edit"}
    for impossible in (("find", 16), ("echo", 16), ("resume", 32), ("copy", 3), ("edit", 1), ("draft", None)):
        with pytest.raises(ValueError):
            NgramState(*impossible)  # a 16-token find is a copy; 3 is no bucket; edit has no run
    assert {s for s in states if s.trusted} == {NgramState("copy", 16), NgramState("copy", 32), NgramState("copy", 64)}
    assert str(NgramState("copy", 16)) == "ngram/copy/r16" and str(NgramState("edit")) == "ngram/edit"
    # the drafter's proposals carry their state's own prior
    seen = [p for out in (SOURCE[:50], SOURCE[:20] + [999] + SOURCE[21:40]) for p in follow(NgramDrafter(), PROMPT, out)]
    assert {p.key.kind for p in seen if p.tokens} == {"find", "copy", "resume", "edit"}
    assert all(p.prior == PRIORS[(p.key.kind, p.key.run)] for p in seen if p.tokens)


def test_a_verbatim_copy_earns_long_drafts_as_the_run_grows():
    d = NgramDrafter()
    props = follow(d, PROMPT, SOURCE[:40])
    # after the first token the copy is found; from then on every proposal is the rest of the source
    for i, p in enumerate(props[1:], start=1):
        assert p.tokens[: len(SOURCE) - i] == tuple(SOURCE[i:]), i
    keys = [p.key for p in props[1:]]
    assert keys[0] == NgramState("find", 1)
    assert NgramState("copy", 16) in keys and NgramState("copy", 32) in keys
    assert d.run == 39  # the last token is seen at the next proposal


def test_a_prompt_that_ends_inside_a_copy_is_a_long_copy_already():
    # a "continue", an editor's half-written file: the output and its source already agree for 30
    # tokens, so the copy is a long one (trusted on its own record), not a 4-token find
    props = follow(NgramDrafter(), [*PROMPT, *SOURCE[:30]], SOURCE[30:32])
    assert props[0].tokens[:30] == tuple(SOURCE[30:]) and props[0].key == NgramState("copy", 16)
    assert props[0].key.trusted and props[0].history.run == 30
    # counted up to the longest run bucket
    long_source = list(range(300, 400))
    props = follow(NgramDrafter(), [1, *long_source, 2, *long_source[:90]], long_source[90:91])
    assert props[0].tokens[:10] == tuple(long_source[90:]) and props[0].key == NgramState("copy", 64)
    assert props[0].history.run == 64
    # four tokens that agree only as far as the n-gram that found them are a fresh find, as before
    props = follow(NgramDrafter(), [*PROMPT, 7, *SOURCE[:4]], SOURCE[4:5])
    assert props[0].tokens[:3] == tuple(SOURCE[4:7]) and props[0].key == NgramState("find", 4)


def test_a_match_found_anywhere_is_the_occurrence_the_output_agrees_with_furthest_back():
    # two occurrences of the same four tokens go on differently; the later one is what a lookup of
    # the latest occurrence finds, the earlier one is what the output has been copying
    first = [10, 11, 12, 13, 50, 51, 52, 53, 60, 61, 62, 63]
    later = [20, 21, 50, 51, 52, 53, 70, 71, 72, 73]
    props = follow(NgramDrafter(), [1, *first, 2, *later, 3, 11, 12, 13, 50, 51, 52, 53], [60])
    assert props[0].tokens[:4] == (60, 61, 62, 63) and props[0].history.run == 7
    # of occurrences that agree as far, the latest
    props = follow(NgramDrafter(), [1, *first, 2, *later, 3, 50, 51, 52, 53], [70])
    assert props[0].tokens[:4] == (70, 71, 72, 73) and props[0].history.run == 4


def test_a_copy_draft_says_which_state_each_of_its_tokens_would_be_drafted_in():
    # a find 5 tokens in: tokens at runs 5-7 are find/r4, 8-15 find/r8, from 16 on the copy is long
    assert copy_path("find", 5, 20) == ((NgramState("find", 4), 3), (NgramState("find", 8), 8),
                                        (NgramState("copy", 16), 9))
    assert copy_path("copy", 40, 30) == ((NgramState("copy", 32), 24), (NgramState("copy", 64), 6))
    d = NgramDrafter()
    props = follow(d, PROMPT, SOURCE[:10])
    last = props[-1]  # 9 tokens copied: a find at run 9
    assert last.key == NgramState("find", 8) and last.path[0] == (NgramState("find", 8), 7)
    assert sum(n for _, n in last.path) == len(last.tokens)
    assert last.states(10) == [(NgramState("find", 8), 7), (NgramState("copy", 16), 3)]
    assert last.states(0) == []


def test_a_match_in_the_answer_itself_is_an_echo_and_a_copy_only_once_it_has_held():
    # the answer repeats a phrase of its own (a code idiom, a list item's format): not a source it
    # copies. Found in the prompt, the same tokens are a find.
    phrase = list(range(500, 540))
    answer = [7, *phrase[:12], 8, 9, *phrase[:12]]
    props = follow(NgramDrafter(), PROMPT, answer)
    echo = props[-1]  # 11 tokens of the phrase repeated: run 11, found in the answer
    assert echo.key == NgramState("echo", 8) and echo.tokens[:1] == (phrase[11],)
    assert echo.prior == PRIORS[("echo", 8)] < PRIORS[("find", 8)]
    found = follow(NgramDrafter(), [*PROMPT, *phrase], phrase[:12])[-1]
    assert found.key == NgramState("find", 8) and found.tokens[:1] == (phrase[11],)
    # its drafted tokens past LONG_RUN stay at the echo's rate: no recorded echo held that long
    assert copy_path("echo", 11, 10) == ((NgramState("echo", 8), 10),)
    assert copy_path("find", 11, 10) == ((NgramState("find", 8), 5), (NgramState("copy", 16), 5))
    # held 16 tokens, an echo is a copy like any other (trusted on its own record)
    long = follow(NgramDrafter(), PROMPT, [7, *phrase, 8, 9, *phrase[:20]])[-1]
    assert long.key == NgramState("copy", 16) and long.key.trusted
    # a chat's next turn: what the earlier turns hold is context, not this answer (start())
    d = NgramDrafter()
    follow(d, PROMPT, [7, *phrase[:12], 8])
    turn = [*PROMPT, 7, *phrase[:12], 8, 30, 31]  # the first answer and a new user message
    d.start(len(turn))
    assert follow(d, turn, phrase[:12])[-1].key == NgramState("find", 8)
    # not told, a drafter takes the first context after a reset for the prompt, each time
    d = NgramDrafter()
    follow(d, PROMPT, [7, *phrase[:12], 8])
    assert follow(d, [5, 6], [*phrase[:12], 8, *phrase[:12]])[-1].key == NgramState("echo", 8)


def test_the_decoder_tells_the_drafter_where_each_answer_starts():
    def lm(ctx):  # says the end at once: what matters is what the decoder told the drafter
        out = np.full(8, -5.0, dtype=np.float32)
        out[EOS] = 5.0
        return out

    ngram = NgramDrafter()
    ctl = Controller(CostModel(verify={2: 1.4, 3: 1.5, 4: 1.6, 5: 1.9, 8: 2.8}), k_max=8, learn_timing=False)
    dec = SpeculativeDecoder(FakeModel(lm), SamplingConfig(temperature=0.0), ctl, SpecSettings(mode="ngram"), ngram=ngram)
    first = [1, 4, 5, 6, 4, 5]
    list(dec.generate(first, 4))
    assert ngram._answer_from == len(first)
    later = [*first, EOS, 2, 3, 4, 5]  # the same context grown by the answer and a new user turn
    list(dec.generate(later, 4))
    assert ngram._answer_from == len(later)


def test_after_a_substitution_the_copy_resumes_at_once():
    # the output replaces source token 120 by 999, then goes on copying
    out = SOURCE[:20] + [999] + SOURCE[21:40]
    d = NgramDrafter()
    props = follow(d, PROMPT, out)
    # just after the edit: the guess is that 999 replaced one token, so the copy goes on from 121
    after_edit = props[21]
    assert after_edit.key == NgramState("edit")
    assert after_edit.tokens[:5] == tuple(SOURCE[21:26])
    # and once 121 arrives the copy is found again near where it was: a resumed long copy
    assert props[22].tokens[:5] == tuple(SOURCE[22:27])
    assert props[22].key.kind == "resume"
    # it carries the 20 tokens the copy held before the edit: what it has earned (controller.RISK_PER_RUN)
    resumed = props[22].history
    assert resumed.resumes == 20 and resumed.earned == resumed.run + 20
    assert props[19].history.resumes == 0  # the first run resumes nothing


def test_a_match_found_again_near_a_chance_match_that_broke_is_still_a_guess():
    # free text: "105" happens to occur in the prompt, the output goes on differently after one token,
    # and a few tokens later it happens to match next to that spot again. Neither is a copy: the
    # second match is judged as a fresh find (prior 0.2), not as a copy found again (0.7).
    out = [105, 900, 901, 108]
    props = follow(NgramDrafter(), PROMPT, out + [109])
    assert props[1].key == NgramState("find", 1)  # after 105: a 1-token find
    assert props[4].tokens[:3] == tuple(SOURCE[9:12]) and props[4].key == NgramState("find", 1)
    # the same re-find after a copy that had held (4 tokens) is the copy found again
    out = SOURCE[5:9] + [900, 901, 108]
    props = follow(NgramDrafter(), PROMPT, out + [109])
    assert props[7].tokens[:3] == tuple(SOURCE[9:12]) and props[7].key.kind == "copy"


def test_an_insertion_is_found_again_near_the_copy_position():
    out = SOURCE[:10] + [777, 778] + SOURCE[10:30]  # two tokens inserted
    d = NgramDrafter()
    props = follow(d, PROMPT, out)
    # after the insertion and one copied token, the copy is back on track
    assert props[13].tokens[:5] == tuple(SOURCE[11:16])


def test_a_rename_is_learnt_and_proposed_at_its_next_occurrence():
    # source: x = a ; y = a ; z = a ...  ("a" = 50 occurs several times); the output renames a -> 60 61
    src = [10, 11, 50, 12, 13, 14, 20, 21, 50, 22, 23, 24, 30, 31, 50, 32, 33, 34]
    out = [10, 11, 60, 61, 12, 13, 14, 20, 21, 60, 61, 22, 23, 24, 30, 31, 60, 61, 32, 33, 34]
    d = NgramDrafter()
    props = follow(d, [1, *src, 2], out)
    # before the second "a": the proposal already carries the rename, marked as a guess
    assert props[8].tokens[:5] == (21, 60, 61, 22, 23)
    assert props[8].confidence[1] < 1.0 and props[8].confidence[0] == props[8].confidence[2] == 1.0
    assert props[15].tokens[:4] == (31, 60, 61, 32)
    (sub,) = [s for subs in d.subs.values() for s in subs]
    assert sub.src == (50,) and sub.repl == (60, 61) and sub.hits >= 2 and sub.state == "replace"
    # each time the output makes the edit again it becomes a surer bet
    assert props[15].confidence[1] > props[8].confidence[1]


def test_an_edit_made_once_is_dropped_when_the_output_keeps_the_source_again():
    src = [10, 11, 50, 12, 13, 14, 20, 21, 50, 22, 23, 24, 25, 26, 50, 27, 28, 29, 30, 31, 50, 32, 33]
    out = [10, 11, 70, 12, 13, 14, 20, 21, 50, 22, 23, 24, 25, 26, 50, 27, 28, 29, 30, 31, 50, 32, 33]
    d = NgramDrafter()
    props = follow(d, [1, *src, 2], out)
    assert props[7].tokens[:2] == (21, 70)  # proposed the learnt edit once (as a guess)...
    (sub,) = [s for subs in d.subs.values() for s in subs]
    # ...kept once: unsure, so the next draft stops before it and the target decides...
    assert props[13].tokens == (26,)
    # ...kept twice: the edit was a one-off, the source is copied as it is again
    assert sub.state == "keep"
    assert props[19].tokens[:3] == (31, 50, 32) and props[19].confidence is None


def test_an_edit_made_differently_each_time_ends_drafts_before_it():
    # `var` (50) becomes `let` (60) or `const` (70) depending on the line: a hazard, not a rename
    src = [10, 50, 11, 12, 13, 14, 15, 50, 16, 17, 18, 19, 20, 50, 21, 22, 23, 24, 25, 50, 26, 27]
    out = [10, 70, 11, 12, 13, 14, 15, 60, 16, 17, 18, 19, 20, 70, 21, 22, 23, 24, 25, 60, 26, 27]
    d = NgramDrafter()
    props = follow(d, [1, *src, 2], out)
    (sub,) = [s for subs in d.subs.values() for s in subs]
    assert sub.state == "hazard"
    assert props[18].tokens == (25,)  # stops before the next `var`: the target picks let or const
    assert props[20].tokens[:2] == (26, 27)  # and the copy goes on after it


def test_free_text_gives_only_weak_guesses():
    rng = np.random.default_rng(0)
    prompt = list(rng.integers(0, 50, 80))
    out = list(rng.integers(50, 100, 60))  # never copies the prompt
    d = NgramDrafter()
    for p in follow(d, prompt, out):
        assert getattr(p.key, "kind", None) != "copy" or run_bucket(d.run) <= 2


def test_priors_make_the_controller_draft_long_only_in_a_long_copy():
    cost = CostModel(verify={2: 1.97, 4: 3.0, 8: 4.9, 16: 7.8, 32: 13.5, 64: 23.5})
    ctl = Controller(cost, k_max=64)
    d = NgramDrafter()
    props = follow(d, PROMPT, SOURCE[:50])
    early = ctl.choose(props[1].key, 0.0, len(props[1].tokens), prior=props[1].prior).k
    late = ctl.choose(props[45].key, 0.0, len(props[45].tokens), prior=props[45].prior).k
    assert early == 0  # a 1-token match anywhere is not worth a verify batch
    assert late >= 12  # a 44-token verified copy is


def copy_lm(source_prompt: list[int], answer: list[int], vocab: int):
    """A fake target whose greedy output after the prompt is `answer`, then EOS."""

    def lm(ctx):
        out = np.full(vocab, -5.0, dtype=np.float32)
        i = len(ctx) - len(source_prompt)
        out[answer[i] if 0 <= i < len(answer) else 0] = 5.0
        return out

    return lm


def test_decoder_with_copy_drafts_equals_plain_and_uses_few_passes():
    vocab = 1000
    # five blocks of 30 distinct tokens, each using identifier 50 once; the answer renames it to 60 61
    src = [t for b in range(5) for t in [*range(100 + 40 * b, 115 + 40 * b), 50, *range(115 + 40 * b, 129 + 40 * b)]]
    answer = [t for s in src for t in ((60, 61) if s == 50 else (s,))]
    prompt = [1, *src, 2]
    lm = copy_lm(prompt, answer, vocab)
    target = FakeModel(lm, n_ctx=512, vocab=vocab)
    cost = CostModel(verify={2: 1.97, 4: 3.0, 8: 4.9, 16: 7.8, 32: 13.5, 64: 23.5})
    ctl = Controller(cost, k_max=64, learn_timing=False)
    dec = SpeculativeDecoder(target, SamplingConfig(), ctl, SpecSettings(mode="auto", draft_max=64), ngram=NgramDrafter())
    out = [e.token for e in dec.generate(prompt, 200)]
    assert out == answer
    # the first block is found and copied; every later rename is proposed before it is seen
    assert len(dec.stats.rounds) < len(answer) / 4
    assert sum(r.accepted for r in dec.stats.rounds) > 0.7 * len(answer)


def test_a_deletion_is_followed_but_not_learnt_as_an_edit():
    src = [10, 11, 50, 51, 12, 13, 14, 15, 20, 21, 50, 51, 22, 23, 24, 25]
    out = [10, 11, 12, 13, 14, 15, 20, 21, 50, 51, 22, 23, 24, 25]  # the first "50 51" was removed
    d = NgramDrafter()
    props = follow(d, [1, *src, 2], out)
    assert props[4].tokens[:3] == (14, 15, 20)  # the copy is found again right after the deletion
    assert not d.subs  # an empty replacement is never proposed


def test_a_reindented_copy_is_found_again_near_the_source_and_its_dedent_learnt():
    # Source lines "<indent> self.a = 1" ...; the answer drops the indent ("self" without its
    # space is another token). "self" alone first matches some other place (a weak find); the
    # copy must still be found next to the original line, and the dedent proposed on later lines.
    NL, IND, SELF, BARE, EQ, W = 1, 2, 3, 4, 5, 6
    A, B, C, D = 10, 11, 12, 13
    source = [NL, IND, SELF, A, EQ, 20, NL, IND, SELF, B, EQ, 21, NL, IND, SELF, C, EQ, 22, NL, IND, SELF, D, EQ, 23, NL]
    prompt = [W, BARE, 30, 31, W] + source + [W, W]
    d = NgramDrafter()
    out = [BARE, A, EQ, 20, NL, BARE, B, EQ, 21, NL]
    for i in range(len(out) + 1):
        draft = d.propose(prompt + out[:i], 8)
    assert draft.tokens[:4] == (BARE, C, EQ, 22)


def test_a_short_runs_history_leaves_out_runs_found_longer_than_it():
    # "50 51 52" twice in the prompt, going on differently: the output's "60" after the second
    # occurrence's "50 51 52" is found again by a 4-token match, so that run starts at 4 and breaks at 6
    prompt = [1, 2, 50, 51, 52, 60, 61, 62, 63, 64, 5, 6, 50, 51, 52, 70, 71, 72, 73, 74, 7, 8, 200, 201, 202, 203, 9]
    d = NgramDrafter()
    props = follow(d, prompt, [50, 51, 52, 60, 61, 62, 999, 200, 201, 202])
    assert d.ended == [3, 6]
    # a run of 2 (found by one token) goes on as often as the runs that were once 2 long did: the run
    # that started at 4 never was, and counting it made every 2-token find look likelier to hold
    assert props[-1].history == RunHistory(run=2, ended=(3,))
    assert props[-1].history.reaching(3) == 1 and props[-1].history.reaching(6) == 0
    assert props[5].history == RunHistory(run=5, ended=(3,))  # at run 5 every ended run counts


def test_a_copy_draft_carries_how_long_this_contexts_earlier_copies_held():
    # the output copies the source in runs of 10, each ended by an edit: every break is remembered
    out = []
    for start in (0, 11, 22, 33):
        out += SOURCE[start:start + 10] + [900 + start]
    d = NgramDrafter()
    props = follow(d, PROMPT, out + SOURCE[44:50])
    last = props[-1]  # made with 5 tokens of the fifth run copied
    assert last.history == RunHistory(run=5, ended=(10, 10, 10, 10))
    assert last.history.reaching(10) == 4 and last.history.reaching(11) == 0
    assert NgramDrafter().propose(PROMPT + SOURCE[:3], 8).history.ended == ()  # nothing ended yet


# ---- forks: where an earlier copy of the same text broke -----------------------------------------
SKELETON, MIDDLE = list(range(200, 212)), list(range(220, 226))  # `  {"name": "` and `", "email": "`


def record(i: int) -> list[int]:
    """One JSON record of a list: the skeleton every record shares, then its own name and e-mail."""
    return SKELETON + [300 + 10 * i, 301 + 10 * i, 302 + 10 * i] + MIDDLE + [400 + 10 * i, 401 + 10 * i]


def test_a_templates_varying_slot_is_a_guess_in_the_next_records_copy():
    # record 2 copies record 1's skeleton and breaks at the name: from then on a copy through a
    # record's name or e-mail is a guess there, and the rest of the template is not
    out = record(0) + record(1) + record(2)
    d = NgramDrafter()
    props = follow(d, [1, 2, 3, 4, 5], out)
    third = props[len(record(0)) * 2 + 4]  # four tokens into the third record's skeleton
    name_at = len(SKELETON) - 4  # the drafted position of the second record's name
    assert third.tokens[name_at] == 310 and third.confidence is not None
    assert third.confidence[name_at] < 0.5 and set(third.confidence[:name_at]) == {1.0}
    # the controller stops right before the guess: the skeleton is sure, the name is not
    cost = CostModel(verify={2: 1.97, 4: 3.0, 8: 4.9, 12: 6.6, 16: 7.8, 32: 13.5, 64: 23.5})
    choice = Controller(cost, k_max=64).choose(third.key, 0.0, len(third.tokens), prior=0.97, confidence=third.confidence)
    assert 0 < choice.k <= name_at
    # without the fork (the same draft, every token sure) it would have bet on the old name
    assert Controller(cost, k_max=64).choose(third.key, 0.0, len(third.tokens), prior=0.97).k > name_at


def test_a_fork_later_copies_go_through_unchanged_is_trusted_again():
    # the output copies the source with one edit (999 for SOURCE[20]), then writes that edited copy
    # again: the edit's position is a fork, and the copy that goes through it as it is counts
    edited = SOURCE[:20] + [999] + SOURCE[21:40]
    d = NgramDrafter()
    follow(d, PROMPT, edited)
    (slot,) = [p for p in d.forks if d._ctx[p] == 999]
    first = d.forks[slot].confidence
    follow(d, PROMPT, edited * 2)
    assert d.forks[slot].held == 1 and d.forks[slot].broke == 1
    assert first < d.forks[slot].confidence == 0.5
    assert Fork(broke=3).confidence < Fork(broke=1).confidence < Fork(broke=1, held=3).confidence


def test_a_verbatim_copy_and_a_short_chance_match_make_no_fork():
    d = NgramDrafter()
    follow(d, PROMPT, SOURCE[:40])
    assert d.forks == {}
    # "find" matches of a few tokens that break (free text echoing bits of the prompt) are no forks
    follow(d, PROMPT, SOURCE[:3] + [900, 901] + SOURCE[30:33] + [902])
    assert d.forks == {}


# ---- common_prefix_len: a C-speed comparison when one holds the other, the loop otherwise --------
@given(st.lists(st.integers(0, 3), max_size=40), st.lists(st.integers(0, 3), max_size=40))
def test_common_prefix_len_is_the_first_difference(a, b):
    n = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    assert common_prefix_len(a, b) == n == common_prefix_len(b, a)
    assert common_prefix_len(tuple(a), b) == n  # any sequences: a cache's tuple against a list
    assert common_prefix_len(np.array(a, dtype=np.int32), b) == n


# ---- a draft stops at the end of the answer ------------------------------------------------------
def test_a_draft_ends_before_its_first_end_token():
    eog = {0, 9}.__contains__
    d = Draft((5, 6, 9, 7, 0), "ngram", NgramState("copy", 16), confidence=(1.0, 0.5, 1.0, 1.0, 1.0))
    cut = d.until_end(eog)
    assert cut.tokens == (5, 6) and cut.confidence == (1.0, 0.5) and cut.key == d.key
    probs = tuple(np.full(3, 1 / 3) for _ in range(3))
    m = Draft((4, 0, 4), "draft", "draft", probs)
    assert m.until_end(eog).tokens == (4,) and len(m.until_end(eog).probs) == 1
    assert d.until_end(lambda t: False) is d  # no end token: the same draft
    assert Draft((9, 5), "ngram", "ngram").until_end(eog) is EMPTY  # the answer ends next: nothing to draft


def test_the_draft_model_stops_drafting_at_its_own_end_token():
    """Tokens after an end token the draft model proposes could never be accepted: it decodes none."""

    def lm(ctx):
        out = np.full(8, -1e9)
        out[EOS if len(ctx) == 6 else (ctx[-1] + 1) % 8 or 1] = 1e9
        return out

    model = FakeModel(lm)
    draft = ModelDrafter(model, SamplingConfig(temperature=0.0)).propose([1, 2, 3], 8)
    assert draft.tokens[-1] == EOS and len(draft.tokens) == 4  # 4, 5, 6, then the end
    assert sum(model.decode_calls) == 3 + 3  # the context, then one decode per drafted token before the end
