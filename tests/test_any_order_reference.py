"""The public any-order reference (specframe.testing.any_order) that plugin authors test order policies with."""

from __future__ import annotations

import pytest

from decoding_helpers import FAMILIES, NEMOTRON, SETDLM, SYNTHETIC_COST, conditional_logits, tiny_model
from specframe import compose, hookimpl
from specframe.acceptance.base import Verdict
from specframe.acceptance.greedy import GreedyAcceptance
from specframe.orders.base import OrderPolicy
from specframe.plugins import plugin_registered
from specframe.testing.any_order import any_order_violations, record_calls
from specframe.testing.reference import conditional_logits as public_conditional_logits

VOCAB = 24
PROMPTS = ([3, 9, 4], [17, 2, 5, 11, 8], [6])


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("anyorder")
    models = {family: tiny_model(family, root / family, vocab=VOCAB, seed=2) for family in FAMILIES}
    for model in models.values():
        model.eos_token_ids = ()
    return models


class _RightToLeft(OrderPolicy):
    """A plugin-style order: the rightmost open positions first (far from left to right)."""

    uses_scores = False

    def order(self, positions, scores):
        return sorted(positions, reverse=True)


class _AcceptsEveryDraft(GreedyAcceptance):
    """Not exact: every draft is accepted, so the accepted tokens are the drafter's, not the verifier's."""

    def verify(self, drafts, logits, generator):
        verdict = super().verify((), logits[len(drafts) :][:1], generator) if len(drafts) < len(logits) else None
        return Verdict(len(drafts), None if verdict is None else verdict.token, logits.amax(-1))


class _Plugin:
    @hookimpl
    def register_order_policies(self, register):
        register("right-to-left", _RightToLeft)

    @hookimpl
    def register_acceptance_rules(self, register):
        register("accepts-every-draft", _AcceptsEveryDraft)


@pytest.fixture(autouse=True)
def _registered():
    with plugin_registered(_Plugin(), "any_order_test"):
        yield


def decoder(model, schedule, order, width, acceptance="greedy"):
    config = {"model": model, "schedule": schedule, "order": order, "width": width, "acceptance": acceptance}
    return compose({**config, "max_new_tokens": 12, "cost": SYNTHETIC_COST})


@pytest.mark.parametrize("family", FAMILIES)
def test_the_public_conditional_equals_the_suites_hand_written_one(models, family):
    model = models[family]
    context = [(0, 3), (1, 9), (2, 4), (3, 7)]
    targets = [4] if family == NEMOTRON else [4, 6, 9]
    if family == SETDLM:
        context = [(0, 3), (1, 9), (2, 4), (5, 7), (3, 1)]  # out of textual order, as any-order accepts them
    for target in targets:
        ours = public_conditional_logits(model, context, target)
        assert int(ours.argmax()) == int(conditional_logits(model, context, target).argmax())
        assert ours.double().allclose(conditional_logits(model, context, target).double(), atol=1e-9)


@pytest.mark.parametrize("schedule", ["packed", "linear", "quadratic", "kbranch", "auto"])
@pytest.mark.parametrize("order", ["confidence", "right-to-left", "ltr"])
def test_built_in_schedules_keep_the_guarantee_under_any_order(models, schedule, order):
    for prompt in PROMPTS:
        assert any_order_violations(decoder(models[SETDLM], schedule, order, 4), prompt) == []


@pytest.mark.parametrize("family", FAMILIES)
def test_a_rule_that_accepts_unverified_drafts_is_caught(models, family):
    order = "ltr" if family == NEMOTRON else "right-to-left"
    broken = decoder(models[family], "packed", order, 4, acceptance="accepts-every-draft")
    found = [v for prompt in PROMPTS for v in any_order_violations(broken, prompt)]
    assert found, "the reference must flag drafter tokens accepted without verification"
    violation = found[0]
    assert violation.token != violation.expected
    assert violation.position not in {p for p, _ in violation.context}


def test_the_decoder_gets_its_own_schedule_back_and_the_calls_cover_the_output(models):
    composed = decoder(models[SETDLM], "packed", "confidence", 3)
    schedule = composed.schedule
    result, calls = record_calls(composed, [4, 5, 6])
    assert composed.schedule is schedule
    accepted = {p: t for call in calls for p, t in call.accepted}
    assert [accepted[3 + i] for i in range(len(result.output_ids))] == result.output_ids


def test_a_sampling_decoder_is_refused(models):
    with pytest.raises(ValueError, match="greedy"):
        any_order_violations(decoder(models[SETDLM], "packed", "ltr", 3, acceptance="rejection"), [1, 2])
