"""DecodeState and its CacheLedger: windows, pending tokens and the stopping rules (EOS, stop sequences, length)."""

from __future__ import annotations

import pytest

from specframe.acceptance.greedy import GreedyAcceptance
from specframe.ledger import CacheLedger
from specframe.orders.ltr import LeftToRight
from specframe.state import DecodeContext, DecodeState, LayoutTraits

EOS = 99


# Token ids -> text for the stop-text tests: 1 is "a", 2 is "\n", 3 is "\n\n", 4 is "b\n".
PIECES = {1: "a", 2: "\n", 3: "\n\n", 4: "b\n"}


def _decode(ids):
    return "".join(PIECES.get(t, "?") for t in ids)


def _ledger(max_new_tokens=10, width=4, stops=(), texts=()):
    ctx = DecodeContext(
        width=width,
        order=LeftToRight(),
        rule=GreedyAcceptance(),
        traits=LayoutTraits(free_bonus=False, any_order=True),
        eos_token_ids=frozenset({EOS}),
        stop_sequences=tuple(tuple(s) for s in stops),
        stop_texts=tuple(texts),
        decode=_decode if texts else None,
    )
    return CacheLedger(DecodeState(prompt=(5, 6, 7), max_new_tokens=max_new_tokens, ctx=ctx))


def test_positions_window_and_pending():
    ledger = _ledger()
    state = ledger.state
    assert state.start == 3 and state.end == 12
    assert state.pending == ((0, 5), (1, 6), (2, 7))
    assert state.window() == [3, 4, 5, 6]
    ledger.cached.update([0, 1, 2])
    ledger.accept([(3, 10), (5, 12)])  # any order: 5 before 4
    assert state.pending == ((3, 10), (5, 12))
    assert state.leftmost_unresolved() == 4
    assert state.window() == [4, 6, 7]  # 5 is resolved and skipped; window spans 4..7
    assert state.window(after=[4]) == [6, 7, 8, 9]
    assert state.output_ids() == [10]


def test_eos_ends_output_and_drops_later_tokens():
    ledger = _ledger()
    state = ledger.state
    ledger.accept([(3, 1), (4, EOS), (5, 2)])
    assert state.end == 4 and state.done
    assert state.output_ids() == [1, EOS]
    assert 5 not in state.tokens


def test_eos_accepted_late_prunes_later_positions_and_recomputes_what_saw_them():
    ledger = _ledger()
    state = ledger.state
    ledger.accept([(7, 2)])
    ledger.cached.update([0, 1, 2, 7])
    ledger.accept([(4, 3)])
    ledger.cached.update([4])
    ledger.accept([(6, EOS)])
    assert state.end == 6 and 7 not in state.tokens
    # 4 was cached with 7 in its context: the decoder drops both rows and 4 is pending again
    assert ledger.cached == {0, 1, 2} and ledger.cache is None  # (with a cache, their rows are dropped)
    assert state.pending == ((4, 3), (6, EOS))
    assert state.generation_order() == [0, 1, 2, 4, 6]
    assert not state.done
    ledger.accept([(3, 1), (5, 1)])
    assert state.done and state.output_ids() == [1, 3, 1, EOS]


def test_stop_sequence_is_recognised_only_when_all_its_tokens_are_accepted():
    ledger = _ledger(stops=[(7, 8)])
    state = ledger.state
    ledger.accept([(4, 8)])  # second half first (any order)
    assert state.end == 12
    ledger.accept([(3, 7)])
    assert state.end == 4
    ledger.accept([(5, 7), (6, 8)])  # beyond the end: discarded
    assert state.done and state.output_ids() == [7, 8]


def test_earliest_ending_stop_sequence_wins():
    ledger = _ledger(stops=[(1, 2, 3), (2, 3)])
    state = ledger.state
    ledger.accept([(3, 1), (4, 2), (5, 3)])
    assert state.end == 5  # both end at 5
    ledger = _ledger(stops=[(4, 4, 4), (9,)])
    state = ledger.state
    ledger.accept([(3, 4), (4, 4), (5, 9), (6, 4)])
    assert state.end == 5


@pytest.mark.parametrize(
    ("tokens", "kept"),
    [
        ([1, 3, 1, 1], [1, 3]),  # "\n\n" as one token
        ([1, 2, 2, 1], [1, 2, 2]),  # as two tokens: the tokenization of the stop text never appears
        ([4, 2, 1, 1], [4, 2]),  # completed by a token that also holds text before it
        ([2, 1, 1, 2], [2, 1, 1, 2]),  # a newline at the end only: no stop
    ],
)
def test_a_stop_text_ends_the_output_however_it_is_tokenized(tokens, kept):
    ledger = _ledger(texts=["\n\n"])
    state = ledger.state
    ledger.accept(list(enumerate(tokens, start=3)))
    assert state.output_ids() == kept
    assert state.end == (3 + len(kept) - 1 if len(kept) < len(tokens) else 12)


def test_a_stop_text_past_a_gap_ends_the_output_once_the_gap_is_filled():
    ledger = _ledger(texts=["\n\n"])
    state = ledger.state
    ledger.accept([(5, 2), (6, 2), (7, 1)])  # any order: "\n\n" at 5-6, but 3 and 4 are unresolved
    assert state.end == 12
    ledger.accept([(4, 1)])
    assert state.end == 12
    kept = ledger.accept([(3, 3)])  # "\n\n" already at 3: the end is there, the rest is dropped
    assert kept == 1 and state.done and state.output_ids() == [3]


def test_stop_texts_need_a_decode_function():
    with pytest.raises(ValueError, match="stop_texts need decode"):
        DecodeContext(
            width=1, order=LeftToRight(), rule=GreedyAcceptance(), traits=LayoutTraits(False, False), stop_texts=("x",)
        )


def test_length_limit_discards_tokens_past_the_end():
    ledger = _ledger(max_new_tokens=2)
    state = ledger.state
    kept = ledger.accept([(3, 1), (4, 2), (5, 3)])
    assert kept == 2 and state.done and state.output_ids() == [1, 2]


def test_accepting_a_position_twice_is_a_schedule_bug():
    ledger = _ledger()
    ledger.accept([(3, 1)])
    with pytest.raises(RuntimeError, match="already resolved"):
        ledger.accept([(3, 2)])
