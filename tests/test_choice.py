"""Width / schedule "auto": the choice logic under fixed synthetic cost models, the statistics, the cost model.

Nothing here depends on how fast this machine is: every choice is made against an injected cost model, and
the calibration is checked for its structure and its cache on this machine, and for its numbers only against a
simulated clock.
"""

from __future__ import annotations

import json
import math
import random
import sys
import time
import warnings
from types import SimpleNamespace

import pytest
import torch

from decoding_helpers import FAMILIES, NEMOTRON, SETDLM, eos_ids, tiny_model
from specframe import compose, kernels
from specframe.auto import costs as costs_module
from specframe.auto import policy as auto_module
from specframe.auto.costs import CostModel, cost_model_for, fit, load_cached, model_key, save
from specframe.auto.rates import AR, Candidate, best, outcomes, stationary, throughput
from specframe.auto.schedule import AUTO_MAX_WIDTH, AutoSchedule
from specframe.auto.stats import AcceptanceStats, CallTimes, CallTokens, default_prior
from specframe.cli import main
from specframe.errors import ConfigError
from specframe.models import load_model

VOCAB = 24
PROMPTS = ([3, 5, 7], [9, 2], [1, 2, 11, 4, 6, 8])
ROWS_CHEAP = {"tau": 0.01, "delta": 0.0}  # a call costs the same whatever its rows: draft wide
ROWS_DEAR = {"tau": 0.0001, "delta": 0.01}  # every row costs 100 fixed costs: never draft


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("choice")
    return {family: tiny_model(family, root / family, vocab=VOCAB, seed=1) for family in FAMILIES}


def _run(model, schedule, cost, width="auto", length=40):
    decoder = compose({"model": model, "schedule": schedule, "width": width, "max_new_tokens": length, "cost": cost})
    histogram: dict[str, int] = {}
    widths: dict[int, int] = {}
    with eos_ids(model, ()):
        for prompt in PROMPTS:
            metrics = decoder.generate(prompt_ids=prompt).metrics
            for label, n in metrics.schedule_histogram().items():
                histogram[label] = histogram.get(label, 0) + n
            for w, n in metrics.width_histogram().items():
                widths[w] = widths.get(w, 0) + n
    return decoder, histogram, widths


# -- the rate model --------------------------------------------------------------------------------------


def _distribution(pairs):
    out: dict[int, float] = {}
    for tokens, p in pairs:
        out[tokens] = out.get(tokens, 0.0) + p
    return out


def test_outcomes_follow_the_chain_survival():
    q = [0.0, 0.9, 0.5, 0.5, 0.2]
    assert _distribution(outcomes((2, 3), q, num_verify=3)) == pytest.approx({1: 0.5, 2: 0.25, 3: 0.25})
    # every rank held an accepted draft and there is no bonus rank: the call adds only the drafts
    assert _distribution(outcomes((2, 3), q, num_verify=2)) == pytest.approx({1: 0.5, 2: 0.25 + 0.25})
    assert outcomes((), q, num_verify=1) == [(1, 1.0)]


def _q(value):
    return {"prefix": [value] * 20, "branch": [value] * 20}


def _rows(candidate, kappa):  # Nemotron-like sizes
    kind, width = candidate.kind, candidate.width
    return {"ar": 1, "packed": 2 * (width + 1), "quadratic": (width + 1) * (width + 2)}.get(kind, 2 * (width + 1))


def test_drafts_that_always_fail_make_ar_the_best_candidate():
    candidates = [Candidate("ar", 0), *(Candidate("packed", w) for w in range(2, 9))]
    chosen, rates = best(candidates, _q(0.0), CostModel(0.007, 0.0002).seconds, _rows, free_bonus=True)
    assert chosen == Candidate("ar", 0)
    assert rates["ar"] == pytest.approx(1 / (0.007 + 0.0002))


def test_certain_drafts_and_free_rows_make_the_widest_candidate_best():
    candidates = [Candidate("ar", 0), *(Candidate("packed", w) for w in (2, 4, 8, 16))]
    chosen, rates = best(candidates, _q(1.0), CostModel(0.01, 0.0).seconds, _rows, free_bonus=True)
    assert chosen == Candidate("packed", 16)
    # packed at W with certain drafts alternates a full leftover (W - 1 drafts + 1) and an empty chain (1)
    assert rates["packed/w16"] == pytest.approx((16 + 1) / 2 / 0.01)


def test_the_row_cost_moves_the_best_width():
    candidates = [Candidate("packed", w) for w in range(2, 17)]
    widths = []
    for delta in (0.0, 0.0005, 0.002):
        chosen, _ = best(candidates, _q(0.8), CostModel(0.01, delta).seconds, _rows, free_bonus=True)
        widths.append(chosen.width)
    assert widths[0] > widths[1] > widths[2]


def test_quadratic_and_linear_rates_count_their_calls():
    cost = CostModel(0.01, 0.0).seconds
    q = _q(0.5)
    quadratic = throughput(Candidate("quadratic", 2), q, cost, _rows, free_bonus=True)
    assert quadratic == pytest.approx((1 + 0.5 + 0.25) / 0.01)  # offsets 2, 3 fresh, plus a bonus
    linear = throughput(Candidate("linear", 2), q, cost, _rows, free_bonus=False)
    assert linear == pytest.approx((0.5 * 1 + 0.25 * 2 + 0.25 * 2) / 0.02)  # two calls, no bonus


def test_kbranch_with_certain_drafts_keeps_drafting_full_windows():
    cost = CostModel(0.01, 0.0).seconds
    kbranch = throughput(Candidate("kbranch", 4), _q(1.0), cost, _rows, free_bonus=True)
    assert kbranch == pytest.approx(5 / 0.01)  # every outcome is the longest: a fresh branch every call
    packed = throughput(Candidate("packed", 4), _q(1.0), cost, _rows, free_bonus=True)
    assert packed < kbranch


def test_stationary_distributions_are_fixed_points_and_split_chains_are_averaged():
    import random

    rng = random.Random(0)
    for size in (2, 5, 9, 17):
        matrix = [[rng.random() for _ in range(size)] for _ in range(size)]
        matrix = [[v / sum(row) for v in row] for row in matrix]
        pi = stationary(matrix)
        step = [sum(pi[i] * matrix[i][j] for i in range(size)) for j in range(size)]
        assert step == pytest.approx(pi, abs=1e-9) and sum(pi) == pytest.approx(1.0)
    # two recurrent classes: the average over many steps from the last state, which never leaves it
    assert stationary([[0.0, 1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 1.0]]) == pytest.approx([0.0, 0.0, 1.0])


# -- the statistics --------------------------------------------------------------------------------------


def test_stats_count_checked_tokens_decay_and_pool_across_requests():
    stats = AcceptanceStats(8, weight=1.0, decay=0.5)
    prior = stats.rates()["prefix"][2]
    stats.observe([("prefix", 2), ("prefix", 3), ("prefix", 4)], accepted=1)
    q = stats.rates()["prefix"]
    assert q[2] == pytest.approx((1 + prior) / 2)
    assert q[3] < stats.prior[3]  # rejected
    assert q[4] <= q[3]  # never checked (after a rejection), and never above a nearer offset
    stats.observe([("prefix", 2)], accepted=0)
    assert stats.rates()["prefix"][2] == pytest.approx((0.5 + prior) / (0.5 + 1 + 1))  # old counts halved
    branch_before = stats.rates()["branch"][2]
    assert branch_before == pytest.approx(stats.rates()["prefix"][2])  # no branch evidence: as good as prefix
    stats.start_request()  # pooled counts (never decayed): offset 2 checked twice, accepted once
    assert stats.prior[2] == pytest.approx((1 + default_prior(8)[2]) / (2 + 1))
    assert stats.rates()["prefix"][2] == pytest.approx(stats.prior[2])  # recent counts cleared


