"""Can a draft model speculate for a target? Vocabulary checks from the two headers, pure functions.

Three outcomes (`pair_vocabularies`):
- identical: drafted ids are fed to the target as they are. The rules mirror llama.cpp's
  common/speculative.cpp: same tokenizer type, BOS, EOS and add_bos, sizes within
  MAX_SIZE_DIFFERENCE, the same text behind every id from CHECK_START_TOKEN_ID on (llama.cpp
  exempts the first few ids because families often differ only in control tokens there).
- mapped: the ordinary tokens (normal and byte tokens) are the same id for id, and the two
  differ only among control/special tokens and in unused padding rows at the end (a family's
  variants: a DeepSeek-R1-Distill-Qwen target with a Qwen2.5 draft). A `TokenMap` translates:
  ordinary ids pass through, a special token maps by its text where both have it, and one that
  only one side has is never drafted (the drafter masks it; the target decides it). The draft's
  BOS is the draft's own (see TokenMap.draft_context).
- refused (IncompatibleModelsError) naming the first mismatch: a different tokenizer, an
  ordinary token whose text differs, or ids shifted between ordinary and special.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from edgespec.errors import IncompatibleModelsError
from edgespec.gguf import VocabInfo

MAX_SIZE_DIFFERENCE = 128
CHECK_START_TOKEN_ID = 5

# llama.cpp's token types (llama_token_type / gguf TokenType).
UNDEFINED, NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = range(7)
ORDINARY = frozenset({UNDEFINED, NORMAL, BYTE})  # text the tokenizer makes from plain input
SPECIAL = frozenset({UNKNOWN, CONTROL, USER_DEFINED})  # mapped by text where both have it
# UNUSED rows (padding, e.g. "[PAD151900]") are never mapped and never drafted.

# When the header does not say whether the tokenizer adds BOS, llama.cpp's default for its type.
_ADD_BOS_DEFAULT = {"llama": True, "bert": True}


@dataclass(frozen=True)
class TokenMap:
    """Between a target's and a draft's ids, for a mapped pair. -1: no counterpart."""

    target_to_draft: np.ndarray = field(repr=False)  # int64[n target tokens]
    draft_to_target: np.ndarray = field(repr=False)  # int64[n draft tokens]
    target_bos: int | None  # the BOS the target's tokenizer puts first, None if it adds none
    draft_bos: int | None  # the same for the draft
    n_special: int  # special tokens both have (mapped by text)

    def draft_context(self, context) -> list[int]:
        """The draft's view of a target context. The target's own leading BOS goes and the draft's
        goes first when its tokenizer adds one; a target token the draft lacks is left out (the draft
        cannot see it, so it only costs acceptance, never correctness). A prefix of the context
        maps to a prefix of the result, so the draft's KV cache stays reusable between rounds."""
        ids = np.asarray(context, dtype=np.int64)
        if self.target_bos is not None and len(ids) and ids[0] == self.target_bos:
            ids = ids[1:]
        mapped = self.target_to_draft[ids[(ids >= 0) & (ids < len(self.target_to_draft))]]
        out = mapped[mapped >= 0].tolist()
        return [self.draft_bos, *out] if self.draft_bos is not None else out

    def draftable(self, n_rows: int) -> np.ndarray:
        """bool[n_rows] over the draft's logits: the ids that have a target counterpart."""
        ok = np.zeros(n_rows, dtype=bool)
        n = min(n_rows, len(self.draft_to_target))
        ok[:n] = self.draft_to_target[:n] >= 0
        return ok


@dataclass(frozen=True)
class Pairing:
    kind: str  # "identical" or "mapped"
    token_map: TokenMap | None  # None when identical
    summary: str  # one line for doctor


def pair_vocabularies(target: VocabInfo, draft: VocabInfo, *, target_name: str, draft_name: str) -> Pairing:
    """identical, mapped, or IncompatibleModelsError naming the first mismatch."""
    strict = _first_mismatch(target, draft, target_name, draft_name)
    if strict is None:
        n = min(target.n_tokens, draft.n_tokens)
        return Pairing("identical", None, f"identical vocabularies ({draft.model}, {n} tokens)")
    if _model_mismatch(target, draft, target_name, draft_name) or not (target.token_types and draft.token_types):
        raise IncompatibleModelsError(f"{draft_name} cannot draft for {target_name}: {strict}")
    problem = _ordinary_mismatch(target, draft, target_name, draft_name)
    if problem:
        raise IncompatibleModelsError(f"{draft_name} cannot draft for {target_name}: {problem}")
    token_map = build_map(target, draft)
    only_target = sum(1 for i, t in enumerate(target.token_types) if t in SPECIAL and token_map.target_to_draft[i] < 0)
    only_draft = sum(1 for i, t in enumerate(draft.token_types) if t in SPECIAL and token_map.draft_to_target[i] < 0)
    summary = (f"compatible through a map of {token_map.n_special} special tokens "
               f"({only_target} only in {target_name}, {only_draft} only in {draft_name}: never drafted)")
    return Pairing("mapped", token_map, summary)


