import pytest

from specframe.bench.report import format_report
from specframe.bench.settings import BenchSettings, Method
from specframe.bench.summary import complete_prompts, pair_baseline, summarize


def record(
    prompt,
    schedule,
    width,
    *,
    repeat=0,
    tokens=10,
    wall=1.0,
    model=0.8,
    nfe=5,
    correct=None,
    drafts=0,
    draft_tokens=0,
    accepted=0,
    reached=(),
    accepted_at=(),
):
    return {
        "prompt_index": prompt,
        "repeat": repeat,
        "schedule": schedule,
        "width": width,
        "correct": correct,
        "metrics": {
            "generated_tokens": tokens,
            "wall_s": wall,
            "model_s": model,
            "nfe": nfe,
            "rows_per_call_max": 3,
            "acceptance": {"num_drafts": drafts, "draft_tokens": draft_tokens, "accepted_tokens": accepted},
        },
        "acceptance_positions": {"reached": list(reached), "accepted": list(accepted_at)},
    }


LINEAR, PACKED = Method("linear", 4), Method("packed", 4)


def test_aggregates_are_ratios_of_totals():
    records = [
        record(0, "linear", 4, tokens=10, wall=1.0, model=0.9, nfe=10, correct=True),
        record(1, "linear", 4, tokens=30, wall=2.0, model=1.8, nfe=20, correct=False),
        record(
            0,
            "packed",
            4,
            tokens=10,
            wall=0.5,
            model=0.4,
            nfe=4,
            correct=True,
            drafts=4,
            draft_tokens=16,
            accepted=6,
            reached=(4, 3),
            accepted_at=(3, 2),
        ),
        record(
            1,
            "packed",
            4,
            tokens=30,
            wall=1.5,
            model=1.2,
            nfe=12,
            correct=True,
            drafts=12,
            draft_tokens=48,
            accepted=18,
            reached=(12, 8),
            accepted_at=(8, 4),
        ),
    ]
    s = summarize(records, [LINEAR, PACKED], baseline="linear", repeats=1, resamples=500)
    linear, packed = s["methods"]
    assert s["prompts"] == 2 and s["responses_per_method"] == 2
    assert linear["throughput_tok_s"] == pytest.approx(40 / 3.0)  # total tokens / total wall, not mean of rates
    assert packed["throughput_tok_s"] == pytest.approx(40 / 2.0)
    assert packed["mean_wall_s"] == pytest.approx(1.0) and packed["mean_nfe"] == pytest.approx(8)
    assert packed["tokens_per_nfe"] == pytest.approx(40 / 16)
    assert packed["time_per_nfe_ms"] == pytest.approx(1000 * 2.0 / 16)
    assert packed["non_model_share"] == pytest.approx(0.4 / 2.0)
    assert linear["accuracy"] == 50.0 and packed["accuracy"] == 100.0
    acc = packed["acceptance"]
    assert (acc["num_drafts"], acc["draft_tokens"], acc["accepted_tokens"]) == (16, 64, 24)
    assert acc["mean_acceptance_length"] == pytest.approx(1 + 24 / 16)
    assert acc["acceptance_rate"] == pytest.approx(24 / 64)
    assert acc["per_position_acceptance"] == pytest.approx([11 / 16, 6 / 11])
    (comparison,) = s["comparisons"]
    assert comparison["method"] == "packed/w4" and comparison["baseline"] == "linear/w4"
    assert comparison["throughput_ratio"]["estimate"] == pytest.approx((40 / 2.0) / (40 / 3.0))
    assert comparison["wall_diff_s"]["estimate"] == pytest.approx(1.0 - 1.5)
    assert comparison["tokens_per_nfe_ratio"]["estimate"] == pytest.approx((40 / 16) / (40 / 30))
    assert comparison["time_per_nfe_ratio"]["estimate"] == pytest.approx((2.0 / 16) / (3.0 / 30))
    assert comparison["accuracy_diff_points"]["estimate"] == pytest.approx(50.0)
    for key in ("throughput_ratio", "wall_diff_s"):
        entry = comparison[key]
        assert entry["low"] <= entry["estimate"] <= entry["high"]
    assert "packed/w4 vs linear/w4" in format_report(s)


