"""Graders: final-answer matching for the mathematics tasks and sandboxed execution for the code tasks."""

from specframe.bench.grading.answers import (
    gsm8k_prediction,
    gsm8k_reference,
    last_boxed,
    math_answers_match,
    normalize_math_answer,
    parse_number,
    same_number,
)
from specframe.bench.grading.code import assertion_program, completion_code, humaneval_program, passes
from specframe.bench.grading.sandbox import SandboxResult, run_program

__all__ = [
    "SandboxResult",
    "assertion_program",
    "completion_code",
    "gsm8k_prediction",
    "gsm8k_reference",
    "humaneval_program",
    "last_boxed",
    "math_answers_match",
    "normalize_math_answer",
    "parse_number",
    "passes",
    "run_program",
    "same_number",
]
