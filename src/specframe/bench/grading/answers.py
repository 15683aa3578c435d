r"""Final-answer extraction and normalisation for the mathematics tasks (GSM8K, MATH-500).

* :func:`last_boxed` returns the content of the last ``\boxed{...}`` (or ``\fbox{...}``), nested braces
  included;
* :func:`gsm8k_prediction` picks a GSM8K response's final number (boxed answer first, then ``####`` or
  "the answer is", then the last number in the text) and :func:`same_number` compares it with the reference;
* :func:`normalize_math_answer` canonicalises a LaTeX answer (fractions, spacing, units, degrees, dollar
  signs, ``x =`` prefixes, ...) so that MATH-500 can be scored by exact match of normalised strings.
"""

from __future__ import annotations

import re
from fractions import Fraction

_BOX_COMMANDS = ("\\boxed", "\\fbox")
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?|-?\.\d+")


def last_boxed(text: str) -> str | None:
    r"""The content of the last ``\boxed{...}`` / ``\fbox{...}`` in ``text``, or ``None``.

    Braces nest: ``\boxed{\frac{1}{2}}`` gives ``\frac{1}{2}``. The brace-less form ``\boxed 5`` gives
    ``5``. An unclosed box gives ``None``.
    """
    start = max(text.rfind(command) for command in _BOX_COMMANDS)
    if start < 0:
        return None
    command = next(c for c in _BOX_COMMANDS if text.startswith(c, start))
    rest = text[start + len(command) :]
    if rest.startswith(" ") or not rest.startswith("{"):
        token = rest.strip().split("$")[0].split()
        return token[0] if token else None
    depth = 0
    for position, char in enumerate(rest):
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return rest[1:position]
    return None


def parse_number(text: str) -> Fraction | None:
    r"""A number written in ``text`` (commas, ``$``, ``%``, units and a trailing period allowed), or ``None``.

    Examples: ``"1,234"`` -> 1234, ``"$5.50"`` -> 11/2, ``"\frac{3}{4}"`` -> 3/4, ``"12 apples"`` -> 12.
    """
    cleaned = text.strip().replace("\\!", "").replace("\\,", "").replace("\\$", "").replace("$", "")
    cleaned = re.sub(r"\\(?:text|mathrm|textbf|mbox)\{[^{}]*\}", "", cleaned).replace("\\%", "").replace("%", "")
    fraction = re.fullmatch(r"\s*(-?)\\[dt]?frac\{(-?\d+)\}\{(-?\d+)\}\s*", cleaned)
    if fraction:
        sign, numerator, denominator = fraction.groups()
        if int(denominator) == 0:
            return None
        value = Fraction(int(numerator), int(denominator))
        return -value if sign else value
    match = _NUMBER.search(cleaned)
    if match is None:
        return None
    digits = match.group(0).replace(",", "")
    try:
        return Fraction(digits)
    except (ValueError, ZeroDivisionError):
        return None


def gsm8k_reference(answer: str) -> Fraction | None:
    """The reference number of a GSM8K ``answer`` field (the text after ``####``)."""
    tail = answer.split("####")[-1]
    return parse_number(tail)


def gsm8k_prediction(text: str) -> Fraction | None:
    """The final number of a GSM8K response.

    In order: the last boxed answer; the text after the last ``####``; after the last "answer is"; the last
    number anywhere in the response.
    """
    boxed = last_boxed(text)
    if boxed is not None:
        value = parse_number(boxed)
        if value is not None:
            return value
    for marker in ("####", "answer is"):
        lowered = text.lower()
        where = lowered.rfind(marker)
        if where >= 0:
            value = parse_number(text[where + len(marker) :].lstrip(": "))
            if value is not None:
                return value
    numbers = _NUMBER.findall(text)
    return parse_number(numbers[-1]) if numbers else None


def same_number(prediction: Fraction | None, reference: Fraction | None) -> bool:
    """Whether two parsed numbers are present and equal."""
    return prediction is not None and reference is not None and prediction == reference


# --- MATH-500 -------------------------------------------------------------------------------------------
_REMOVALS = ("\\left", "\\right", "\\!", "\\displaystyle", "^{\\circ}", "^\\circ", "°", "\\$", "$", "\\%", "%")


def normalize_math_answer(answer: str) -> str:
    r"""Canonical form of a LaTeX final answer for exact-match scoring.

    Removes spacing commands, ``\left``/``\right``, degrees, dollar and percent signs, trailing units
    (``\text{ cm}``) and a short ``x =`` prefix; unwraps ``\text{...}``; writes ``\dfrac``/``\tfrac`` as
    ``\frac``; braces bare arguments (``\frac12`` -> ``\frac{1}{2}``, ``\sqrt3`` -> ``\sqrt{3}``); turns
    ``a/b`` of integers and ``0.5`` into fractions; adds a leading zero to ``.5``; drops all spaces.
    """
    text = answer.strip().replace("\n", "").rstrip(".")
    text = text.replace("\\\\", "\\").replace("tfrac", "frac").replace("dfrac", "frac")
    for pattern in _REMOVALS:
        text = text.replace(pattern, "")
    text = re.sub(r"\\[,;: ]", " ", text)
    units = text.find("\\text{ ")
    if units > 0:
        text = text[:units]
    text = re.sub(r"\\(?:text|textbf|mathrm|mbox)\{([^{}]*)\}", r"\1", text)
    if "=" in text:
        left, _, right = text.partition("=")
        if len(left.strip()) <= 2:
            text = right
    text = text.replace(" ", "")
    text = re.sub(r"(^|[^\d])\.(\d)", r"\g<1>0.\2", text)
    text = _brace_arguments(text)
    if text == "0.5":
        text = "\\frac{1}{2}"
    ratio = re.fullmatch(r"(-?\d+)/(\d+)", text)
    if ratio:
        text = f"\\frac{{{ratio.group(1)}}}{{{ratio.group(2)}}}"
    return text.rstrip(".")


def _brace_arguments(text: str) -> str:
    r"""``\sqrt3`` -> ``\sqrt{3}``, ``\frac12`` -> ``\frac{1}{2}``, ``\frac1{b}`` -> ``\frac{1}{b}``."""
    text = re.sub(r"\\sqrt([^{\\])", r"\\sqrt{\1}", text)
    out, position = [], 0
    while True:
        found = text.find("\\frac", position)
        if found < 0:
            out.append(text[position:])
            return "".join(out)
        out.append(text[position : found + 5])
        position = found + 5
        for _ in range(2):
            if position < len(text) and text[position] not in "{\\":
                out.append("{" + text[position] + "}")
                position += 1
            else:
                end = _group_end(text, position)
                out.append(text[position:end])
                position = end


def _group_end(text: str, start: int) -> int:
    """Index just past the braced group (or command) starting at ``start``."""
    if start >= len(text):
        return start
    if text[start] == "\\":
        match = re.match(r"\\[A-Za-z]+", text[start:])
        return start + (match.end() if match else 1)
    depth = 0
    for position in range(start, len(text)):
        if text[position] == "{":
            depth += 1
        elif text[position] == "}":
            depth -= 1
            if depth == 0:
                return position + 1
    return len(text)


def math_answers_match(prediction: str | None, reference: str) -> bool:
    """MATH-500 scoring: normalised exact match, or equal numbers when both sides parse as plain numbers."""
    if prediction is None:
        return False
    left, right = normalize_math_answer(prediction), normalize_math_answer(reference)
    if left == right:
        return True
    if re.fullmatch(r"-?[\d.,]+", left) and re.fullmatch(r"-?[\d.,]+", right):
        return same_number(parse_number(left), parse_number(right))
    return False
