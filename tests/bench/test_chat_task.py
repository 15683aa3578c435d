"""Chat templates in use: ``generate --chat``, the ``chat`` bench task (its default template and grading)."""

from __future__ import annotations

import json

import pytest

from converted_models import CHATML, convert_tiny_llama, write_tiny_llama
from specframe.bench.tasks import Chat, get_task
from specframe.bench.tasks.base import Example
from specframe.cli import main
from specframe.models import load_model
from specframe.models.chat import render_chat


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory):
    """A tiny converted Llama whose tokenizer_config.json carries a ChatML template."""
    root = tmp_path_factory.mktemp("chat-model")
    return convert_tiny_llama(write_tiny_llama(root / "llama"), root / "model")


def chat_ids(model, text):
    return model.encode_prompt(render_chat(CHATML, [{"role": "user", "content": text}]))


def test_generate_chat_sends_the_prompt_through_the_template(chat_model, capsys):
    model = load_model(chat_model)
    assert main(["generate", "--model", str(chat_model), "--chat", "--json", "--max-new-tokens", "3", "Hi there"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["prompt_ids"] == chat_ids(model, "Hi there")
    assert printed["prompt_ids"] != model.encode_prompt("Hi there")


def test_generate_chat_without_a_template_is_a_one_line_error(tiny_nemotron_dir, capsys):
    assert load_model(tiny_nemotron_dir).tokenizer.chat_template is None
    # (a fixed width: under "auto" a first calibration announces itself on a line of its own)
    args = ["generate", "--model", str(tiny_nemotron_dir), "--chat", "--width", "2", "--max-new-tokens", "2", "Hello"]
    assert main(args) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--chat" in err and "chat template" in err
    assert main(["generate", "--model", str(tiny_nemotron_dir), "--chat", "--prompt-ids", "1,2"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--chat" in err


def bench(model_dir, out, *extra):
    return [
        "bench",
        "--model",
        str(model_dir),
        "--task",
        "chat",
        "--limit",
        "2",
        "--schedules",
        "ar",
        "--max-new-tokens",
        "3",
        "--resamples",
        "50",
        "--no-progress",
        "--out",
        str(out),
        *extra,
    ]


def test_the_chat_task_uses_the_chat_template_by_default(chat_model, tmp_path, capsys):
    model = load_model(chat_model)
    prompts = [example.prompt for example in get_task("chat").load()[:2]]
    assert main(bench(chat_model, tmp_path / "run")) == 0
    records = [json.loads(line) for line in (tmp_path / "run" / "records.jsonl").read_text().splitlines()]
    assert [r["prompt_tokens"] for r in records] == [len(chat_ids(model, p)) for p in prompts]
    # An explicit --prompt-template wins over the task's.
    assert main(bench(chat_model, tmp_path / "raw", "--prompt-template", "{prompt}")) == 0
    records = [json.loads(line) for line in (tmp_path / "raw" / "records.jsonl").read_text().splitlines()]
    assert [r["prompt_tokens"] for r in records] == [len(model.encode_prompt(p)) for p in prompts]
    capsys.readouterr()


def test_the_chat_task_on_a_model_without_a_template_is_a_one_line_error(tiny_nemotron_dir, tmp_path, capsys):
    assert main(bench(tiny_nemotron_dir, tmp_path / "run")) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--prompt-template chat" in err


@pytest.mark.parametrize(
    ("answer", "response", "graded"),
    [
        ("Paris", "The capital is Paris.", True),
        ("Paris", "the capital of france is paris", True),
        ("Paris", "A Parisian café.", False),
        ("Paris", "Lyon.", False),
        ("seven|7", "There are 7 days.", True),
        ("seven|7", "A week has Seven days.", True),
        ("seven|7", "There are 17 days.", False),
        ("100", "It boils at 100 °C.", True),
        ("100", "It boils at 1000 °C.", False),
        (None, "anything", None),
    ],
)
def test_chat_grading_looks_for_the_answer_as_a_word(answer, response, graded):
    example = Example(0, "x", "prompt", {"answer": answer})
    assert Chat().grade(example, response) is graded


def test_the_bundled_chat_rows_are_well_formed():
    task = get_task("chat")
    examples = task.load()
    assert len(examples) == 24 and len({e.id for e in examples}) == 24
    assert task.prompt_template == "chat"
    graded = [e for e in examples if e.reference["answer"]]
    assert graded and all(task.grade(e, f"Answer: {e.reference['answer'].split('|')[0]}.") for e in graded)