def test_a_request_on_plain_ar_calls_forgets_its_bad_run_as_the_calls_go_by():
    stats = AcceptanceStats(8)
    for _ in range(20):  # earlier requests: offset 2 accepted 3 times in 4
        stats.observe([("prefix", 2)], accepted=int(_ % 4 != 0))
    stats.start_request()
    prior = stats.rates()["prefix"][2]
    for _ in range(6):  # this request's first drafts all fail: it would turn to plain AR calls
        stats.observe([("prefix", 2)], accepted=0)
    bad = stats.rates()["prefix"][2]
    assert bad < 0.4 * prior
    for _ in range(16):  # a probe's wait of plain AR calls, each checking no draft
        stats.age()
    aged = stats.rates()["prefix"][2]
    assert bad < aged < prior  # back towards what the other requests found, not all the way
    checked = sum(stats.decay**age for age in range(16, 22))  # the six failures, decayed 16-21 steps
    assert aged == pytest.approx(stats.weight * prior / (checked + stats.weight))


def test_plain_ar_calls_age_the_policy_s_acceptance_evidence():
    policy = auto_module.WidthPolicy([AR, Candidate("packed", 2)], _rows, size=8, free_bonus=True)
    policy.stats.observe([("prefix", 2)], accepted=0)
    before = policy.stats.rates()["prefix"][2]
    policy.observe_verification([], accepted=0, added=1)  # a plain AR call
    assert policy.stats.rates()["prefix"][2] > before


def test_a_drafter_s_measured_acceptance_sets_where_a_request_starts():
    def first_pick(acceptance):
        candidates = [AR, Candidate("packed", 2), Candidate("packed", 4)]
        policy = auto_module.WidthPolicy(candidates, _rows, size=8, free_bonus=True, acceptance=acceptance)
        policy.bind(CostModel(1.0, 1 / 32, source="nominal"), deterministic=True)
        return policy.for_request().choose(0)

    assert first_pick([0.95] * 8).width == 4  # drafts that mostly hold: the widest pays
    assert first_pick([0.3, 0.1, 0.05]).width <= 2  # drafts that mostly fail: AR, or a trial of the narrowest
    assert first_pick(None) == first_pick(default_prior(8)[1:])  # the neutral guess, unless measured


def test_observed_call_times_replace_predictions_and_scale_the_unseen():
    times = CallTimes(decay=0.5, trust=1.0)
    assert times.correct("packed/w4", 0.01) == 0.01  # nothing seen: the prediction
    for _ in range(3):
        times.observe("packed/w4", 0.01, 0.02)  # twice as slow as predicted
    assert times.correct("packed/w4", 0.01) == pytest.approx(0.75 * 0.02 + 0.25 * 0.02)
    assert times.correct("quadratic/w2", 0.01) == pytest.approx(0.02)  # unseen: scaled by the seen ratio
    chosen, _ = best(
        [Candidate("packed", 4), Candidate("quadratic", 2)],
        _q(0.5),
        CostModel(0.01, 0.0).seconds,
        _rows,
        free_bonus=True,
        correct=lambda label, predicted: predicted * (10 if label == "quadratic/w2" else 1),
    )
    assert chosen == Candidate("packed", 4)  # quadratic/w2 predicted better, observed ten times slower


def test_call_times_take_a_burst_of_load_for_load_and_keep_each_candidates_bias():
    from specframe.auto.stats import DEAD_BAND

    times = CallTimes()
    for _ in range(40):  # packed/w4's layout costs 1.5x its prediction; ar's as predicted; w2's 1.1x
        times.observe("ar", 0.010, 0.010)
        times.observe("packed/w4", 0.010, 0.015)
        times.observe("packed/w2", 0.010, 0.011)
    quiet = times.correct("packed/w4", 0.010) / times.correct("ar", 0.010)
    assert quiet == pytest.approx(1.5 / DEAD_BAND, rel=0.02)  # only what lies beyond the dead band counts
    assert times.correct("packed/w2", 0.010) == pytest.approx(times.correct("ar", 0.010))  # within it: noise
    for _ in range(30):  # then the machine gets twice as busy while only packed/w4 runs
        times.observe("packed/w4", 0.010, 0.030)
    # One candidate's calls cannot tell load from bias: the bias was learned from its first calls and stays,
    # so the burst is load, which every estimate shares: ar, not run meanwhile, is expected slower too.
    assert times.load == pytest.approx(2.0, rel=0.05)
    assert times.correct("ar", 0.010) == pytest.approx(0.020, rel=0.05)
    assert times.correct("packed/w4", 0.010) / times.correct("ar", 0.010) == pytest.approx(quiet, rel=0.02)
    assert times.correct("quadratic/w2", 0.010) == pytest.approx(0.010 * times.load)  # unseen: the load
    load = times.load
    times.observe("ar", 0.010, 1.0)  # one call stalled 50x: a bounded step, not 50x
    assert times.load < 1.2 * load and times.correct("ar", 0.010) < 0.05


def test_a_farther_offset_never_checked_is_assumed_less_likely_until_a_request_checks_it():
    from specframe.auto.stats import FALLOFF

    stats = AcceptanceStats(8)
    q = stats.rates()["prefix"]
    assert q[3] == pytest.approx(FALLOFF * q[2]) and q[4] == pytest.approx(FALLOFF * q[3])
    for _ in range(30):  # offset 3 accepted as often as offset 2: the evidence, not the falloff, decides
        stats.observe([("prefix", 2), ("prefix", 3)], accepted=2)
    stats.start_request()
    prior = stats.rates()["prefix"]
    assert prior[3] > 0.9 and prior[3] > FALLOFF * prior[2]
    assert prior[4] == pytest.approx(min(default_prior(8)[4], FALLOFF * prior[3]))  # offset 4: never checked


def test_lower_bounds_are_wide_on_few_checks_and_narrow_on_many():
    stats = AcceptanceStats(8)
    mean, few = stats.rates()["prefix"], stats.lower_rates(1.0)["prefix"]
    assert stats.lower_rates(0.0) == stats.rates()
    assert all(low <= q for low, q in zip(few[1:], mean[1:], strict=True))
    assert all(few[d] <= few[d - 1] for d in range(3, 9))  # never rising beyond offset 2, like the estimates
    # the prior alone counts 3 observations: sqrt(q (1 - q) / 4), a quarter at q = 1/2
    assert mean[2] - few[2] == pytest.approx((mean[2] * (1 - mean[2]) / 4) ** 0.5)
    for i in range(300):  # offset 2 accepted every other time, for many verifications
        stats.observe([("prefix", 2)], accepted=i % 2)
    mean, many = stats.rates()["prefix"], stats.lower_rates(1.0)["prefix"]
    assert mean[2] == pytest.approx(0.5, abs=0.02)
    assert 0.0 < mean[2] - many[2] < 0.1  # decayed counts saturate near 1 / (1 - decay) = 33 observations
    assert mean[3] - many[3] == pytest.approx((mean[3] * (1 - mean[3]) / 4) ** 0.5)  # offset 3 unchecked: wide


