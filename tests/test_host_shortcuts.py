"""The greedy host path's shortcuts give what the general code gives.

Layout templates (a cached shape laid out once, filled with a call's tokens and positions) against fresh
layouts over many widths on both families, also after the template cache has evicted and rebuilt shapes; the
state's window shortcut (a range when nothing is resolved past the frontier) against the window's
definition under random any-order accepts, EOS pruning included; the one-pass confidence order against a
plain sort.
"""

from __future__ import annotations

import math
import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import specframe.masks.templates as templates
from decoding_helpers import NEMOTRON, SETDLM, eos_ids, tiny_model
from specframe import compose
from specframe.acceptance.greedy import GreedyAcceptance
from specframe.ledger import CacheLedger
from specframe.orders.base import by_score
from specframe.orders.ltr import LeftToRight
from specframe.state import DecodeContext, DecodeState, LayoutTraits

PROMPT = [3, 5, 7, 9, 11, 2]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("shortcuts")
    return {f: tiny_model(f, root / f, vocab=24, seed=11, dtype="float64") for f in (NEMOTRON, SETDLM)}


def _assert_same_call(templated, fresh):
    for name in ("input_ids", "position_ids", "attention", "output_rows", "verify_rows"):
        a, b = getattr(templated, name), getattr(fresh, name)
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b), name
    assert len(templated.draft_rows) == len(fresh.draft_rows)
    assert all(torch.equal(a, b) for a, b in zip(templated.draft_rows, fresh.draft_rows, strict=True))
    assert templated.commit_rows == fresh.commit_rows
    assert list(templated.commit_rows) == list(fresh.commit_rows)  # the same order too
    assert (templated.adapter_rows is None) == (fresh.adapter_rows is None)
    if fresh.adapter_rows is not None:
        assert torch.equal(templated.adapter_rows, fresh.adapter_rows)
    if fresh.row_slices is not None:
        assert templated.row_slices == fresh.row_slices


@pytest.mark.parametrize(("family", "order"), [(NEMOTRON, "ltr"), (SETDLM, "confidence"), (SETDLM, "ltr")])
@pytest.mark.parametrize("schedule", ["ar", "packed", "linear", "quadratic"])
def test_templates_equal_fresh_layouts_across_widths_and_evictions(models, monkeypatch, family, order, schedule):
    """Every templated call equals the family's fresh layout of its plan, while the cache evicts shapes.

    The cache keeps 3 shapes here, so shapes are dropped and laid out again many times over the widths;
    a template that kept a stale tensor, or shared a buffer between two calls, would differ from the
    fresh layout (the earlier calls of a request are compared again at its end).
    """
    monkeypatch.setattr(templates, "MAX_TEMPLATES", 3)
    model = models[family]
    seen = {"templated": 0, "rebuilt": 0}
    for width in (1, 2, 3, 5, 8) if schedule != "ar" else (None,):  # (ar takes no width)
        config = {"model": model, "schedule": schedule, "order": order, "max_new_tokens": 30, "seed": 0}
        decoder = compose(config if width is None else {**config, "width": width})
        builder = decoder.builder
        original = builder.physical
        made = []

        ever: set = set()  # every shape this builder laid out

        def checked_physical(plan, _original=original, _builder=builder, _made=made, _ever=ever):
            cache = _builder.__dict__.get("_templates")
            known = set(cache.templates) if cache is not None else set()
            call = _original(plan)
            _assert_same_call(call, _builder.build(plan))
            seen["templated"] += call.checked
            added = set(_builder._templates.templates) - known
            seen["rebuilt"] += len(added & _ever)  # laid out before, evicted, laid out again
            _ever.update(added)
            _made.append((plan, call))
            return call

        builder.physical = checked_physical
        with eos_ids(model, ()):
            for seed in range(2):
                decoder.generate(prompt_ids=PROMPT, seed=seed)
                for plan, call in made:  # no later call changed an earlier one's tensors
                    _assert_same_call(call, builder.build(plan))
                made.clear()
        assert len(builder._templates.templates) <= 3
    assert seen["templated"] > 20
    if schedule != "ar":  # (AR calls have one shape per width)
        assert seen["rebuilt"] > 5, seen


def _context(width: int) -> DecodeContext:
    return DecodeContext(
        width=width,
        order=LeftToRight(),
        rule=GreedyAcceptance(),
        traits=LayoutTraits(free_bonus=False, any_order=True),
        eos_token_ids=frozenset({0}),
    )


def _reference_window(state: DecodeState, width: int) -> list[int]:
    """The window's definition: from the leftmost unresolved position, ``width`` positions, resolved ones skipped."""
    left = state.start
    while left <= state.end and state.is_resolved(left):
        left += 1
    return [p for p in range(left, min(state.end, left + width - 1) + 1) if not state.is_resolved(p)]


@settings(max_examples=200, deadline=None)
@given(
    width=st.integers(1, 6),
    length=st.integers(1, 14),
    steps=st.lists(st.tuples(st.integers(0, 5), st.integers(0, 3), st.booleans()), max_size=12),
)
def test_the_window_shortcut_equals_the_windows_definition(width, length, steps):
    """Out-of-order accepts, EOS tokens that prune later positions: the window stays the definition's."""
    state = DecodeState(prompt=(5, 6, 7), max_new_tokens=length, ctx=_context(width))
    ledger = CacheLedger(state)
    for skip, count, eos in steps:
        assert state.window() == _reference_window(state, width)
        open_positions = [p for p in range(state.start, state.end + 1) if not state.is_resolved(p)]
        chosen = open_positions[skip : skip + count]
        if not chosen:
            continue
        pairs = [(p, 1 + (p % 7)) for p in chosen]
        if eos:
            pairs[-1] = (pairs[-1][0], 0)
        ledger.accept(pairs)
    assert state.window() == _reference_window(state, width)


def test_by_score_equals_a_plain_sort():
    generator = random.Random(4)
    specials = [0.5, 0.25, -0.0, 0.0, math.nan, math.inf, -math.inf]
    for _ in range(500):
        positions = sorted(generator.sample(range(100, 130), generator.randint(0, 12)))
        scores = {p: generator.choice([*specials, generator.random()]) for p in positions if generator.random() < 0.8}
        finite = [p for p in positions if p in scores and math.isfinite(scores[p])]
        rest = [p for p in positions if p not in finite]
        for highest_first in (True, False):
            sign = -1.0 if highest_first else 1.0
            expected = sorted(finite, key=lambda p, s=sign: (s * scores[p], p)) + sorted(rest)
            assert by_score(positions, scores, highest_first=highest_first) == expected
