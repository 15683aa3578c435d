"""Chat templates: a model folder's Jinja template, rendered in a sandbox, as transformers renders it."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

from specframe.errors import CheckpointError, InputError

TEMPLATE_FILES = ("chat_template.jinja", "tokenizer_config.json")


def read_chat_template(folder: Path) -> str | None:
    """The chat template of a model folder (``chat_template.jinja``, else ``tokenizer_config.json``), or ``None``.

    Raises:
        CheckpointError: If ``tokenizer_config.json`` is not valid JSON or its template is not a string.
    """
    jinja = folder / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8")
    config = folder / "tokenizer_config.json"
    if not config.is_file():
        return None
    try:
        template = json.loads(config.read_text(encoding="utf-8")).get("chat_template")
    except (json.JSONDecodeError, UnicodeDecodeError, AttributeError) as exc:
        raise CheckpointError(f"{config} is not a JSON object ({exc}); restore it from the model's files") from exc
    if template is not None and not isinstance(template, str):
        raise CheckpointError(f"{config}: chat_template must be a string (named templates are not supported)")
    return template


def render_chat(
    template: str, messages: Sequence[Mapping[str, str]], *, add_generation_prompt: bool = True, **extra: object
) -> str:
    """Render ``messages`` (``{"role", "content"}`` dicts) with ``template``, ready for the assistant's turn.

    Raises:
        InputError: If a message is malformed or the template fails on it (its message is kept).
    """
    from jinja2 import TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    for index, message in enumerate(messages):
        if (
            not isinstance(message, Mapping)
            or not isinstance(message.get("role"), str)
            or not isinstance(message.get("content"), str)
        ):
            raise InputError(f"chat message {index} must be an object with string 'role' and 'content'")

    def raise_exception(text: str) -> None:
        raise TemplateError(text)

    environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    environment.globals["raise_exception"] = raise_exception
    try:
        return environment.from_string(template).render(
            messages=list(messages), add_generation_prompt=add_generation_prompt, **extra
        )
    except TemplateError as exc:
        raise InputError(f"the model's chat template refused the messages: {exc}") from exc


def chat_prompt(tokenizer: object, text: str, *, where: str = "--chat") -> str:
    """``text`` as one user message in the model's chat template, ready for the assistant's answer.

    Args:
        tokenizer: The model's tokenizer (its ``chat_template`` attribute is used).
        text: The user's message.
        where: The option that asked for it, for the error message.

    Raises:
        ConfigError: If the model has no chat template.
    """
    from specframe.errors import ConfigError

    template = getattr(tokenizer, "chat_template", None)
    if not template:
        raise ConfigError(
            f"{where}: the model has no chat template (chat_template.jinja or tokenizer_config.json's "
            "chat_template); give the prompt as plain text instead"
        )
    return render_chat(template, [{"role": "user", "content": text}])
