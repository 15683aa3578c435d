"""specframe serve through the real OpenAI client: every output equals offline decoding of the same request."""

from __future__ import annotations

import openai
import pytest
from serve_helpers import SERVED, chat_ids, expected_finish, expected_text, offline

PROMPTS = ["def fib(n):", "import os\n", "class Stack:\n    def push(self, item):"]


def _stats(response):
    return response.model_extra["specframe"]


@pytest.mark.parametrize(
    "fields,options",
    [
        ({"temperature": 0}, {}),  # the server's defaults: packed, width 4, ltr
        ({"temperature": 0, "extra_body": {"schedule": "ar"}}, {"schedule": "ar", "width": "auto"}),
        ({"temperature": 0, "extra_body": {"schedule": "linear", "width": 3}}, {"schedule": "linear", "width": 3}),
        (
            {"temperature": 0, "extra_body": {"schedule": "quadratic", "width": 2}},
            {"schedule": "quadratic", "width": 2},
        ),
        ({"temperature": 0, "extra_body": {"width": "auto"}}, {"width": "auto"}),
        (
            {"temperature": 0, "extra_body": {"schedule": {"name": "kbranch", "k": 2}}},
            {"schedule": {"name": "kbranch", "k": 2}},
        ),
        ({"temperature": 0.8, "top_p": 0.9, "seed": 7}, {"temperature": 0.8, "top_p": 0.9, "seed": 7}),
        ({"temperature": 1.0, "seed": 11, "extra_body": {"width": 3}}, {"temperature": 1.0, "seed": 11, "width": 3}),
    ],
    ids=["defaults", "ar", "linear-w3", "quadratic-w2", "auto", "kbranch", "sampling-top-p", "sampling-w3"],
)
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_completions_equal_offline_decoding(client, served_model, fields, options, stream):
    prompt = PROMPTS[0]
    request = {"model": SERVED, "prompt": prompt, "max_tokens": 20, **fields}
    expected = offline(served_model, served_model.encode_prompt(prompt), max_tokens=20, **options)
    if not stream:
        response = client.completions.create(**request)
        choice = response.choices[0]
        assert choice.text == expected_text(served_model, expected)
        assert choice.finish_reason == expected_finish(expected)
        assert _stats(response)["output_ids"] == expected.output_ids
        assert response.usage.completion_tokens == len(expected.output_ids)
        assert response.usage.prompt_tokens == len(expected.prompt_ids)
        assert _stats(response)["nfe"] >= 1 and _stats(response)["widths"]
        return
    chunks = list(client.completions.create(**request, stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    finals = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert text == expected_text(served_model, expected)
    assert len(finals) == 1 and finals[0].choices[0].finish_reason == expected_finish(expected)
    assert finals[0].model_extra["specframe"]["output_ids"] == expected.output_ids
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == len(expected.output_ids)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_stop_strings_end_the_text_before_them_as_openai_does(client, served_model, stream):
    prompt = PROMPTS[0]
    expected = offline(served_model, served_model.encode_prompt(prompt), stop=("string",), max_tokens=40)
    assert expected.stop_reason == "stop_sequence"  # the case under test happens
    request = {"model": SERVED, "prompt": prompt, "max_tokens": 40, "temperature": 0, "stop": "string"}
    if stream:
        chunks = list(client.completions.create(**request, stream=True))
        text = "".join(c.choices[0].text for c in chunks)
        reason = chunks[-1].choices[0].finish_reason
    else:
        choice = client.completions.create(**request).choices[0]
        text, reason = choice.text, choice.finish_reason
    assert text == expected_text(served_model, expected, ("string",)) and "string" not in text
    assert reason == "stop"


def test_token_id_prompts_are_decoded_as_given(client, served_model):
    ids = served_model.encode_prompt(PROMPTS[1])
    response = client.completions.create(model=SERVED, prompt=ids, max_tokens=12, temperature=0)
    expected = offline(served_model, ids, max_tokens=12)
    assert response.choices[0].text == expected_text(served_model, expected)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_chat_renders_the_models_template_and_equals_offline(client, served_model, stream):
    messages = [{"role": "system", "content": "You write Python."}, {"role": "user", "content": "def add(a, b):"}]
    expected = offline(served_model, chat_ids(served_model, messages), max_tokens=16)
    request = {"model": SERVED, "messages": messages, "max_tokens": 16, "temperature": 0}
    if stream:
        chunks = list(client.chat.completions.create(**request, stream=True))
        assert chunks[0].choices[0].delta.role == "assistant"
        text = "".join(c.choices[0].delta.content or "" for c in chunks)
        reason = chunks[-1].choices[0].finish_reason
    else:
        response = client.chat.completions.create(**request)
        text, reason = response.choices[0].message.content, response.choices[0].finish_reason
        assert response.choices[0].message.role == "assistant"
        assert response.usage.prompt_tokens == len(expected.prompt_ids)
    assert text == expected_text(served_model, expected)
    assert reason == expected_finish(expected)


def test_chat_without_a_template_is_a_400_naming_it(client, served_model, monkeypatch):
    monkeypatch.setattr(served_model.tokenizer, "chat_template", None)
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=SERVED, messages=[{"role": "user", "content": "hi"}], max_tokens=4)
    error = caught.value.body
    assert "no chat template" in error["message"] and error["param"] == "messages"
    assert error["code"] == "chat_template_missing"


def test_models_lists_the_served_model(client):
    assert [m.id for m in client.models.list().data] == [SERVED]
    assert client.models.retrieve(SERVED).id == SERVED
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-4")


def test_another_models_name_is_a_404(client):
    with pytest.raises(openai.NotFoundError) as caught:
        client.completions.create(model="gpt-4", prompt="x", max_tokens=2)
    assert caught.value.body["code"] == "model_not_found" and SERVED in caught.value.body["message"]


def test_n_other_than_one_is_refused(client):
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model=SERVED, prompt="x", max_tokens=2, n=2)
    assert caught.value.body["param"] == "n"
