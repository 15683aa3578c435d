"""``smoke``: a dozen short code and text prompts shipped with specframe, for quick offline runs.

Code prompts with tests are graded like MBPP (the prompt plus the completion, then the assertions, in the
sandbox); the others are speed-only.
"""

from __future__ import annotations

from collections.abc import Mapping
from importlib import resources
from typing import Any

from specframe.bench.grading.code import assertion_program, completion_code, passes
from specframe.bench.tasks.base import Example, Task, as_list, require_text
from specframe.bench.tasks.files import read_rows


class Smoke(Task):
    """The bundled smoke prompts (``specframe/bench/data/smoke.jsonl``)."""

    name = "smoke"
    description = "a dozen short code/text prompts shipped with specframe (offline; code prompts graded)"
    max_new_tokens = 128
    offline_hint = "the smoke prompts ship inside specframe: reinstall the package if they are missing"

    def rows(self) -> list[Mapping[str, Any]]:
        """The bundled rows."""
        with resources.as_file(resources.files("specframe.bench").joinpath("data", "smoke.jsonl")) as path:
            return read_rows(path)

    def example(self, row: Mapping[str, Any], index: int) -> Example:
        """Prompt as given; reference = the assertions, if any."""
        tests = as_list(row.get("tests") or [])
        return Example(index, str(row.get("id", index)), require_text(row, self.name, "prompt"), {"tests": tests})

    def grade(self, example: Example, response: str) -> bool | None:
        """Prompt + completion followed by the assertions, in the sandbox; ``None`` for text prompts."""
        tests = example.reference.get("tests") or []
        if not tests:
            return None
        code, standalone = completion_code(response)
        return passes(assertion_program(code if standalone else example.prompt + code, tests))
