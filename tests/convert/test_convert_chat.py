"""The chat template survives conversion and renders as transformers renders it."""

from __future__ import annotations

import pytest
from convert_helpers import CHATML

from specframe.models.chat import read_chat_template, render_chat

CONVERSATIONS = [
    [{"role": "user", "content": "Hi!"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}],
    [
        {"role": "user", "content": "Write\n  two lines"},
        {"role": "assistant", "content": "one\ntwo"},
        {"role": "user", "content": "Thanks {{ not a tag }}"},
    ],
]


@pytest.mark.parametrize("name", ["llama", "qwen3"])
def test_converted_template_renders_as_transformers_renders_it(converted, name):
    from transformers import AutoTokenizer

    folder = converted(name).folder
    template = read_chat_template(folder)
    assert template == CHATML
    reference = AutoTokenizer.from_pretrained(folder)
    for messages in CONVERSATIONS:
        for generation in (True, False):
            expected = reference.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation)
            assert render_chat(template, messages, add_generation_prompt=generation) == expected
    first = render_chat(template, CONVERSATIONS[0])
    assert first == (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