def test_repeats_are_summed_within_a_prompt_and_incomplete_prompts_left_out():
    records = [
        record(p, m.schedule, 4, repeat=r, wall=1.0 + p) for p in range(3) for r in range(2) for m in (LINEAR, PACKED)
    ]
    records = [r for r in records if not (r["prompt_index"] == 2 and r["schedule"] == "packed" and r["repeat"] == 1)]
    assert complete_prompts(records, [LINEAR, PACKED], 2) == [0, 1]
    s = summarize(records, [LINEAR, PACKED], baseline="linear", repeats=2, resamples=200)
    assert s["prompts"] == 2 and s["incomplete_prompts"] == 1 and s["methods"][0]["responses"] == 4
    ratio = s["comparisons"][0]["throughput_ratio"]
    assert ratio["estimate"] == ratio["low"] == ratio["high"] == pytest.approx(1.0)
    assert s["comparisons"][0]["accuracy_diff_points"] is None  # nothing graded


def test_baseline_pairing_by_width():
    methods = [Method("ar"), Method("linear", 4), Method("linear", 8), Method("packed", 4), Method("packed", 8)]
    assert pair_baseline(Method("packed", 8), "linear", methods) == Method("linear", 8)
    assert pair_baseline(Method("ar"), "linear", methods) == Method("linear", 4)
    assert pair_baseline(Method("linear", 8), "linear", methods) is None
    assert pair_baseline(Method("packed", 4), "ar", methods) == Method("ar")
    assert pair_baseline(Method("packed", 4), "linear/w8", methods) == Method("linear", 8)


def test_settings_methods_and_baseline_defaults():
    settings = BenchSettings(task="smoke", schedules=["ar", "linear", "packed"], widths=[4, 8])
    assert [m.label for m in settings.methods()] == ["ar", "linear/w4", "linear/w8", "packed/w4", "packed/w8"]
    assert settings.baseline_method() == "linear"
    assert BenchSettings(task="smoke", schedules=["packed", "ar"], widths=[4]).baseline_method() == "ar"
    bad = BenchSettings(task="smoke", schedules=["packed"], widths=[4], baseline="linear")
    with pytest.raises(Exception, match="--baseline linear"):
        bad.validate()
    assert settings.seed_for(2, 3) == 2003 and settings.seed_for(0, 0) == 0


@pytest.mark.parametrize(
    ("graded", "expected"),
    [
        (0, "acc %: - (the task has no grader)"),
        (6, "acc %: graded responses that pass (6 of 12 per method graded, the rest speed-only)"),
        (12, "acc %: responses that pass the task's grader"),
    ],
)
def test_the_report_says_how_many_responses_acc_is_over(graded, expected):
    from specframe.bench.report import legend

    text = legend({"methods": [{"method": "ar", "responses": 12, "graded": graded}]})
    assert expected in text.splitlines() and "non-model: decoder time outside model calls" in text


def test_the_report_says_why_acc_is_zero_everywhere():
    from specframe.bench.report import legend

    def methods(*accuracies):
        return {
            "methods": [
                {"method": f"m{i}", "responses": 12, "graded": 6, "accuracy": a} for i, a in enumerate(accuracies)
            ]
        }

    assert "acc % is 0.0 for every method: no graded response passed" in legend(methods(0.0, 0.0))
    assert "tiny model" in legend(methods(0.0, 0.0))
    assert "acc % is 0.0" not in legend(methods(0.0, 50.0))  # a real difference needs no excuse
    assert "acc % is 0.0" not in legend({"methods": [{"method": "ar", "responses": 12, "graded": 0}]})


def test_greedy_responses_are_compared_with_the_baseline_and_a_divergence_is_flagged():
    def greedy(prompt, schedule, width, ids, exact=True):
        return {**record(prompt, schedule, width), "output_ids": ids, "exact": exact, "stochastic": False}

    records = [
        greedy(0, "linear", 4, [1, 2, 3]),
        greedy(1, "linear", 4, [4, 5]),
        greedy(0, "packed", 4, [1, 2, 3]),
        greedy(1, "packed", 4, [4, 6, 7], exact=None),  # a plugin that did not say, and differs at token 1
    ]
    summary = summarize(records, [LINEAR, PACKED], baseline="linear", repeats=1, resamples=50)
    packed = summary["methods"][1]
    assert packed["exact"] is None
    assert packed["same_as_baseline"] == {
        "baseline": "linear/w4",
        "same": 1,
        "of": 2,
        "first_divergence": {"prompt_index": 1, "repeat": 0, "token": 1},
    }
    assert summary["comparisons"][0]["flagged"] is True
    report = format_report(summary)
    assert "same as linear/w4" in report and "1/2" in report and "?" in report
    assert "first divergence: prompt 1, repeat 0, token 1" in report
    sampled = [{**r, "stochastic": True} for r in records]
    assert (
        summarize(sampled, [LINEAR, PACKED], baseline="linear", repeats=1, resamples=50)["methods"][1][
            "same_as_baseline"
        ]
        is None
    )
