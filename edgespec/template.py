"""Chat templates from GGUF metadata, rendered so that message text can never become control tokens.

The template is rendered with each message's content replaced by a sentinel; the result is split
at the sentinels into (text, is_content) segments. Template text is tokenized with special-token
parsing on (it holds `<|im_start|>` and friends), message content with it off.
"""

from __future__ import annotations

import datetime
import functools
import re
from dataclasses import dataclass
from typing import Sequence

from .errors import InputError
import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

# ChatML: the de-facto default when a GGUF carries no template.
CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

ROLES = ("system", "user", "assistant")


@dataclass(frozen=True)
class Message:
    role: str
    content: str

    def __post_init__(self):
        if self.role not in ROLES:
            raise InputError(f"unknown chat role {self.role!r}; use one of {', '.join(ROLES)}")


def _sentinel(i: int) -> str:
    return f"\x00EDGESPEC{i}\x00"


_SPLIT = re.compile("\x00EDGESPEC(\\d+)\x00")


def _raise_exception(message):
    raise jinja2.TemplateError(message)


@functools.lru_cache(maxsize=8)
def _compiled(template: str) -> jinja2.Template:
    """The template compiled once per process: compiling a model's template (Qwen2.5's, with its
    tool-call branches) takes far longer than rendering it, and serve renders one per request on
    the engine thread, where every running stream waits for it."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)
    return env.from_string(template)


def render_segments(
    template: str | None,
    messages: Sequence[Message],
    *,
    bos_token: str = "",
    eos_token: str = "",
    add_generation_prompt: bool = True,
) -> list[tuple[str, bool]]:
    """Render; return [(text, is_message_content)] in order."""
    try:
        compiled = _compiled(template or CHATML)
        placeholders = [{"role": m.role, "content": _sentinel(i)} for i, m in enumerate(messages)]
        rendered = compiled.render(
            messages=placeholders,
            add_generation_prompt=add_generation_prompt,
            bos_token=bos_token,
            eos_token=eos_token,
        )
    except jinja2.TemplateError as err:
        raise InputError(f"the model's chat template failed: {err}") from None
    segments: list[tuple[str, bool]] = []
    pos = 0
    for match in _SPLIT.finditer(rendered):
        if match.start() > pos:
            segments.append((rendered[pos : match.start()], False))
        segments.append((messages[int(match.group(1))].content, True))
        pos = match.end()
    if pos < len(rendered):
        segments.append((rendered[pos:], False))
    return segments
