"""What a CallPlan must satisfy and which plans each family's layout accepts (documented in docs/plugins/plans.md).

Plans are built by hand here, not by a schedule, so that shapes no built-in schedule makes are tried too: several
draft groups, sparse contexts, a context as long as the chain, different target counts per group. Each
accepted plan's draft logits must equal those of the same group planned alone (groups in one call never see
each other), and its verifier logits those of a plan without draft groups.
"""

from __future__ import annotations

import pytest
import torch

from decoding_helpers import NEMOTRON, SETDLM, tiny_model
from specframe.errors import PlanError
from specframe.models.base import ModelCall
from specframe.plan import CallPlan, DraftGroup
from specframe.plugins import get_registry

VOCAB = 16
PROMPT = ((0, 1), (1, 5), (2, 7), (3, 2))  # pending (position, token) pairs: the prompt
ORDER = (4, 5, 6, 7)
CHAIN = (3, 9, 4)  # draft tokens at positions 4, 5, 6


@pytest.fixture(scope="module")
def families(tmp_path_factory):
    out = {}
    for family in (NEMOTRON, SETDLM):
        model = tiny_model(family, tmp_path_factory.mktemp(family), vocab=VOCAB, seed=2)
        out[family] = (model, get_registry().get("mask_builder", family).factory(model))
    return out


def run(model, builder, plan):
    call = builder.build(plan)
    cache = model.new_cache(call.num_rows + 1)
    logits = model.forward(cache, ModelCall(call.input_ids, call.position_ids, call.attention, call.output_rows))
    return builder.read(call, logits)


def plan(*groups, chain=CHAIN, num_verify=4, order=ORDER, pending=PROMPT, width=4):
    return CallPlan(pending, order, chain, num_verify, tuple(groups), width)


# -- the rules of CallPlan.__post_init__ ----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"chain": (1, 2, 3, 4, 5)}, "longer than the order"),
        ({"num_verify": 5}, "must lie in"),
        ({"num_verify": -1}, "must lie in"),
        ({"chain": (1,), "num_verify": 3}, "one rank past the draft chain"),
    ],
)
def test_plan_rules(kwargs, message):
    with pytest.raises(ValueError, match=message):
        plan(**kwargs)


def test_a_group_context_cannot_exceed_the_chain():
    with pytest.raises(ValueError, match="exceeds the chain"):
        plan(DraftGroup(context=4, targets=(8,)))


# -- plans both layouts accept --------------------------------------------------------------------------------
SHAPES = {
    "several groups, sparse contexts, different target counts": (
        DraftGroup(0, (5, 6, 7)),
        DraftGroup(2, (7, 8)),
        DraftGroup(3, (8,)),
    ),
    "a context equal to the chain length": (DraftGroup(3, (7, 8, 9)),),
    "targets with a gap": (DraftGroup(1, (6, 8)),),
    "an empty group": (DraftGroup(0, ()), DraftGroup(1, (6, 7))),
}


@pytest.mark.parametrize("family", [NEMOTRON, SETDLM])
@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_groups_in_one_call_match_each_group_alone(families, family, shape):
    model, builder = families[family]
    groups = SHAPES[shape]
    together = run(model, builder, plan(*groups))
    alone_verify = run(model, builder, plan()).verify_logits
    torch.testing.assert_close(together.verify_logits, alone_verify, rtol=0, atol=1e-10)
    for index, group in enumerate(groups):
        assert together.draft_logits[index].shape == (len(group.targets), VOCAB)
        if group.targets:
            alone = run(model, builder, plan(group)).draft_logits[0]
            torch.testing.assert_close(together.draft_logits[index], alone, rtol=0, atol=1e-10)


@pytest.mark.parametrize("family", [NEMOTRON, SETDLM])
def test_a_drafting_only_call(families, family):
    model, builder = families[family]
    result = run(model, builder, plan(DraftGroup(0, (4, 5, 6)), chain=(), num_verify=0))
    assert result.verify_logits.shape[0] == 0 and result.draft_logits[0].shape == (3, VOCAB)


# -- where the layouts differ ---------------------------------------------------------------------------------
def test_nemotron_targets_must_follow_the_groups_context(families):
    model, builder = families[NEMOTRON]
    with pytest.raises(PlanError, match="must follow the group's context"):
        run(model, builder, plan(DraftGroup(2, (5, 6, 7))))  # context 2 ends at position 5


def test_setdlm_targets_may_precede_the_context(families):
    model, builder = families[SETDLM]
    result = run(model, builder, plan(DraftGroup(2, (4, 7))))
    assert result.draft_logits[0].shape == (2, VOCAB)


def test_nemotron_verifies_left_to_right_only(families):
    model, builder = families[NEMOTRON]
    with pytest.raises(PlanError, match="left to right only"):
        run(model, builder, plan(order=(5, 4, 6, 7)))
    model, builder = families[SETDLM]
    assert run(model, builder, plan(order=(5, 4, 6, 7))).verify_logits.shape == (4, VOCAB)


def test_nemotron_drafting_only_calls_take_one_group(families):
    model, builder = families[NEMOTRON]
    with pytest.raises(PlanError, match="exactly one draft group"):
        run(model, builder, plan(DraftGroup(0, (4,)), DraftGroup(0, (5,)), chain=(), num_verify=0))
    model, builder = families[SETDLM]
    result = run(model, builder, plan(DraftGroup(0, (4,)), DraftGroup(0, (5, 6)), chain=(), num_verify=0))
    assert [d.shape[0] for d in result.draft_logits] == [1, 2]


def test_nemotron_needs_a_pending_token_before_the_verified_positions(families):
    model, builder = families[NEMOTRON]
    with pytest.raises(PlanError, match="must be a pending input"):
        run(model, builder, plan(pending=()))
