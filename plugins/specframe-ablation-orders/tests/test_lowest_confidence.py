from specframe_ablation_orders import LowestConfidenceFirst


def test_least_confident_first_then_unscored_in_textual_order():
    order = LowestConfidenceFirst().order([10, 11, 12, 13, 14], {11: 0.9, 12: 0.2, 14: 0.2, 13: float("nan")})
    assert order == [12, 14, 11, 10, 13]


def test_without_scores_the_order_is_left_to_right():
    assert LowestConfidenceFirst().order([3, 4, 5], {}) == [3, 4, 5]