def test_realized_tokens_scale_a_candidates_prediction():
    from specframe.auto.stats import TOKEN_CLIP

    tokens = CallTokens(prior_calls=32)
    assert tokens.factor("packed/w3") == 1.0
    for _ in range(100):  # predicted 1.5 tokens per call, added 1.35
        tokens.observe("packed/w3", 1.5, 1.35)
    assert tokens.count("packed/w3") == 100 and tokens.count("packed/w2") == 0
    # an unobserved width of the same schedule starts from the schedule's ratio, not from 1
    pooled = (135 + 32 * 1.5) / (150 + 32 * 1.5)
    assert tokens.factor("packed/w2") == pytest.approx(pooled)
    assert tokens.factor("packed/w3") == pytest.approx((135 + 32 * 1.5 * pooled) / (150 + 32 * 1.5))
    assert tokens.factor("kbranch/w3") == 1.0
    for _ in range(1000):
        tokens.observe("quadratic/w1", 1.5, 0.0)
    assert tokens.factor("quadratic/w1") == pytest.approx(1 / TOKEN_CLIP)
    candidates = [Candidate("ar", 0), Candidate("packed", 3)]
    cheap = CostModel(0.01, 0.0).seconds
    assert best(candidates, _q(0.6), cheap, _rows, free_bonus=True)[0] == Candidate("packed", 3)
    halved = best(candidates, _q(0.6), cheap, _rows, free_bonus=True, scale=lambda label, t: t / (1 + (label != "ar")))
    assert halved[0] == Candidate("ar", 0)  # its calls added half what the model predicted: AR wins
    full = throughput(candidates[1], _q(0.6), cheap, _rows, free_bonus=True)
    assert halved[1]["packed/w3"] == pytest.approx(0.5 * full)


# -- the schedule ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("family", FAMILIES)
def test_packed_auto_falls_back_to_ar_when_rows_are_dear_and_drafts_wide_when_free(models, family):
    _, dear, _ = _run(models[family], "packed", ROWS_DEAR)
    assert set(dear) <= {"ar", "packed/w2"} and dear["ar"] > 0.8 * sum(dear.values())  # probes aside
    _, cheap, widths = _run(models[family], "packed", ROWS_CHEAP)
    assert "ar" not in cheap
    assert max(widths) >= 8 and sum(n for w, n in widths.items() if w >= 8) > 0.5 * sum(widths.values())


@pytest.mark.parametrize("family", FAMILIES)
def test_schedule_auto_uses_several_schedules_and_a_fixed_width_limits_it(models, family):
    decoder, chosen, _ = _run(models[family], "auto", {"tau": 0.007, "delta": 0.0002, "host_s": 0.001})
    assert isinstance(decoder.schedule, AutoSchedule) and decoder.width == AUTO_MAX_WIDTH
    assert decoder.schedule.rates and max(decoder.schedule.rates.values()) > 0
    assert all(label == "ar" or label.split("/")[0] in ("packed", "kbranch", "quadratic") for label in chosen)
    _, fixed, widths = _run(models[family], "auto", ROWS_CHEAP, width=3)
    assert set(widths) <= {0, 3} and all(label == "ar" or label.endswith("/w3") for label in fixed)


def test_width_auto_describes_itself_and_other_schedules_keep_a_fixed_width(models):
    decoder = compose({"model": models[SETDLM], "schedule": "linear", "cost": ROWS_CHEAP})
    assert decoder.describe()["schedule"]["width"] == "auto"
    native = compose({"model": models[NEMOTRON], "schedule": "native"})  # native chooses no width: W = 8
    assert native.width == 8 and not isinstance(native.schedule, AutoSchedule)
    assert compose({"model": models[NEMOTRON], "schedule": "packed", "width": 5}).width == 5


def test_linear_auto_keeps_one_width_for_its_drafting_and_verification_calls(models):
    decoder = compose({"model": models[NEMOTRON], "schedule": "linear", "max_new_tokens": 30, "cost": ROWS_CHEAP})
    with eos_ids(models[NEMOTRON], ()):
        metrics = decoder.generate(prompt_ids=[3, 5, 7]).metrics
    widths = [w for _, w in metrics.choices[1:]]
    pairs = list(zip(widths[0::2], widths[1::2], strict=False))
    assert pairs and all(a == b for a, b in pairs)


def test_metrics_report_the_histograms(models):
    decoder = compose({"model": models[NEMOTRON], "max_new_tokens": 20, "cost": ROWS_CHEAP})
    result = decoder.generate(prompt_ids=[3, 5, 7]).to_dict()["metrics"]
    assert sum(result["widths"].values()) == sum(result["schedules"].values()) == result["nfe"]
    assert all(label.startswith("packed/w") or label == "ar" for label in result["schedules"])


# -- what the choice does with a planted acceptance pattern ---------------------------------------------


def _plant(monkeypatch, q_of, *, realized=False):
    """Make every acceptance estimate ``q_of()`` (at every offset), with every offset well observed.

    The planted rates are the truth: calls are credited with the tokens they predict (unless ``realized``),
    and their lower confidence bounds are the estimates.
    """

    def rates(self):
        value = q_of()
        return {"prefix": [value] * (self.size + 1), "branch": [value] * (self.size + 1)}

    monkeypatch.setattr(AcceptanceStats, "rates", rates)
    monkeypatch.setattr(AcceptanceStats, "lower_rates", lambda self, z, mean=None: rates(self))
    monkeypatch.setattr(AcceptanceStats, "checked", lambda self, source, offset: 100.0)
    if not realized:
        monkeypatch.setattr(CallTokens, "factor", lambda self, label: 1.0)


def _request_copies(monkeypatch):
    """The per-request copies of every ``AutoSchedule`` made from now on, in order (the templates plan nothing)."""
    made = []
    real = AutoSchedule.for_request

    def recorded(self):
        made.append(real(self))
        return made[-1]

    monkeypatch.setattr(AutoSchedule, "for_request", recorded)
    return made


def _ar_runs(labels):
    """Lengths of the runs of plain AR calls that end in a drafting call."""
    runs, length = [], 0
    for label in labels:
        if label == "ar":
            length += 1
        else:
            if length:
                runs.append(length)
            length = 0
    return runs


def _long_decoder(model, cost=None, schedule="packed"):
    return compose(
        {"model": model, "schedule": schedule, "width": "auto", "max_new_tokens": 250, "cost": cost or SYNTHETIC}
    )


SYNTHETIC = {"tau": 0.007, "delta": 0.0002, "host_s": 0.001}


def test_probes_back_off_while_drafts_keep_failing_and_the_wait_carries_over(models, monkeypatch):
    _plant(monkeypatch, lambda: 0.05)  # drafts (almost) never accepted: AR calls win every estimate
    decoder = _long_decoder(models[NEMOTRON])
    with eos_ids(models[NEMOTRON], ()):
        first = [label for label, _ in decoder.generate(prompt_ids=[3, 5, 7]).metrics.choices]
        second = [label for label, _ in decoder.generate(prompt_ids=[9, 2]).metrics.choices]
    assert set(first) == {"ar", "packed/w2"}  # probes use the narrowest width
    # PROBE_AFTER AR calls (the prompt call included) before the first probe, then twice as many each time
    assert _ar_runs(first) == [auto_module.PROBE_AFTER * 2**i - 1 for i in range(4)]
    assert first.count("packed/w2") == 4 * auto_module.PROBE_CALLS
    trailing = len(first) - 1 - max(i for i, label in enumerate(first) if label != "ar")
    # the next request waits as long, counting the AR calls the first one ended with (the probes' clock is
    # shared, so that many short requests still probe)
    assert trailing + _ar_runs(second)[0] == auto_module.PROBE_AFTER_MAX - 1


def test_a_probe_that_finds_good_drafts_switches_and_resets_the_wait(models, monkeypatch):
    decoder = _long_decoder(models[NEMOTRON])
    copies = _request_copies(monkeypatch)
    judged = []

    def q_of():  # drafts fail until the third probe is judged; from then on, they are always accepted
        if copies[-1].policy._judge_probe:
            judged.append(1)
        return 0.95 if len(judged) >= 3 else 0.05

    _plant(monkeypatch, q_of)
    with eos_ids(models[NEMOTRON], ()):
        labels = [label for label, _ in decoder.generate(prompt_ids=[3, 5, 7]).metrics.choices]
    runs = _ar_runs(labels)
    assert runs[:3] == [auto_module.PROBE_AFTER * 2**i - 1 for i in range(3)]
    switched = sum(runs[:3]) + 3 * auto_module.PROBE_CALLS
    assert "ar" not in labels[switched:]  # drafting from the successful probe on
    assert copies[-1].policy.learning.probe_after == auto_module.PROBE_AFTER


