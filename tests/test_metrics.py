"""Pooling metrics: every statistic of merged metrics is a ratio of totals over the generations."""

from __future__ import annotations

import pytest

from specframe.metrics import Metrics
from specframe.state import Verification


def generation(nfe, tokens, rows, verifications, wall=1.0, model=0.5):
    return Metrics(
        nfe=nfe,
        generated_tokens=tokens,
        rows_per_call=rows,
        verifications=[Verification(*v) for v in verifications],
        wall_s=wall,
        model_s=model,
    )


def test_merge_pools_counts_as_ratios_of_totals():
    first = generation(3, 6, [40, 9, 9], [(0, 0, 1), (4, 3, 4), (4, 0, 1)])
    second = generation(2, 5, [30, 12], [(0, 0, 1), (2, 2, 3)], wall=2.0, model=1.5)
    pooled = Metrics.merge([first, second])
    assert (pooled.nfe, pooled.generated_tokens) == (5, 11)
    assert pooled.tokens_per_nfe == pytest.approx(11 / 5)
    assert pooled.num_drafts == 3 and pooled.draft_tokens == 10 and pooled.accepted_tokens == 5
    assert pooled.mean_acceptance_length == pytest.approx(1 + 5 / 3)  # not the mean of 2.5 and 3.0
    assert pooled.acceptance_rate == pytest.approx(5 / 10)
    assert pooled.tokens_per_verification == pytest.approx((4 + 1 + 3) / 3)
    assert pooled.per_position_acceptance() == pytest.approx([2 / 3, 2 / 3, 1 / 2, 0.0])
    assert pooled.non_model_s == pytest.approx(3.0 - 2.0)
    # each generation's prompt call (40 and 30 rows) is left out of the largest call
    assert pooled.rows_per_call_max == 12
    assert first.rows_per_call_max == 9 and Metrics.merge([first]).to_dict() == first.to_dict()


def test_merging_nothing_gives_empty_metrics():
    pooled = Metrics.merge([])
    assert pooled.nfe == 0 and pooled.tokens_per_nfe == 0.0 and pooled.mean_acceptance_length == 0.0
    assert pooled.rows_per_call_max == 0
