"""Render a model's Jinja chat template (the ``chat_template`` of HF tokenizers and GGUF files).

The environment mirrors what chat templates are written against: a sandbox (templates come
with downloaded models, so they must not reach Python internals), ``trim_blocks`` and
``lstrip_blocks``, loop controls, a ``raise_exception`` helper, a ``tojson`` filter that keeps
non-ASCII text, and ``strftime_now``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from functools import lru_cache
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment


class ChatTemplateError(ValueError):
    """The template is invalid, or it rejected the conversation (``raise_exception``)."""


def _raise_exception(message: str) -> None:
    raise ChatTemplateError(message)


def _tojson(value: Any, indent: int | None = None, **kwargs: Any) -> str:
    return json.dumps(value, ensure_ascii=False, indent=indent, **kwargs)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


@lru_cache(maxsize=16)
def _compile(source: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    try:
        return env.from_string(source)
    except jinja2.TemplateError as e:
        raise ChatTemplateError(f"invalid chat template: {e}") from e


def render_chat_template(
    source: str,
    messages: Sequence[Mapping[str, Any]],
    *,
    add_generation_prompt: bool = True,
    bos_token: str | None = None,
    eos_token: str | None = None,
    **extra: Any,
) -> str:
    """Render ``messages`` (dicts with ``role`` and ``content``) into the prompt text.

    Args:
        source: the Jinja template.
        messages: the conversation.
        add_generation_prompt: append the header that opens the assistant's turn.
        bos_token / eos_token: token strings some templates insert.
        extra: further template variables (``tools``, ``documents``, ...).
    Raises:
        ChatTemplateError: malformed messages, an invalid template, or one that refuses them.
    """
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping) or "role" not in m:
            raise ChatTemplateError(f"message {i} must be a mapping with a 'role', got {m!r}")
    template = _compile(source)
    try:
        return template.render(
            messages=[dict(m) for m in messages],
            add_generation_prompt=add_generation_prompt,
            bos_token=bos_token or "",
            eos_token=eos_token or "",
            **extra,
        )
    except ChatTemplateError:
        raise
    except (jinja2.TemplateError, TypeError, KeyError, AttributeError) as e:
        raise ChatTemplateError(f"chat template failed on these messages: {e}") from e