def _tie_acceptance(decoder, gain):
    """The planted acceptance at which the best drafting candidate's estimate is ``gain`` times AR's."""
    schedule = decoder.schedule.for_request()
    schedule._ctx = decoder.stepper(prompt_ids=[3]).state.ctx  # a request's settings: its rows can be counted
    free = decoder.builder.traits.free_bonus
    drafting = [c for c in schedule.candidates(decoder.width) if c.kind != "ar"]

    def ratio(q):
        rates = [throughput(c, _q(q), schedule.cost.seconds, schedule._row_count, free_bonus=free) for c in drafting]
        return max(rates) / throughput(
            Candidate("ar", 0), _q(q), schedule.cost.seconds, schedule._row_count, free_bonus=free
        )

    low, high = 0.0, 1.0
    for _ in range(40):
        middle = (low + high) / 2
        low, high = (middle, high) if ratio(middle) < gain else (low, middle)
    return (low + high) / 2


@pytest.mark.parametrize("margin", [None, 0.0])
def test_hysteresis_keeps_the_pick_between_near_equal_candidates(models, monkeypatch, margin):
    decoder = _long_decoder(models[NEMOTRON])
    with eos_ids(models[NEMOTRON], ()):
        decoder.generate(prompt_ids=[3, 5, 7], max_new_tokens=2)  # sets up the schedule's row counting
    # each re-estimate flips which is ahead, AR or the best drafting candidate, by 1% (within SWITCH_MARGIN)
    planted = [_tie_acceptance(decoder, 1.01), _tie_acceptance(decoder, 1 / 1.01)]
    estimates = []
    _plant(monkeypatch, lambda: planted[len(estimates) % 2])
    if margin is not None:
        monkeypatch.setattr(auto_module, "SWITCH_MARGIN", margin)
    estimate = auto_module.WidthPolicy._estimate

    def recorded(policy, context):
        evidence = policy.learning.verified - policy._estimated[0] >= auto_module.REFRESH_VERIFIED
        fresh = policy.chosen is None or policy._since_refresh >= auto_module.REFRESH_CALLS or evidence
        chosen = estimate(policy, context)
        if fresh:
            estimates.append(chosen.kind == "ar")
        return chosen

    monkeypatch.setattr(auto_module.WidthPolicy, "_estimate", recorded)
    with eos_ids(models[NEMOTRON], ()):
        decoder.generate(prompt_ids=[3, 5, 7])
    changes = sum(1 for a, b in zip(estimates, estimates[1:], strict=False) if a != b)
    assert len(estimates) >= 8
    if margin is None:
        assert changes <= 1  # the first pick is kept through every wobble
    else:
        assert changes >= len(estimates) // 3  # without the margin the pick follows the wobbles


def _labels(decoder, model, prompt=(3, 5, 7)):
    with eos_ids(model, ()):
        return [label for label, _ in decoder.generate(prompt_ids=list(prompt)).metrics.choices]


@pytest.mark.parametrize(("gain", "doubt", "drafts"), [(1.08, 0.0, True), (1.08, 0.2, False), (1.5, 0.05, True)])
def test_drafting_must_pay_at_the_lower_bound_of_the_acceptance(models, monkeypatch, gain, doubt, drafts):
    model = models[NEMOTRON]
    probe = _long_decoder(model)
    _labels(probe, model)  # sets up the schedule's row counting
    q = _tie_acceptance(probe, gain)  # the best drafting candidate's estimate is `gain` times AR's
    _plant(monkeypatch, lambda: q)
    low = max(q - doubt, 0.0)  # the lower confidence bound: `doubt` below the estimate
    bounds = lambda self, z, mean=None: {source: [low] * (self.size + 1) for source in ("prefix", "branch")}  # noqa: E731
    monkeypatch.setattr(AcceptanceStats, "lower_rates", bounds)
    labels = _labels(probe, model)  # a decoder that has verified drafts: there is evidence to doubt
    share = labels.count("ar") / len(labels)
    if drafts:  # a clear gain, or one that doubt does not undo
        assert share < 0.1
    else:  # AR calls throughout, probes aside: plain AR calls beat drafting's pessimistic rate
        assert share > 0.85 and labels[:15] == ["ar"] * 15


def test_a_candidate_whose_calls_add_fewer_tokens_than_predicted_loses_its_pick(models, monkeypatch):
    model = models[NEMOTRON]
    decoder = _long_decoder(model)
    _labels(decoder, model)
    q = _tie_acceptance(decoder, 1.15)  # predicted 15% ahead of AR calls ...
    real = CallTokens.observe

    def observe(self, label, predicted, realized):  # ... but every call adds 1.25x fewer tokens than predicted
        real(self, label, predicted, predicted / 1.25)

    _plant(monkeypatch, lambda: q, realized=True)
    monkeypatch.setattr(CallTokens, "observe", observe)
    decoder = _long_decoder(model)
    labels = _labels(decoder, model)
    tokens = decoder.schedule.learned.tokens
    drafted = [label for label in set(labels) if label != "ar"]
    assert drafted and tokens.count("ar") == 0
    assert all(tokens.factor(label) < 0.9 for label in drafted if tokens.count(label) > 20)
    assert labels[:10].count("ar") < 3  # drafting first, as predicted ...
    assert labels[-60:].count("ar") > 50  # ... AR calls once the realized tokens are counted


# -- what a plain AR call inside "auto" costs ------------------------------------------------------------


def _forward_log(model, decoder, prompt, length=60):
    """Each forward of one request: (label, ids, positions, attention, output rows, adapter rows, cached)."""
    log = []
    forward = model.forward

    def logged(cache, call):
        adapter = None if call.adapter_rows is None else call.adapter_rows.clone()
        entry = (call.input_ids.clone(), call.position_ids.clone(), call.attention.clone(), call.output_rows.clone())
        log.append((*entry, adapter, cache.length))
        return forward(cache, call)

    model.forward = logged
    try:
        with eos_ids(model, ()):
            result = decoder.generate(prompt_ids=prompt, max_new_tokens=length)
    finally:
        del model.forward
    labels = [label for label, _ in result.metrics.choices]  # what planned each call, in call order
    return result.output_ids, list(zip(labels, log, strict=True))


@pytest.mark.parametrize("family", FAMILIES)
def test_a_plain_ar_call_inside_auto_is_the_ar_schedules_call(models, family):
    model = models[family]
    prompt = [3, 5, 7, 9]
    ar = compose({"model": model, "schedule": "ar", "max_new_tokens": 60})
    auto = compose({"model": model, "schedule": "packed", "width": "auto", "max_new_tokens": 60, "cost": ROWS_DEAR})
    expected, ar_log = _forward_log(model, ar, prompt)
    tokens, auto_log = _forward_log(model, auto, prompt)
    assert tokens == expected
    by_position = {int(entry[1][0]): entry for _, entry in ar_log[1:]}  # by the pending token's position
    # AR calls after AR calls (the first after a drafting call also checks the draft's first token) that
    # take a pending token (after a draft token accepted without a verifier token, there is none to take)
    plain = [
        entry
        for (before, _), (label, entry) in zip(auto_log[1:], auto_log[2:], strict=False)
        if label == before == "ar" and int(entry[0][0]) != model.mask_token_id
    ]
    assert len(plain) > 0.7 * len(auto_log)  # rows are dear: AR calls, probes aside
    for ids, positions, attention, output_rows, adapter, cached in plain:
        twin = by_position[int(positions[0])]
        assert torch.equal(ids, twin[0]) and torch.equal(positions, twin[1]) and torch.equal(attention, twin[2])
        assert torch.equal(output_rows, twin[3]) and cached == twin[5]  # same rows, same cache length
        assert (adapter is None) == (twin[4] is None) and (adapter is None or torch.equal(adapter, twin[4]))


