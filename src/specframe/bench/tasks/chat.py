"""``chat``: two dozen everyday chat requests, sent through the model's chat template.

Written for specframe and held out from the prompts a drafter is trained on (``specframe train-drafter``, of
the specframe-training plugin, uses its ``specframe_training.prompts``, which shares no template with these).
A few have a short factual answer, graded by whether the response contains it; the rest are speed-only.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from importlib import resources
from typing import Any

from specframe.bench.tasks.base import Example, Task, require_text
from specframe.bench.tasks.files import read_rows


class Chat(Task):
    """The bundled chat requests (``specframe/bench/data/chat.jsonl``)."""

    name = "chat"
    description = "two dozen chat requests shipped with specframe, in the model's chat template (offline)"
    max_new_tokens = 128
    offline_hint = "the chat prompts ship inside specframe: reinstall the package if they are missing"
    prompt_template = "chat"

    def rows(self) -> list[Mapping[str, Any]]:
        """The bundled rows."""
        with resources.as_file(resources.files("specframe.bench").joinpath("data", "chat.jsonl")) as path:
            return read_rows(path)

    def example(self, row: Mapping[str, Any], index: int) -> Example:
        """The request as given; reference = the expected answer (alternatives separated by ``|``), if any."""
        answer = row.get("answer")
        return Example(index, str(row.get("id", index)), require_text(row, self.name, "prompt"), {"answer": answer})

    def grade(self, example: Example, response: str) -> bool | None:
        """Whether the response contains the answer as a word (case-insensitive); ``None`` without one."""
        answer = example.reference.get("answer")
        if not answer:
            return None
        words = "|".join(re.escape(part) for part in str(answer).split("|"))
        return re.search(rf"\b(?:{words})\b", response, flags=re.IGNORECASE) is not None
