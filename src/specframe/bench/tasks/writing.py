"""WritingBench: long-form writing queries, for generation speed only (no judge-based scoring)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from specframe.bench.tasks.base import Example, Task, require_text


class WritingBench(Task):
    """WritingBench's English queries (555 in the release the paper used); speed only, no grader."""

    name = "writingbench"
    description = "WritingBench English queries (speed only, no grader)"
    max_new_tokens = 512
    graded = False
    offline_hint = (
        "WritingBench is not published as a Hub dataset file; download benchmark_query/benchmark_all.jsonl from "
        "github.com/X-PLUG/WritingBench and pass it with --task-file (English rows are kept)"
    )

    def keep(self, row: Mapping[str, Any]) -> bool:
        """English rows only (rows without a language field are kept)."""
        lang = row.get("lang", row.get("language"))
        return lang is None or str(lang).lower() in ("en", "english")

    def example(self, row: Mapping[str, Any], index: int) -> Example:
        """Prompt = the complete query, not truncated."""
        return Example(index, str(row.get("index", index)), require_text(row, self.name, "query", "prompt"))