def _python_calls(function):
    """``function`` wrapped to count the Python and builtin function calls each of its calls makes."""
    counts = []

    def counted(*args):
        events = [0]

        def profile(frame, event, arg):
            if event in ("call", "c_call"):
                events[0] += 1

        sys.setprofile(profile)
        try:
            return function(*args)
        finally:
            sys.setprofile(None)
            counts.append(events[0])

    return counted, counts


def test_a_run_of_plain_ar_calls_costs_the_host_little_more_than_the_ar_schedule(models, monkeypatch):
    # Host work counted in function calls, not timed: plan and update of a plain AR call inside "auto" make
    # a few calls more than the `ar` schedule's (the choice between two estimates is a lookup).
    model = models[NEMOTRON]
    counts = {}
    for name, config in (("ar", {"schedule": "ar"}), ("auto", {"schedule": "packed", "cost": ROWS_DEAR})):
        decoder = compose({"model": model, "max_new_tokens": 80, **config})
        kind = type(decoder.schedule)  # the class: every request plans with a copy of its own
        wrapped_plan, plans = _python_calls(kind.plan)
        wrapped_update, updates = _python_calls(kind.update)
        monkeypatch.setattr(kind, "plan", wrapped_plan)
        monkeypatch.setattr(kind, "update", wrapped_update)
        with eos_ids(model, ()):
            decoder.generate(prompt_ids=[3, 5, 7])
            labels = [label for label, _ in decoder.generate(prompt_ids=[9, 2, 4]).metrics.choices]
        counts[name] = (plans[-len(labels) :], updates[-len(labels) :], labels)
    ar_plan, ar_update = sorted(counts["ar"][0])[len(labels) // 2], sorted(counts["ar"][1])[len(labels) // 2]
    plans, updates, labels = counts["auto"]
    plain = [i for i, label in enumerate(labels) if label == "ar" and i > 1 and labels[i - 1] == "ar"]
    assert len(plain) > 0.7 * len(labels)
    assert sorted(plans[i] for i in plain)[len(plain) // 2] <= ar_plan + 12
    assert sorted(updates[i] for i in plain)[len(plain) // 2] <= ar_update + 6


def test_a_stable_pick_is_not_re_estimated_until_acceptance_or_the_context_moves(models, monkeypatch):
    _plant(monkeypatch, lambda: 0.05)  # drafts (almost) never accepted: AR calls win, probes fail
    estimates = []  # (verifications that checked a draft, cached context) at each estimate
    real_best = auto_module.best
    copies = _request_copies(monkeypatch)

    def counted(*args, **kwargs):
        estimates.append((copies[-1].policy.learning.verified, copies[-1].policy._estimated[3]))
        return real_best(*args, **kwargs)

    monkeypatch.setattr(auto_module, "best", counted)
    decoder = _long_decoder(models[NEMOTRON])
    with eos_ids(models[NEMOTRON], ()):
        labels = [label for label, _ in decoder.generate(prompt_ids=[3, 5, 7]).metrics.choices]
    probes = labels.count("packed/w2") // auto_module.PROBE_CALLS
    assert probes == 4 and len(labels) > 240
    # Once after each probe (its verifications moved the acceptance) ...
    assert len({learned for learned, _ in estimates}) >= 1 + probes
    # ... and, with nothing learned, only once the context has moved CONTEXT_STEP positions (not every
    # FULL_SCAN_CALLS calls, nor every REFRESH_CALLS)
    for (learned, context), (before, previous) in zip(estimates[1:], estimates, strict=False):
        assert learned != before or context - previous >= auto_module.CONTEXT_STEP
    assert len(estimates) <= 1 + probes + len(labels) // auto_module.CONTEXT_STEP


def test_the_decoder_times_every_steady_state_call_and_the_policy_reads_no_clock(models, monkeypatch):
    observed = []
    real = CallTimes.observe

    def recorded(self, label, predicted, seconds):
        observed.append((label, 1, predicted))
        return real(self, label, predicted, seconds)

    monkeypatch.setattr(CallTimes, "observe", recorded)
    measured = {**ROWS_DEAR, "source": "calibrated"}  # a measured model: calls are timed
    decoder = compose({"model": models[NEMOTRON], "schedule": "packed", "max_new_tokens": 120, "cost": measured})
    with eos_ids(models[NEMOTRON], ()):
        metrics = decoder.generate(prompt_ids=[3, 5, 7]).metrics
    assert len(observed) == metrics.nfe - 1  # every call but the prompt's, one by one
    labels = [label for label, _ in metrics.choices[1:]]
    assert [label for label, _, _ in observed] == labels and all(calls == 1 for _, calls, _ in observed)
    rows = metrics.rows_per_call[1:]  # each compared with the cost model's forward time at its own rows
    assert [p for _, _, p in observed] == pytest.approx([0.0001 + 0.01 * r for r in rows])
    import specframe.auto.policy as policy_module

    assert "time" not in vars(policy_module) and "perf_counter" not in open(policy_module.__file__).read()


def _policy(cost, widths=(2, 3, 4, 6, 8, 12, 16)):
    candidates = [AR, *(Candidate("packed", w, "packed") for w in widths)]
    policy = auto_module.WidthPolicy(candidates, _rows, size=17, free_bonus=True)
    policy.bind(CostModel.from_mapping(cost), deterministic=False)
    policy.start_request()
    return policy


def _drive(policy, accept, calls=300, context=100):
    """Synthetic calls: a packed call verifies its leftover (offsets 2..W), all accepted or none."""
    labels = []
    for _ in range(calls):
        candidate = policy.choose(context)
        labels.append(candidate.label)
        policy.observe_call(_rows(candidate, candidate.width), 0.01, context)
        chain = [("prefix", d) for d in range(2, candidate.width + 1)]
        accepted = len(chain) if accept else 0
        policy.observe_verification(chain, accepted, accepted + 1)
    return labels


def test_the_policy_alone_drafts_wide_when_drafts_hold_and_rows_are_cheap_and_backs_off_when_they_fail():
    wide = _drive(_policy(ROWS_CHEAP), accept=True)
    assert "ar" not in wide[50:] and wide[-1] in ("packed/w12", "packed/w16")
    failing = _drive(_policy({"tau": 0.001, "delta": 0.0002}), accept=False, calls=400)
    assert failing[60:].count("ar") > 0.95 * len(failing[60:])  # AR calls, with probes that back off
    probes = [i for i, label in enumerate(failing) if label != "ar" and i > 60]
    gaps = [b - a for a, b in zip(probes, probes[1:], strict=False) if b - a > 2]
    assert gaps == sorted(gaps) and max(gaps) >= auto_module.PROBE_AFTER_MAX - 2


def test_a_pick_made_on_earlier_requests_gives_way_after_a_few_failed_verifications_not_a_full_refresh():
    """A request's first pick rests on what earlier requests found (drafts held); when its own drafts fail,
    it is re-estimated after REFRESH_VERIFIED verifications, not only after REFRESH_CALLS calls."""
    template = _policy({"tau": 0.004, "delta": 0.0003})
    _drive(template.for_request(), accept=True, calls=60)  # drafts held: the pick is wide
    labels = _drive(template.for_request(), accept=False, calls=40)
    assert labels[0] != "ar"
    assert len(set(labels[: auto_module.REFRESH_VERIFIED + 3])) > 1
    assert labels.index("ar") < 2 * auto_module.REFRESH_CALLS  # a width down at each re-estimate, then AR


def test_requests_in_flight_together_learn_from_each_others_verifications():
    template = _policy({"tau": 0.004, "delta": 0.0003})
    first, second = template.for_request(), template.for_request()
    picked = first.choose(100)
    assert picked.kind != "ar" and second.choose(100).kind != "ar"
    for _ in range(3 * auto_module.REFRESH_VERIFIED):  # only the first request's drafts are checked: all fail
        first.observe_verification([("prefix", d) for d in range(2, picked.width + 1)], 0, 1)
    assert "ar" in [second.choose(100).label for _ in range(3)]  # its estimate reads what the first found
    assert second.stats.prior[2] < 0.2


def test_a_request_joining_a_batch_weighs_its_rows_from_its_first_choice():
    """A request that joins requests in flight shares their forwards from its first call: its first choices
    (and its probes, which must not run where no draft can pay) already see the batch's rows."""
    template = auto_module.WidthPolicy([AR, *(Candidate("packed", w, "packed") for w in (2, 4))], _rows, size=9,
                                       free_bonus=True)  # fmt: skip
    template.bind(CostModel(0.0001, 0.001, source="given"), deterministic=False)
    running = template.for_request()
    running.choose(100)
    running.observe_call(1, 0.01, 100, batch_rows=40)
    assert template.for_request().batch_rows == 39
    template.bind(CostModel(0.0001, 0.001, source="given"), deterministic=True)
    running = template.for_request()
    running.observe_call(1, 0.01, 100, batch_rows=40)
    assert template.for_request().batch_rows is None  # a deterministic choice reads no batch


def test_a_deterministic_policy_reads_no_timing_no_batch_and_forgets_between_requests():
    policy = _policy(ROWS_CHEAP)
    policy.bind(CostModel.from_mapping(ROWS_CHEAP), deterministic=True)
    first = _drive(policy, accept=True, calls=40)
    policy.observe_call(1, 5.0, 100, batch_rows=400)
    assert policy.times is None and policy.batch_rows is None
    policy.start_request()
    assert _drive(policy, accept=True, calls=40) == first  # nothing carried over


def test_a_shared_forward_moves_the_load_and_costs_rows_at_the_margin():
    cost = costs_module.CostModel(0.01, 0.001)
    assert cost.seconds(4) == pytest.approx(0.014)
    assert cost.seconds(4, batch_rows=0) == pytest.approx(0.014)  # alone
    assert cost.seconds(4, batch_rows=20) == pytest.approx(0.004)  # the forward of the other 20 is paid anyway
    candidates = [AR, *(Candidate("packed", w, "packed") for w in (2, 4, 8))]
    policy = auto_module.WidthPolicy(candidates, _rows, size=9, free_bonus=True)
    policy.bind(CostModel(0.01, 0.0005, source="calibrated"), deterministic=False)
    policy.start_request()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(AcceptanceStats, "rates", lambda self: _q(0.6))
        patch.setattr(AcceptanceStats, "lower_rates", lambda self, z, mean=None: _q(0.6))
        alone = policy.choose(100)
        assert alone.kind == "packed"  # a call's fixed cost dominates: drafting pays
        policy.observe_call(1, 0.0105, 100, batch_rows=200)  # then the request shares forwards of 200 rows
        assert policy.batch_rows == 199 and policy.times.count("ar") == 0  # the load, not a candidate's bias
        policy._since_refresh = auto_module.REFRESH_CALLS  # the next refresh: the batch moved, so it estimates
        assert policy.choose(100) == AR  # each row now costs delta, and AR calls add a token per row


def test_in_a_batch_where_no_draft_can_pay_the_policy_makes_no_probe_but_alone_it_does():
    """Alone, AR calls are interrupted by probes of drafting (to notice drafts starting to hold); sharing a
    forward where each row costs delta, a draft of W tokens costs 2(W + 1) rows: no probe can pay."""
    candidates = [AR, *(Candidate("packed", w, "packed") for w in (2, 4, 8))]

    def drive(batch_rows):
        policy = auto_module.WidthPolicy(candidates, _rows, size=9, free_bonus=True)
        policy.bind(CostModel(0.0001, 0.001, source="given"), deterministic=False)
        policy.start_request()
        labels = []
        for _ in range(300):
            candidate = policy.choose(100)
            labels.append(candidate.label)
            policy.observe_call(_rows(candidate, candidate.width), 0.01, 100, batch_rows)
            policy.observe_verification([("prefix", d) for d in range(2, candidate.width + 1)], 0, 1)
        return labels

    assert any(label != "ar" for label in drive(None)[40:])  # alone: probes
    assert all(label == "ar" for label in drive(200)[40:])  # in a batch of 200 rows: none


# -- the cost model --------------------------------------------------------------------------------------


def test_cost_model_interpolates_its_table_and_extrapolates_with_delta():
    cost = CostModel(0.001, 0.0001, table=((1, 0.002), (8, 0.004)), host_s=0.0005)
    assert cost.model_seconds(1) == pytest.approx(0.002)
    assert cost.model_seconds(4) == pytest.approx(0.002 + 0.002 * 3 / 7)
    assert cost.model_seconds(18) == pytest.approx(0.004 + 0.0001 * 10)
    assert cost.seconds(1) == pytest.approx(0.0025)
    assert fit([(1, 3.0), (3, 7.0)]) == pytest.approx((1.0, 2.0))
    assert CostModel.from_mapping(cost.to_dict()) == cost
    with pytest.raises(ConfigError, match="tau \\+ delta must be positive"):
        CostModel.from_mapping({"tau": 0, "delta": 0})


def test_cost_model_grows_linearly_with_the_context_between_its_two_tables():
    cost = CostModel(
        0.001,
        0.0001,
        table=((1, 0.002), (8, 0.004)),
        context=64,
        long_table=((1, 0.0025), (8, 0.006)),
        long_context=320,
    )
    assert cost.model_seconds(8) == pytest.approx(0.004)  # no context: the table's own
    assert cost.model_seconds(8, 64) == pytest.approx(0.004)
    assert cost.model_seconds(8, 320) == pytest.approx(0.006)
    assert cost.model_seconds(8, 192) == pytest.approx(0.005)
    assert cost.model_seconds(8, 576) == pytest.approx(0.008)  # extrapolated beyond the long table
    assert cost.model_seconds(4, 320) == pytest.approx(0.0025 + 0.0035 * 3 / 7)
    assert cost.model_seconds(8, 0) == pytest.approx(0.004)  # never below the short table
    assert cost.seconds(1, 320) > cost.seconds(1, 64)
    assert CostModel.from_mapping(cost.to_dict()) == cost
    per_row = CostModel(0.001, 0.0001, host_s=0.0005, host_row_s=0.00002)  # the decoder's work grows with rows
    assert per_row.seconds(10) - per_row.model_seconds(10) == pytest.approx(0.0005 + 0.0002)
    assert CostModel.from_mapping(per_row.to_dict()) == per_row
    assert "320" in cost.describe()


def _as_cached(monkeypatch):
    """The staleness check finds every table's shape as cached (it times the machine otherwise)."""

    def measured(model, context, rows, rounds):
        cached = load_cached(model_key(model))
        return dict(cached.table)[rows] / dict(cached.table)[1]

    monkeypatch.setattr(costs_module, "measure_ratio", measured)


def test_calibration_measures_every_row_count_and_is_cached_per_model(models, monkeypatch, tmp_path):
    monkeypatch.setenv("SPECFRAME_CACHE_DIR", str(tmp_path))
    _as_cached(monkeypatch)
    model = models[SETDLM]
    quick = costs_module.calibrate
    calls = []

    def counted(*args, **kwargs):
        calls.append(1)
        return quick(*args, budget_s=0.05, limit_s=0.2, min_rounds=1, max_rounds=2, rows=(1, 4, 16))

    monkeypatch.setattr(costs_module, "calibrate", counted)
    first = cost_model_for(model)
    assert first.source == "calibrated" and [r for r, _ in first.table] == [1, 4, 16]
    assert [r for r, _ in first.long_table] == [1, 4, 16] and first.long_context > first.context
    assert all(long >= short for (_, short), (_, long) in zip(first.table, first.long_table, strict=True))
    assert all(a[1] <= b[1] for a, b in zip(first.table, first.table[1:], strict=False))
    assert first.tau >= 0 and first.delta >= 0 and first.key == model_key(model)
    again = cost_model_for(model)
    assert again.source == "cache" and again.table == first.table and len(calls) == 1
    assert cost_model_for(model, refresh=True).source == "calibrated" and len(calls) == 2
    other = dict(first.key, threads=first.key["threads"] + 1)
    assert load_cached(other) is None  # another thread count is another machine
    path = save(first)
    path.write_text("{not json", encoding="utf-8")
    assert load_cached(first.key) is None


def test_a_slow_warm_up_such_as_a_compile_does_not_use_up_the_calibration_budget(models, monkeypatch):
    # The compiled path compiles in its first call: counted in the budget, it left a single timing round.
    model = models[SETDLM]
    monkeypatch.setattr(costs_module, "WARMUP_S", 0.05)
    calls = []
    forward = model.forward

    def first_call_compiles(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:  # the first call after the two prefills
            time.sleep(0.4)
        return forward(*args, **kwargs)

    monkeypatch.setattr(model, "forward", first_call_compiles)
    costs_module.calibrate(model, budget_s=0.1, limit_s=0.3, min_rounds=3, max_rounds=3, rows=(1, 4))
    pairs = 4  # two contexts x two row counts, the 1-row call over the short prefix the reference
    per_round = 2 * (pairs - 1) + 1  # every other pair between two reference calls
    assert len(calls) == 2 + pairs + 3 * per_round  # prefills, warm-up, then all three rounds


def test_calibration_times_wide_calls_with_their_drafting_rows_on_the_adapter(monkeypatch):
    # A speculative call runs the drafter's adapter on its drafting rows and an AR call runs none, so a table
    # timed without the adapter would price every wide call too low (by about 0.8 ms of 5 on SmolLM2 q4_1).
    from specframe.models import load_model

    model = load_model("nemotron-stdlib-tiny")
    model.has_adapter = True  # what calibration reads; the calls it makes are what this test checks
    seen = []
    forward = model.forward

    def spy(cache, call):
        adapter = call.adapter_rows
        seen.append((int(call.input_ids.shape[0]), None if adapter is None else tuple(adapter.tolist())))
        return forward(cache, call)

    monkeypatch.setattr(model, "forward", spy)
    costs_module.calibrate(model, budget_s=0.05, limit_s=0.2, min_rounds=1, max_rounds=1, rows=(1, 3))
    timed = {pair for pair in seen if pair[0] in (1, 3)}  # (prefills are longer)
    assert timed == {(1, None), (3, (False, True, True))}
    model.has_adapter = False  # without an adapter no call marks any row
    seen.clear()
    costs_module.calibrate(model, budget_s=0.05, limit_s=0.2, min_rounds=1, max_rounds=1, rows=(1, 3))
    assert {pair for pair in seen if pair[0] in (1, 3)} == {(1, None), (3, None)}


def test_calibrate_command_prints_the_model_and_reuses_its_cache(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SPECFRAME_CACHE_DIR", str(tmp_path))
    _as_cached(monkeypatch)
    folder = tmp_path / "model"
    tiny_model(NEMOTRON, folder, vocab=VOCAB, seed=2, dtype="float32")
    quick = costs_module.calibrate
    monkeypatch.setattr(costs_module, "calibrate", lambda *a, **k: quick(*a, **{**k, "budget_s": 0.05, "limit_s": 0.2}))
    assert main(["calibrate", "--model", str(folder), "--json"]) == 0
    first = json.loads(capsys.readouterr().out)
    assert first["source"] == "calibrated" and first["host_s"] == 0 and first["table"]  # forwards only
    assert main(["calibrate", "--model", str(folder)]) == 0
    text = capsys.readouterr().out
    assert "source: cache" in text and "ms x rows" in text and first["cache_file"] in text


def test_a_cached_table_whose_shape_drifted_is_measured_again(models, monkeypatch, tmp_path):
    from specframe.auto.costs import STALE_SHAPE, shape_drift

    monkeypatch.setenv("SPECFRAME_CACHE_DIR", str(tmp_path))
    model = models[SETDLM]
    table = ((1, 0.002), (4, 0.003), (10, 0.004), (16, 0.006))
    cached = CostModel(0.0018, 0.0002, table, context=16, key=model_key(model), source="calibrated")
    save(cached)
    fresh = CostModel(0.001, 0.0001, ((1, 0.001), (10, 0.002)), context=16, key=model_key(model), source="calibrated")
    calibrations = []
    monkeypatch.setattr(costs_module, "calibrate", lambda *a, **k: calibrations.append(1) or fresh)
    measured = []

    def planted(ratios):  # successive checks measure these ratios of a 10-row call to a 1-row call
        def measure(model, context, rows, rounds):
            assert (context, rows) == (16, 10)  # the table's context, its widest count up to CHECK_ROWS
            measured.append(rows)
            return ratios[len(measured) - 1]

        monkeypatch.setattr(costs_module, "measure_ratio", measure)

    checked = set()
    monkeypatch.setattr(costs_module, "_CHECKED", checked)
    planted([2.0 * 1.1])  # the table says 2.0: within STALE_SHAPE, a uniform slowdown aside
    assert cost_model_for(model).source == "cache" and not calibrations and len(measured) == 1
    assert cost_model_for(model).source == "cache" and len(measured) == 1  # checked once per process
    checked.clear()
    measured.clear()
    planted([2.0 * 1.5, 2.0 * 0.98])  # one check off, the second within: the table is kept
    assert shape_drift(model, cached) == pytest.approx(0.98)
    measured.clear()
    planted([2.0 * 1.5, 2.0 * 1.3])  # both off: the wide call got dearer relative to AR calls; measure again
    assert cost_model_for(model) is fresh and calibrations == [1]
    assert load_cached(model_key(model)).table == fresh.table  # and the new table is cached
    assert 1.1 < STALE_SHAPE < 1.3
    no_one_row = CostModel(0.001, 0.0, ((4, 0.003), (8, 0.004)), context=16)
    assert shape_drift(model, no_one_row) is None  # nothing to compare with: kept


def test_calibration_pools_a_noisy_sample_instead_of_carrying_it_to_every_wider_count():
    from specframe.auto.costs import _monotone

    pooled = _monotone([(1, 1.0), (2, 5.0), (4, 2.0), (8, 3.0), (16, 6.0)])
    assert [r for r, _ in pooled] == [1, 2, 4, 8, 16]
    assert [t for _, t in pooled] == pytest.approx([1.0, 10 / 3, 10 / 3, 10 / 3, 6.0])
    assert _monotone([(1, 1.0), (2, 2.0)]) == [(1, 1.0), (2, 2.0)]


class _BurstyMachine:
    """A simulated clock: a call costs a known function of its rows and context, times bursts of load.

    The load comes in runs of calls: short quiet runs (no load), longer busy ones (1.2-1.8x), and now and
    then one call descheduled (2-5x). Seeded, so every test run sees the same timings.
    """

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.now = 0.0
        self.load = 1.0
        self.left = 0

    @staticmethod
    def truth(rows: int, context: int) -> float:
        return 1e-3 + 8e-5 * rows + 4e-7 * context * rows

    def seconds(self, rows: int, context: int) -> float:
        if not self.left:
            quiet = self.rng.random() < 0.2
            self.load = 1.0 if quiet else self.rng.uniform(1.2, 1.8)
            self.left = self.rng.randint(1, 4) if quiet else self.rng.randint(5, 40)
        self.left -= 1
        descheduled = self.rng.uniform(2, 5) if self.rng.random() < 0.03 else 1.0
        seconds = self.truth(rows, context) * self.load * descheduled
        self.now += seconds
        return seconds

    def install(self, monkeypatch) -> None:
        """Time the calibration's calls, and its budget, on this clock instead of the machine's."""
        monkeypatch.setattr(costs_module, "_timed", lambda model, cache, ids, start: self.seconds(len(ids), start))
        monkeypatch.setattr(costs_module, "time", SimpleNamespace(perf_counter=lambda: self.now))


def _shape_error(shape, context):
    """The largest relative error of ``{(context, rows): t / t(1 row, short prefix)}`` against the truth."""
    truth = _BurstyMachine.truth
    return max(abs(ratio / (truth(r, c) / truth(1, context)) - 1) for (c, r), ratio in shape.items())


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_paired_ratios_find_the_shape_through_bursts_of_load_that_fastest_timings_miss(models, monkeypatch, seed):
    # A per-count fastest timing depends on whether that count happened to run in a quiet moment, so the
    # table's shape t(R) / t(1), all the choice reads, was off by a different amount for every count.
    machine = _BurstyMachine(seed)
    machine.install(monkeypatch)
    cost = costs_module.calibrate(models[SETDLM])
    counts = [r for r, _ in cost.table]
    assert counts == list(costs_module.ROW_COUNTS) and cost.long_context > 2 * cost.context
    assert 1.7 < machine.now < 2.2  # the simulated seconds stayed within the budget (1.8 s, one round past)
    t1 = cost.table[0][1]
    shape = {(cost.context, r): s / t1 for r, s in cost.table}
    shape |= {(cost.long_context, r): s / t1 for r, s in cost.long_table}
    assert _shape_error(shape, cost.context) < 0.02
    assert t1 == pytest.approx(_BurstyMachine.truth(1, cost.context))  # some 1-row call ran in a quiet moment

    # The former procedure on the same kind of load: shuffled rounds, each count's fastest timing.
    machine = _BurstyMachine(seed)
    pairs = list(shape)
    fastest = {pair: math.inf for pair in pairs}
    order = random.Random(0)
    for round_index in range(25):
        if round_index >= 3 and machine.now > 1.8:
            break
        order.shuffle(pairs)
        for c, r in pairs:
            fastest[c, r] = min(fastest[c, r], machine.seconds(r, c))
    old = {pair: seconds / fastest[cost.context, 1] for pair, seconds in fastest.items()}
    assert _shape_error(old, cost.context) > 0.15


def test_the_staleness_check_takes_the_median_of_paired_ratios(models, monkeypatch):
    machine = _BurstyMachine(1000)
    machine.install(monkeypatch)
    ratio = costs_module.measure_ratio(models[SETDLM], 16, 10, costs_module.CHECK_ROUNDS)
    assert ratio == pytest.approx(_BurstyMachine.truth(10, 16) / _BurstyMachine.truth(1, 16), rel=0.02)

    seen = []  # one warm-up call of each, then every wide call between two 1-row calls
    monkeypatch.setattr(costs_module, "_timed", lambda model, cache, ids, start: seen.append(len(ids)) or len(ids))
    assert costs_module.measure_ratio(models[SETDLM], 16, 10, 3) == 10
    assert seen == [1, 10, 1, 10, 1, 10, 1, 10, 1]


def test_an_unwritable_cost_cache_is_told_once_and_the_model_still_serves(models, monkeypatch, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder", encoding="utf-8")
    monkeypatch.setenv("SPECFRAME_CACHE_DIR", str(blocker / "costs"))  # its parent is a file: mkdir fails
    monkeypatch.setattr(costs_module, "_UNWRITABLE", set())
    cost = costs_module.calibrate(models[SETDLM], budget_s=0.05, limit_s=0.2, min_rounds=1, max_rounds=1, rows=(1, 4))
    with pytest.warns(UserWarning, match="could not be cached in .*every process will calibrate again"):
        assert save(cost) is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a second failure in the same folder stays quiet
        assert save(cost) is None
    assert load_cached(cost.key) is None


@pytest.mark.skipif(not kernels.available(), reason=f"no kernels: {kernels.unavailable_reason()}")
def test_a_model_quantized_at_load_has_its_own_cost_table():
    # --quant keeps the float checkpoint's parameters, so the key once matched the float model's: a q8_0 run
    # calibrated a table that a later float32 run of the same checkpoint took for its own.
    plain = load_model("nemotron-stdlib-tiny", dtype="float32")
    quantized = load_model("nemotron-stdlib-tiny", dtype="float32", quant="q8_0")
    assert model_key(plain)["formats"] != model_key(quantized)["formats"]
    assert costs_module.cache_path(model_key(plain)) != costs_module.cache_path(model_key(quantized))
    assert model_key(plain) == model_key(load_model("nemotron-stdlib-tiny", dtype="float32"))


def test_in_a_batch_linear_ss_is_priced_with_its_drafting_call_before_a_probe():
    """Linear-SS spends a drafting call that adds no token before each verification: in a batch where a
    verification of W drafts alone would repay its rows at full acceptance but the pair cannot, no probe."""
    candidates = [AR, *(Candidate("linear", w, "linear") for w in (1, 2))]

    def rows(candidate, kappa):  # the drafting call: the pending token and W masks; the verification: W drafts
        return 1 if candidate.kind == "ar" else kappa if kappa else candidate.width + 1

    def probes(delta_per_row):
        policy = auto_module.WidthPolicy(candidates, rows, size=3, free_bonus=True)
        policy.bind(CostModel(0.0001, delta_per_row, source="given"), deterministic=False)
        policy.start_request()
        labels = []
        for _ in range(300):
            candidate = policy.choose(100)
            labels.append(candidate.label)
            policy.observe_call(rows(candidate, candidate.width), 0.01, 100, 200)
            policy.observe_verification([("prefix", d) for d in range(1, candidate.width + 1)], 0, 1)
        return [label for label in labels[40:] if label != "ar"]

    # Each row costs delta in the batch: a pair is 2W + 1 rows for at most W + 1 tokens (worse than AR's row a
    # token), while its verification alone, W rows for W + 1 tokens, beats AR and looked worth a probe.
    assert probes(0.001) == []


def test_a_split_chain_is_averaged_as_stepping_it_would():
    # Certain acceptance splits Packed-SS's chain (a leftover state that maps to itself, a cycle through the
    # others), where the elimination has no pivot: the average over 256 steps from the last state, now summed
    # by doubling (step by step it took ~9 ms of plain Python per estimate at W=16).
    for size in (4, 9, 17):
        chain = [[0.0] * size for _ in range(size)]
        chain[1][1] = 1.0  # a class of its own, never reached from the last state
        cycle = [0, *range(2, size)]  # the last state steps to 0, 0 to 2, ..., back to the last
        for a, b in zip([size - 1, *cycle], cycle, strict=False):
            chain[a][b] = 1.0
        stepped, current = [0.0] * size, [0.0] * (size - 1) + [1.0]
        for _ in range(256):
            current = [sum(current[i] * chain[i][j] for i in range(size)) for j in range(size)]
            stepped = [a + b for a, b in zip(stepped, current, strict=True)]
        assert stationary(chain) == pytest.approx([v / sum(stepped) for v in stepped], abs=1e-12)
