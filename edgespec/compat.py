"""Can a draft model speculate for a target? Vocabulary checks, pure functions.

The rules mirror llama.cpp's common/speculative.cpp: drafted token ids are fed to the
target as-is, so both models must agree on the tokenizer, the special tokens, and the
text behind every ordinary id. The first few ids are exempt (llama.cpp starts at 5)
because families often differ only in their control tokens there.
"""

from __future__ import annotations

from edgespec.errors import IncompatibleModelsError
from edgespec.gguf import VocabInfo

MAX_SIZE_DIFFERENCE = 128
CHECK_START_TOKEN_ID = 5


def check_pair(target: VocabInfo, draft: VocabInfo, *, target_name: str, draft_name: str) -> None:
    """Raise IncompatibleModelsError naming the first mismatch between the vocabularies."""
    problem = _first_mismatch(target, draft, target_name, draft_name)
    if problem:
        raise IncompatibleModelsError(f"{draft_name} cannot draft for {target_name}: {problem}")


def compatible(
    target: VocabInfo, draft: VocabInfo, *, target_name: str, draft_name: str
) -> tuple[bool, str]:
    """(ok, one-line reason) for display, e.g. in `edgespec doctor`."""
    try:
        check_pair(target, draft, target_name=target_name, draft_name=draft_name)
    except IncompatibleModelsError as err:
        return False, err.message
    n = min(target.n_tokens, draft.n_tokens)
    return True, f"vocabularies match ({draft.model}, {n} tokens)"


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
