"""Turn a code task's response into a program and score it in the sandbox (HumanEval, MBPP, smoke).

A response is either a raw continuation of the prompt (base-model style) or contains a fenced code block
(chat style). :func:`completion_code` returns the code to run and whether it stands alone (a fenced block
that defines the entry point) or continues the prompt. Raw continuations are cut where the function body
clearly ends: at the first top-level line that starts a test, a ``__main__`` block, a print, a comment or
a closing fence. Helper functions after the target function are kept.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from specframe.bench.grading.sandbox import DEFAULT_TIMEOUT_S, run_program

_FENCE = re.compile(r"```[ \t]*(?:[A-Za-z0-9_+-]+)?[ \t]*\n(.*?)(?:```|$)", re.DOTALL)
_STOP_MARKERS = ("\nif __name__", "\nprint(", "\nassert ", "\n#", "\n```", '\n"""', "\n[DONE]")


def completion_code(response: str, entry_point: str | None = None) -> tuple[str, bool]:
    """The code in a response.

    Args:
        response: The generated text (special tokens already removed).
        entry_point: Function the task calls; a fenced block defining it is treated as a full solution.

    Returns:
        ``(code, standalone)``: ``standalone`` is true when the code should replace the prompt rather than
        continue it.
    """
    stripped = response.lstrip("\n")
    fenced = _FENCE.search(response) if "```" in response else None
    if fenced is not None and (entry_point is None or re.search(rf"def\s+{re.escape(entry_point)}\b", fenced[1])):
        return fenced.group(1), True
    cut = len(stripped)
    for marker in _STOP_MARKERS:
        where = stripped.find(marker)
        if where >= 0:
            cut = min(cut, where)
    return stripped[:cut], False


def humaneval_program(prompt: str, response: str, test: str, entry_point: str) -> str:
    """The program that checks a HumanEval response: solution, the task's ``check`` and a call to it."""
    code, standalone = completion_code(response, entry_point)
    solution = code if standalone else prompt + code
    return f"{solution}\n\n{test}\n\ncheck({entry_point})\n"


def assertion_program(solution: str, tests: Sequence[str], imports: Sequence[str] = ()) -> str:
    """A program running ``solution`` and then each assertion of ``tests`` (MBPP style)."""
    header = "\n".join(imports)
    return f"{header}\n{solution}\n\n" + "\n".join(tests) + "\n"


def passes(program: str, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> bool:
    """Whether ``program`` exits cleanly in the sandbox within ``timeout_s``."""
    return run_program(program, timeout_s=timeout_s).passed
