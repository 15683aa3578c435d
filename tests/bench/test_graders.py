import os
from fractions import Fraction

import pytest

from specframe.bench.grading import (
    completion_code,
    gsm8k_prediction,
    gsm8k_reference,
    humaneval_program,
    last_boxed,
    math_answers_match,
    normalize_math_answer,
    parse_number,
    run_program,
)


# --- GSM8K ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("She pays 3 * 4 = 12 dollars.\n#### 12", Fraction(12)),
        ("So the total is \\boxed{1,234}.", Fraction(1234)),
        ("The answer is $5.50.", Fraction(11, 2)),
        ("First 3 apples, then 7 more, so 10 apples.", Fraction(10)),
        ("Therefore the answer is: 18", Fraction(18)),
        ("We get \\boxed{\\frac{3}{4}}", Fraction(3, 4)),
        ("Temperature drops to \\boxed{-5}", Fraction(-5)),
        ("no digits here", None),
    ],
)
def test_gsm8k_prediction(text, expected):
    assert gsm8k_prediction(text) == expected


def test_gsm8k_reference_and_normalisation():
    assert gsm8k_reference("Natalia sold 48/2 = <<48/2=24>>24 clips.\n#### 72") == 72
    assert gsm8k_reference("#### 1,000") == 1000
    assert parse_number("72.0") == parse_number("72") == 72
    assert parse_number("50%") == 50
    assert parse_number("\\$18.00") == 18
    assert parse_number("12 \\text{ apples}") == 12


# --- boxed answers --------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("so \\boxed{5}.", "5"),
        ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
        ("first \\boxed{1} then \\boxed{\\sqrt{\\frac{a}{b}} + {c}}", "\\sqrt{\\frac{a}{b}} + {c}"),
        ("\\fbox{x^{2}}", "x^{2}"),
        ("\\boxed 7$", "7"),
        ("\\boxed{unclosed {", None),
        ("nothing boxed", None),
    ],
)
def test_last_boxed_handles_nested_braces(text, expected):
    assert last_boxed(text) == expected


@pytest.mark.parametrize(
    ("prediction", "reference"),
    [
        ("\\dfrac{1}{2}", "\\frac12"),
        ("0.5", "\\frac{1}{2}"),
        ("1/2", "\\frac{1}{2}"),
        ("\\left( 3, \\frac{\\pi}{2} \\right)", "(3,\\frac{\\pi}{2})"),
        ("x = 5", "5"),
        ("10^\\circ", "10"),
        ("\\$42", "42"),
        ("5 \\text{ cm}", "5"),
        ("\\text{(C)}", "(C)"),
        ("\\sqrt3", "\\sqrt{3}"),
        (".5", "0.5"),
        ("1,000", "1000"),
        ("2.0", "2"),
    ],
)
def test_math_answers_match_after_normalisation(prediction, reference):
    assert math_answers_match(prediction, reference)


@pytest.mark.parametrize(("prediction", "reference"), [("3", "4"), ("\\frac{1}{3}", "\\frac{1}{2}"), (None, "1")])
def test_math_answers_differ(prediction, reference):
    assert not math_answers_match(prediction, reference)


def test_normalize_math_answer_is_idempotent():
    for answer in ("\\frac{\\sqrt{3}}{2}", "(1,2]", "x^2+1", "\\tfrac{3}{4}"):
        once = normalize_math_answer(answer)
        assert normalize_math_answer(once) == once


# --- code extraction and the sandbox --------------------------------------------------------------------
PROMPT = 'def add(a, b):\n    """Add."""\n'
TEST = "def check(candidate):\n    assert candidate(2, 3) == 5\n"


def test_completion_code_cuts_raw_continuations_and_reads_fences():
    code, standalone = completion_code("    return a + b\n\nprint(add(1, 2))\n")
    assert (code, standalone) == ("    return a + b\n", False)
    fenced = "Sure:\n```python\ndef add(a, b):\n    return a + b\n```\nDone."
    assert completion_code(fenced, "add") == ("def add(a, b):\n    return a + b\n", True)


def test_sandbox_passes_a_correct_completion():
    result = run_program(humaneval_program(PROMPT, "    return a + b\n", TEST, "add"))
    assert result.passed and result.status == "passed"


def test_sandbox_fails_a_wrong_completion():
    result = run_program(humaneval_program(PROMPT, "    return a - b\n", TEST, "add"))
    assert not result.passed and result.status == "failed"
    assert "AssertionError" in result.output


def test_sandbox_times_out_an_infinite_loop():
    result = run_program("while True:\n    pass\n", timeout_s=1.0)
    assert result.status == "timeout" and not result.passed


@pytest.mark.skipif(os.name != "posix", reason="CPU-time limits are POSIX rlimits")
def test_sandbox_counts_the_cpu_limit_as_a_timeout():
    # On a fast machine the CPU limit can fire before the wall clock; that is a timeout, not a failure.
    program = (
        "import resource\nresource.setrlimit(resource.RLIMIT_CPU, (1, resource.getrlimit(resource.RLIMIT_CPU)[1]))\n"
        "while True:\n    pass\n"
    )
    result = run_program(program, timeout_s=20.0)
    assert result.status == "timeout" and not result.passed
    assert result.returncode is not None and result.returncode < 0


def test_sandbox_is_a_separate_process():
    result = run_program(
        "import os, sys\nprint(os.getpid())\nsys.modules.clear()\nos.environ.clear()\n"
        f"raise SystemExit(0 if os.getpid() != {os.getpid()} else 3)\n"
    )
    assert result.passed
    assert result.pid != os.getpid() and int(result.output.split()[0]) != os.getpid()
    assert "PATH" in os.environ  # the program's changes stayed in its own process


def test_sandbox_limits_memory():
    result = run_program("x = bytearray(8 * 1024 ** 3)\n", timeout_s=10.0, memory_mb=256)
    assert not result.passed and "MemoryError" in result.output


def test_sandbox_runs_in_a_temporary_folder():
    result = run_program("import os\nopen('scratch.txt', 'w').write('x')\nprint(os.getcwd())\n")
    folder = result.output.strip()
    assert result.passed and "specframe-sandbox-" in folder and not os.path.exists(folder)
