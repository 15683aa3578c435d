import json

import pytest

from specframe.bench.tasks import TASKS, get_task
from specframe.bench.tasks.base import digest
from specframe.errors import ConfigError, SpecframeError


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_registry_and_unknown_task():
    assert set(TASKS) == {"smoke", "chat", "humaneval", "mbpp", "gsm8k", "math500", "writingbench"}
    with pytest.raises(ConfigError, match="choose one of"):
        get_task("nope")


def test_smoke_ships_a_dozen_prompts_with_some_graded():
    task = get_task("smoke")
    examples = task.load()
    assert len(examples) == 12 and [e.index for e in examples] == list(range(12))
    assert task.grade(examples[0], "    return a + b\n") is True
    assert task.grade(examples[0], "    return a * b\n") is False
    text = next(e for e in examples if not e.reference["tests"])
    assert task.grade(text, "anything") is None


def test_humaneval_loads_offline_from_the_package():
    task = get_task("humaneval")
    examples = task.load()
    assert len(examples) == 164 and examples[0].id == "HumanEval/0"
    assert examples[0].prompt.startswith("from typing import List")
    assert task.paper_repeats == 20 and task.max_new_tokens == 512


def test_gsm8k_from_a_local_jsonl(tmp_path):
    path = write_jsonl(
        tmp_path / "gsm8k.jsonl",
        [
            {"question": "Tom has 3 apples and buys 4 more. How many?", "answer": "3 + 4 = 7\n#### 7"},
            {"question": "What is 10 - 4?", "answer": "#### 6"},
        ],
    )
    task = get_task("gsm8k")
    examples = task.load(path)
    assert len(examples) == 2
    assert "\\boxed{}" in examples[0].prompt and examples[0].prompt.startswith("Tom has 3 apples")
    assert task.grade(examples[0], "3 + 4 = 7, so \\boxed{7}")
    assert not task.grade(examples[1], "\\boxed{5}")
    assert task.max_new_tokens == 1024


def test_math500_from_a_local_jsonl(tmp_path):
    path = write_jsonl(
        tmp_path / "math.jsonl",
        [
            {"problem": "Compute 1/2 + 1/4.", "answer": "\\frac34", "unique_id": "test/algebra/1.json"},
        ],
    )
    task = get_task("math500")
    (example,) = task.load(path)
    assert example.id == "test/algebra/1.json"
    assert task.grade(example, "We add: $\\boxed{\\dfrac{3}{4}}$")
    assert not task.grade(example, "The answer is 3/4")  # MATH-500 needs a boxed answer


def test_mbpp_from_a_local_jsonl(tmp_path):
    path = write_jsonl(
        tmp_path / "mbpp.jsonl",
        [
            {
                "task_id": 2,
                "prompt": "Write a function to find the shared elements from the given two lists.",
                "test_list": [
                    "assert set(similar_elements((3, 4, 5, 6),(5, 7, 4, 10))) == set((4, 5))",
                    "assert set(similar_elements((1, 2, 3, 4),(5, 4, 3, 7))) == set((3, 4))",
                ],
                "test_imports": [],
            }
        ],
    )
    task = get_task("mbpp")
    (example,) = task.load(path)
    assert "similar_elements((3, 4, 5, 6)" in example.prompt  # the original tests are visible
    assert example.reference["entry_point"] == "similar_elements"
    good = "def similar_elements(a, b):\n    return tuple(set(a) & set(b))\n```\n"
    assert task.grade(example, good)
    assert not task.grade(example, "def similar_elements(a, b):\n    return ()\n```")
    assert task.paper_repeats == 7


def test_writingbench_keeps_english_and_has_no_grader(tmp_path):
    path = write_jsonl(
        tmp_path / "wb.jsonl",
        [
            {"index": 1, "lang": "en", "query": "Write a cover letter."},
            {"index": 2, "lang": "zh", "query": "写一封信。"},
        ],
    )
    task = get_task("writingbench")
    (example,) = task.load(path)
    assert example.prompt == "Write a cover letter." and task.grade(example, "Dear ...") is None
    assert not task.graded


def test_missing_field_names_the_field(tmp_path):
    path = write_jsonl(tmp_path / "bad.jsonl", [{"question": "no answer"}])
    with pytest.raises(SpecframeError, match="'answer'"):
        get_task("gsm8k").load(path)


def test_bad_jsonl_line_and_missing_file(tmp_path):
    path = tmp_path / "broken.jsonl"
    path.write_text('{"question": "q", "answer": "#### 1"}\n{not json\n', encoding="utf-8")
    with pytest.raises(SpecframeError, match=r"line 2: not valid JSON \(Expecting property name[^)]*\)$"):
        get_task("gsm8k").load(path)
    csv = tmp_path / "problems.csv"
    csv.write_text("question,answer\nq,1\n", encoding="utf-8")
    with pytest.raises(SpecframeError, match=r"a task file is JSON Lines .* one named \*\.csv is read as JSON Lines"):
        get_task("gsm8k").load(csv)
    with pytest.raises(SpecframeError, match="does not exist"):
        get_task("gsm8k").load(tmp_path / "missing.jsonl")


@pytest.mark.parametrize("separator", ["\u2028", "\u2029", "\u0085"])
def test_a_jsonl_string_may_hold_characters_that_splitlines_would_split_at(tmp_path, separator):
    """JSON allows these raw inside a string (ensure_ascii=False writes them so); only "\\n" ends a record."""
    rows = [{"question": f"one{separator}two", "answer": "#### 1"}, {"question": "three", "answer": "#### 3"}]
    for name, newline in (("lf.jsonl", "\n"), ("crlf.jsonl", "\r\n")):
        path = tmp_path / name
        text = "".join(json.dumps(row, ensure_ascii=False) + newline for row in rows)
        assert separator in text  # written raw, not as an escape
        path.write_bytes(text.encode("utf-8"))
        examples = get_task("gsm8k").load(path)
        assert len(examples) == 2, name
        assert examples[0].prompt.startswith(f"one{separator}two") and examples[1].prompt.startswith("three")


def test_offline_hub_error_names_the_local_alternative(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    with pytest.raises(SpecframeError, match="--task-file"):
        get_task("math500").load()
    with pytest.raises(SpecframeError, match="--task-file"):
        get_task("writingbench").load()


def test_digest_changes_with_the_prompts(tmp_path):
    task = get_task("smoke")
    examples = task.load()
    assert digest(examples) == digest(task.load())
    assert digest(examples) != digest(examples[:-1])


def test_without_network_a_hub_task_fails_at_once_naming_the_cause(tmp_path, monkeypatch, no_network):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    with pytest.raises(SpecframeError) as info:
        get_task("mbpp").load()
    message = str(info.value)
    assert "not in the Hugging Face cache, and the Hub at 127.0.0.1 cannot be reached" in message
    assert "--task-file" in message
    assert no_network == [True]  # the cache only: no request that huggingface_hub would retry for 30 s


def test_without_network_a_cached_hub_task_loads(tmp_path, monkeypatch, no_network):
    task = get_task("mbpp")
    repo = tmp_path / "cache" / f"datasets--{task.hub.repo_id.replace('/', '--')}"
    (repo / "snapshots" / task.hub.revision).mkdir(parents=True)
    row = {"task_id": 2, "prompt": "Write add(a, b).", "test_list": ["assert add(1, 2) == 3"]}
    (repo / "snapshots" / task.hub.revision / task.hub.filename).write_text(json.dumps(row) + "\n")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    [example] = task.load()
    assert "Write add(a, b)." in example.prompt and no_network == [True]