def build_map(target: VocabInfo, draft: VocabInfo) -> TokenMap:
    t_types, d_types = target.token_types, draft.token_types
    t2d = np.full(target.n_tokens, -1, dtype=np.int64)
    d2t = np.full(draft.n_tokens, -1, dtype=np.int64)
    shared = min(target.n_tokens, draft.n_tokens)
    ordinary = [i for i in range(shared) if t_types[i] in ORDINARY]
    t2d[ordinary] = ordinary
    d2t[ordinary] = ordinary
    draft_specials: dict[str, int] = {}
    for i, (text, kind) in enumerate(zip(draft.tokens, d_types)):
        if kind in SPECIAL:
            draft_specials.setdefault(text, i)
    n_special = 0
    for i, (text, kind) in enumerate(zip(target.tokens, t_types)):
        j = draft_specials.get(text) if kind in SPECIAL else None
        if j is not None and d2t[j] < 0:
            t2d[i], d2t[j] = j, i
            n_special += 1
    return TokenMap(t2d, d2t, _auto_bos(target), _auto_bos(draft), n_special)


def _auto_bos(v: VocabInfo) -> int | None:
    add = v.add_bos if v.add_bos is not None else _ADD_BOS_DEFAULT.get(v.model, False)
    return v.bos_id if add and v.bos_id is not None else None


def _ordinary_mismatch(t: VocabInfo, d: VocabInfo, tn: str, dn: str) -> str | None:
    """The first id where one side has an ordinary token and the other has not the same one."""
    for i in range(max(t.n_tokens, d.n_tokens)):
        a = (t.tokens[i], t.token_types[i]) if i < t.n_tokens else None
        b = (d.tokens[i], d.token_types[i]) if i < d.n_tokens else None
        a_ord = a is not None and a[1] in ORDINARY
        b_ord = b is not None and b[1] in ORDINARY
        if not a_ord and not b_ord or (a_ord and b_ord and a[0] == b[0]):
            continue
        return f"token {i} is {_describe(a, tn)} but {_describe(b, dn)}"
    return None


def _describe(token, name: str) -> str:
    if token is None:
        return f"absent in {name}"
    text, kind = token
    return f"{text!r} in {name}" if kind in ORDINARY else f"special {text!r} in {name}"


def check_pair(target: VocabInfo, draft: VocabInfo, *, target_name: str, draft_name: str) -> None:
    """Raise IncompatibleModelsError naming the first mismatch, unless the ids can be fed as they are."""
    problem = _first_mismatch(target, draft, target_name, draft_name)
    if problem:
        raise IncompatibleModelsError(f"{draft_name} cannot draft for {target_name}: {problem}")


def compatible(
    target: VocabInfo, draft: VocabInfo, *, target_name: str, draft_name: str
) -> tuple[bool, str]:
    """(ok, one-line reason) for display, e.g. in `edgespec doctor`: which case the pair is."""
    try:
        pairing = pair_vocabularies(target, draft, target_name=target_name, draft_name=draft_name)
    except IncompatibleModelsError as err:
        return False, f"incompatible: {err.message}"
    return True, pairing.summary


def _first_mismatch(t: VocabInfo, d: VocabInfo, tn: str, dn: str) -> str | None:
    return (
        _model_mismatch(t, d, tn, dn)
        or _special_mismatch(t, d, tn, dn)
        or _size_mismatch(t, d, tn, dn)
        or _token_mismatch(t, d, tn, dn)
    )


def _model_mismatch(t: VocabInfo, d: VocabInfo, tn: str, dn: str) -> str | None:
    if t.model != d.model:
        return f"tokenizer types differ ({t.model!r} in {tn}, {d.model!r} in {dn})"
    return None


def _special_mismatch(t: VocabInfo, d: VocabInfo, tn: str, dn: str) -> str | None:
    for label, a, b in (("BOS", t.bos_id, d.bos_id), ("EOS", t.eos_id, d.eos_id)):
        if a != b:
            return f"{label} token id is {a} in {tn} but {b} in {dn}"
    # Unknown (absent) add_bos falls back to a per-tokenizer default, so only a
    # disagreement between two explicit values is a real mismatch.
    if t.add_bos is not None and d.add_bos is not None and t.add_bos != d.add_bos:
        return f"add_bos is {t.add_bos} in {tn} but {d.add_bos} in {dn}"
    return None


def _size_mismatch(t: VocabInfo, d: VocabInfo, tn: str, dn: str) -> str | None:
    diff = abs(t.n_tokens - d.n_tokens)
    if diff > MAX_SIZE_DIFFERENCE:
        return (
            f"vocabulary sizes differ by {diff} (more than {MAX_SIZE_DIFFERENCE}): "
            f"{t.n_tokens} in {tn}, {d.n_tokens} in {dn}"
        )
    return None


def _token_mismatch(t: VocabInfo, d: VocabInfo, tn: str, dn: str) -> str | None:
    for i in range(CHECK_START_TOKEN_ID, min(t.n_tokens, d.n_tokens)):
        if t.tokens[i] != d.tokens[i]:
            return f"token {i} is {t.tokens[i]!r} in {tn} but {d.tokens[i]!r} in {dn}"
    return None
