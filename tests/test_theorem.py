"""Theorem 3.2 (pathwise dominance): under monotone drafts, Packed-SS never needs more calls than Linear-SS."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from oracles import MonotoneOracle
from specframe import compose

VOCAB = 7
PROMPT = [1, 2, 3]


def _nfe(model, schedule, width, length):
    decoder = compose({"model": model, "schedule": schedule, "width": width, "max_new_tokens": length})
    result = decoder.generate(prompt_ids=PROMPT)
    assert result.output_ids == model.continuation[:length]  # both are lossless
    return result.metrics.nfe


@st.composite
def monotone_cases(draw):
    width = draw(st.integers(1, 6))
    length = draw(st.integers(1, 24))
    size = length + width + 2
    continuation = draw(st.lists(st.integers(0, VOCAB - 2), min_size=size, max_size=size))
    thresholds = [draw(st.integers(0, k)) for k in range(1, size + 1)]
    return width, length, continuation, thresholds


@settings(max_examples=150, deadline=None)
@given(monotone_cases())
def test_packed_never_needs_more_forward_passes_than_linear(case):
    width, length, continuation, thresholds = case
    model = MonotoneOracle(len(PROMPT), continuation, thresholds, VOCAB)
    assert _nfe(model, "packed", width, length) <= _nfe(model, "linear", width, length)


def test_the_bound_is_tight_when_drafts_are_always_right():
    continuation = [i % (VOCAB - 1) for i in range(60)]
    model = MonotoneOracle(len(PROMPT), continuation, [0] * 60, VOCAB)
    width, length = 4, 40
    packed, linear = _nfe(model, "packed", width, length), _nfe(model, "linear", width, length)
    # Linear-SS adds W + 1 tokens per two calls; Packed-SS at most W per call, in one call.
    assert linear == 1 + 2 * -(-(length - 1) // (width + 1))
    assert packed < linear


def test_with_never_right_drafts_both_degrade_to_one_token_per_verification():
    continuation = [i % (VOCAB - 1) for i in range(40)]
    thresholds = list(range(1, 41))  # position k is only predictable once it is verified
    model = MonotoneOracle(len(PROMPT), continuation, thresholds, VOCAB)
    assert _nfe(model, "packed", 3, 12) == 12
    assert _nfe(model, "linear", 3, 12) == 1 + 2 * 11
