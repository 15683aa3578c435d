"""Rows per call equal the paper's Table 2 (evaluated uncached rows, padding included).

Nemotron (block size B = W + 1): Linear-SS 2B over its two calls, Quadratic-SS B(B + 1), Packed-SS 2B.
SetDLM maxima at W = 8 / 16: Linear-SS 25 / 49 (over its two calls), Quadratic-SS 81 / 289, Packed-SS 25 / 49.
"""

from __future__ import annotations

import pytest

from decoding_helpers import NEMOTRON, SETDLM, eos_ids, generate, tiny_model

PROMPT = [3, 5, 7, 9, 11, 2]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("rows")
    return {f: tiny_model(f, root / f, vocab=24, seed=1, dtype="float32") for f in (NEMOTRON, SETDLM)}


def _rows(model, schedule, width, length=60):
    with eos_ids(model, ()):
        return generate(model, schedule, PROMPT, length, width=width).metrics.rows_per_call


def _iterations(rows):
    """Linear-SS rows summed over each draft + verify pair (after the prompt call)."""
    steady = rows[1:]
    return [steady[i] + steady[i + 1] for i in range(0, len(steady) - 1, 2)]


@pytest.mark.parametrize("width", [3, 7, 15])
def test_nemotron_rows_match_table_2(models, width):
    block = width + 1
    model = models[NEMOTRON]
    packed = _rows(model, "packed", width)
    assert max(packed[1:]) == 2 * block
    assert packed[1:-3] == [2 * block] * len(packed[1:-3])  # static shape until the window meets the end
    linear = _rows(model, "linear", width)
    assert set(linear[1:-2]) == {block} and max(_iterations(linear)) == 2 * block
    quadratic = _rows(model, "quadratic", width)
    assert max(quadratic[1:]) == block * (block + 1)


@pytest.mark.parametrize(("width", "linear", "quadratic", "packed"), [(8, 25, 81, 25), (16, 49, 289, 49)])
def test_setdlm_maxima_match_table_2(models, width, linear, quadratic, packed):
    model = models[SETDLM]
    assert max(_iterations(_rows(model, "linear", width))) == linear
    assert max(_rows(model, "quadratic", width)[1:]) == quadratic
    assert max(_rows(model, "packed", width)[1:]) == packed


def test_linear_two_calls_per_iteration_and_ar_one_row_per_call(models):
    rows = _rows(models[NEMOTRON], "ar", 4, length=10)
    assert rows[0] == len(PROMPT) and rows[1:] == [1] * 9
    rows = _rows(models[SETDLM], "ar", 4, length=10)
    assert rows[0] == len(PROMPT) + 1 and rows[1:] == [2] * 9  # the correction token + one verifier mask
