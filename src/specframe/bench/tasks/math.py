"""Mathematics tasks, zero-shot with a request for a boxed final answer: GSM8K and MATH-500."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from specframe.bench.grading.answers import (
    gsm8k_prediction,
    gsm8k_reference,
    last_boxed,
    math_answers_match,
    same_number,
)
from specframe.bench.tasks.base import Example, Task, require, require_text
from specframe.bench.tasks.hub import HubSource

BOXED_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."


def boxed_prompt(question: str) -> str:
    """The question followed by the request for a boxed final answer."""
    return f"{question.strip()}\n{BOXED_INSTRUCTION}\n"


class GSM8K(Task):
    """GSM8K test set (1,319 questions), scored by the normalised final number."""

    name = "gsm8k"
    description = "GSM8K test set (1,319), boxed-answer prompt, normalised final-number match"
    max_new_tokens = 1024
    hub = HubSource("openai/gsm8k", "main/test-00000-of-00001.parquet")
    offline_hint = (
        "Reading the Hub copy needs pyarrow; without Hub access pass --task-file with a JSONL of "
        "{'question': ..., 'answer': '... #### 42'} rows (the GSM8K test.jsonl format)"
    )

    def example(self, row: Mapping[str, Any], index: int) -> Example:
        """Prompt = question + boxed-answer request; reference = the number after ``####``."""
        answer = str(require(row, self.name, "answer"))
        reference = {"answer": answer}
        question = require_text(row, self.name, "question")
        return Example(index, str(row.get("id", index)), boxed_prompt(question), reference)

    def grade(self, example: Example, response: str) -> bool:
        """Exact match of the final numbers after normalisation (commas, units, ``$``, trailing zeros)."""
        return same_number(gsm8k_prediction(response), gsm8k_reference(example.reference["answer"]))


class MATH500(Task):
    """MATH-500 (the 500-problem subset of MATH), scored by boxed-answer exact match after normalisation."""

    name = "math500"
    description = "MATH-500, boxed-answer prompt, normalised exact match of the last \\boxed{}"
    max_new_tokens = 1024
    hub = HubSource("HuggingFaceH4/MATH-500", "test.jsonl")
    offline_hint = (
        "Without Hub access pass --task-file with a JSONL of {'problem': ..., 'answer': ...} rows "
        "(the HuggingFaceH4/MATH-500 test.jsonl format)"
    )

    def example(self, row: Mapping[str, Any], index: int) -> Example:
        """Prompt = problem + boxed-answer request; reference = the answer string."""
        reference = {"answer": str(require(row, self.name, "answer"))}
        ident = str(row.get("unique_id", index))
        return Example(index, ident, boxed_prompt(require_text(row, self.name, "problem")), reference)

    def grade(self, example: Example, response: str) -> bool:
        """The last boxed answer equals the reference after normalisation."""
        return math_answers_match(last_boxed(response), example.reference["answer"])
