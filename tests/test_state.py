"""DecodeState: windows, pending tokens and the stopping rules (EOS, stop sequences, length)."""

from __future__ import annotations

import pytest

from specframe.acceptance.greedy import GreedyAcceptance
from specframe.orders.ltr import LeftToRight
from specframe.state import DecodeContext, DecodeState, LayoutTraits

EOS = 99


def _state(max_new_tokens=10, width=4, stops=()):
    ctx = DecodeContext(
        width=width,
        order=LeftToRight(),
        rule=GreedyAcceptance(),
        traits=LayoutTraits(free_bonus=False, any_order=True),
        eos_token_ids=frozenset({EOS}),
        stop_sequences=tuple(tuple(s) for s in stops),
    )
    return DecodeState(prompt=(5, 6, 7), max_new_tokens=max_new_tokens, ctx=ctx)


def test_positions_window_and_pending():
    state = _state()
    assert state.start == 3 and state.end == 12
    assert state.pending == ((0, 5), (1, 6), (2, 7))
    assert state.window() == [3, 4, 5, 6]
    state.mark_cached([0, 1, 2])
    state.accept([(3, 10), (5, 12)])  # any order: 5 before 4
    assert state.pending == ((3, 10), (5, 12))
    assert state.leftmost_unresolved() == 4
    assert state.window() == [4, 6, 7]  # 5 is resolved and skipped; window spans 4..7
    assert state.window(after=[4]) == [6, 7, 8, 9]
    assert state.output_ids() == [10]


def test_eos_ends_output_and_drops_later_tokens():
    state = _state()
    state.accept([(3, 1), (4, EOS), (5, 2)])
    assert state.end == 4 and state.done
    assert state.output_ids() == [1, EOS]
    assert 5 not in state.tokens


def test_eos_accepted_late_prunes_later_positions_and_recomputes_what_saw_them():
    state = _state()
    state.accept([(7, 2)])
    state.mark_cached([0, 1, 2, 7])
    state.accept([(4, 3)])
    state.mark_cached([4])
    state.accept([(6, EOS)])
    assert state.end == 6 and 7 not in state.tokens
    # 4 was cached with 7 in its context: the decoder drops both rows and 4 is pending again
    assert state.stale_cached == {7, 4}
    assert state.pending == ((4, 3), (6, EOS))
    assert state.generation_order() == [0, 1, 2, 4, 6]
    assert not state.done
    state.accept([(3, 1), (5, 1)])
    assert state.done and state.output_ids() == [1, 3, 1, EOS]


def test_stop_sequence_is_recognised_only_when_all_its_tokens_are_accepted():
    state = _state(stops=[(7, 8)])
    state.accept([(4, 8)])  # second half first (any order)
    assert state.end == 12
    state.accept([(3, 7)])
    assert state.end == 4
    state.accept([(5, 7), (6, 8)])  # beyond the end: discarded
    assert state.done and state.output_ids() == [7, 8]


def test_earliest_ending_stop_sequence_wins():
    state = _state(stops=[(1, 2, 3), (2, 3)])
    state.accept([(3, 1), (4, 2), (5, 3)])
    assert state.end == 5  # both end at 5
    state = _state(stops=[(4, 4, 4), (9,)])
    state.accept([(3, 4), (4, 4), (5, 9), (6, 4)])
    assert state.end == 5


def test_length_limit_discards_tokens_past_the_end():
    state = _state(max_new_tokens=2)
    kept = state.accept([(3, 1), (4, 2), (5, 3)])
    assert kept == 2 and state.done and state.output_ids() == [1, 2]


def test_accepting_a_position_twice_is_a_schedule_bug():
    state = _state()
    state.accept([(3, 1)])
    with pytest.raises(RuntimeError, match="already resolved"):
        state.accept([(3, 2)])
