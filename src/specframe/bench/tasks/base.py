"""What a benchmark task is: a fixed list of prompts, an output cap, and optionally a grader.

A :class:`Task` turns the rows of its data set (from the Hub, a local file, or a package) into
:class:`Example` s with the paper's zero-shot prompt, and scores a response with :meth:`Task.grade`
(``None`` when the task has no grader, e.g. WritingBench, which measures speed only).
"""

from __future__ import annotations

import hashlib
import json
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specframe.bench.tasks.files import read_rows
from specframe.bench.tasks.hub import HubSource, download_dataset_file
from specframe.errors import SpecframeError


@dataclass(frozen=True)
class Example:
    """One prompt of a task.

    Attributes:
        index: Position in the task's full prompt list (stable across runs, shards and ``--limit``).
        id: The data set's own id (e.g. ``HumanEval/0``), or the index as text.
        prompt: The prompt text given to the model.
        reference: What the grader needs (answer, tests, entry point...).
    """

    index: int
    id: str
    prompt: str
    reference: Mapping[str, Any] = field(default_factory=dict)


class Task(ABC):
    """A benchmark task.

    Attributes:
        name: Registry name (``humaneval``, ``gsm8k``, ...).
        description: One line for ``--help`` and reports.
        max_new_tokens: The paper's output cap (512 for code and writing, 1,024 for mathematics).
        paper_repeats: Responses per prompt at temperature > 0 in the paper (appendix E.4).
        hub: Where the data lives on the Hugging Face Hub, or ``None``.
        offline_hint: What to do when the data cannot be downloaded.
        graded: Whether :meth:`grade` can score responses.
        prompt_template: The ``--prompt-template`` the task implies when none is given (``"chat"``: the model's
            chat template), or ``None`` for raw prompts.
    """

    name: str = ""
    description: str = ""
    max_new_tokens: int = 512
    paper_repeats: int = 1
    hub: HubSource | None = None
    offline_hint: str = ""
    graded: bool = True
    prompt_template: str | None = None

    @abstractmethod
    def example(self, row: Mapping[str, Any], index: int) -> Example:
        """Build the example (prompt and reference) for one data-set row.

        Raises:
            SpecframeError: If the row lacks a field the task needs.
        """

    def grade(self, example: Example, response: str) -> bool | None:
        """Score a response (special tokens removed); ``None`` if the task has no grader."""
        return None

    def rows(self) -> list[Mapping[str, Any]]:
        """The task's rows from its default source (the Hub, or a package).

        Raises:
            SpecframeError: If the data is unavailable; the message names the offline alternative.
        """
        if self.hub is None:
            raise SpecframeError(f"task {self.name!r} has no default data source; {self.offline_hint}")
        path = download_dataset_file(self.hub, hint=self.offline_hint)
        return read_rows(path)

    def keep(self, row: Mapping[str, Any]) -> bool:
        """Whether a row belongs to the evaluated set (e.g. WritingBench keeps English prompts only)."""
        return True

    def load(self, task_file: str | Path | None = None) -> list[Example]:
        """All examples, from ``task_file`` (JSONL, JSON, ``.gz``, Parquet) or the default source.

        Raises:
            SpecframeError: If the data cannot be read or a row lacks a required field.
        """
        rows = read_rows(task_file) if task_file is not None else self.rows()
        kept = [row for row in rows if self.keep(row)]
        if not kept:
            raise SpecframeError(f"task {self.name!r}: no usable rows in {task_file or 'its data source'}")
        return [self.example(row, index) for index, row in enumerate(kept)]


def require(row: Mapping[str, Any], task: str, *names: str) -> Any:
    """The first of ``names`` present in ``row``.

    Raises:
        SpecframeError: Naming the missing fields and the fields the row has.
    """
    for name in names:
        if name in row and row[name] is not None:
            return row[name]
    wanted = " or ".join(repr(n) for n in names)
    raise SpecframeError(
        f"task {task!r}: a row has no {wanted} field (its fields: {', '.join(sorted(map(str, row)))}); "
        "check that --task-file matches --task"
    )


def require_text(row: Mapping[str, Any], task: str, *names: str) -> str:
    """The first of ``names`` present in ``row``, which must be text (a prompt is never coerced from a number).

    Raises:
        SpecframeError: As :func:`require`, or naming the field and its value when it is not a string.
    """
    value = require(row, task, *names)
    if not isinstance(value, str):
        name = next(n for n in names if n in row and row[n] is not None)
        raise SpecframeError(
            f"task {task!r}: a row's {name!r} is {type(value).__name__} {value!r:.60}, not text; check that "
            "--task-file matches --task"
        )
    return value


def as_list(value: Any) -> list[str]:
    """A list of strings from a list, a JSON-encoded list or a newline-separated string."""
    if isinstance(value, str):
        stripped = value.strip()
        if stripped.startswith("["):
            try:
                value = json.loads(stripped)
            except json.JSONDecodeError:
                return [line for line in value.splitlines() if line.strip()]
        else:
            return [line for line in value.splitlines() if line.strip()]
    if isinstance(value, Sequence):
        return [str(item) for item in value]
    return [str(value)]


def digest(examples: Sequence[Example]) -> str:
    """A short fingerprint of a prompt set (ids, prompts, references), to check that runs used the same data."""
    hasher = hashlib.sha256()
    for ex in examples:
        payload = json.dumps([ex.index, ex.id, ex.prompt, ex.reference], sort_keys=True, default=str)
        hasher.update(payload.encode("utf-8"))
    return hasher.hexdigest()[:16]
