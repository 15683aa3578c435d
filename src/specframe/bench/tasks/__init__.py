"""The benchmark tasks, by name.

``smoke``, ``chat``, ``humaneval``, ``mbpp``, ``gsm8k``, ``math500``, ``writingbench``.
"""

from __future__ import annotations

from specframe.bench.tasks.base import Example, Task, digest
from specframe.bench.tasks.chat import Chat
from specframe.bench.tasks.code import MBPP, HumanEval
from specframe.bench.tasks.files import read_rows
from specframe.bench.tasks.hub import HubSource, download_dataset_file
from specframe.bench.tasks.math import GSM8K, MATH500
from specframe.bench.tasks.smoke import Smoke
from specframe.bench.tasks.writing import WritingBench
from specframe.errors import ConfigError

TASKS: dict[str, type[Task]] = {
    task.name: task for task in (Smoke, Chat, HumanEval, MBPP, GSM8K, MATH500, WritingBench)
}


def get_task(name: str) -> Task:
    """The task registered under ``name``.

    Raises:
        ConfigError: For an unknown name (the message lists the known ones).
    """
    try:
        return TASKS[name]()
    except KeyError:
        raise ConfigError(f"unknown task {name!r}; choose one of: {', '.join(TASKS)}") from None


__all__ = [
    "Chat",
    "GSM8K",
    "MATH500",
    "MBPP",
    "TASKS",
    "Example",
    "HubSource",
    "HumanEval",
    "Smoke",
    "Task",
    "WritingBench",
    "digest",
    "download_dataset_file",
    "get_task",
    "read_rows",
]
