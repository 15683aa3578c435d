"""The cache ledger: whatever the verdicts, the KV cache always equals a fresh prefill of the committed tokens.

A schedule here plans real calls (Packed-SS, Quadratic-SS, Linear-SS, K-branch, plain AR, left to right or,
on SetDLM, in random orders) but returns random verdicts: any number of accepted drafts and any verifier token,
EOS included (so any-order verification accepts an EOS after tokens past it, which must be dropped with
every cached row that saw them), under random stop sequences. After every call, the rows the cache holds
must be those of accepted tokens, exactly the ledger's cached set, and give the same logits to a probe as
a fresh cache prefilled with the same tokens in the same order (float64, both families).
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from decoding_helpers import FAMILIES, NEMOTRON, SETDLM, tiny_model
from specframe import compose
from specframe.acceptance.base import Verdict
from specframe.errors import PluginError
from specframe.ledger import CacheLedger, Guess
from specframe.models.base import ModelCall
from specframe.orders.base import OrderPolicy
from specframe.plan import CallPlan
from specframe.schedules.base import Schedule
from specframe.state import DecodeContext, DecodeState, LayoutTraits

VOCAB = 16
EOS = VOCAB - 2
ATOL = 1e-9


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("ledger")
    return {family: tiny_model(family, root / family, vocab=VOCAB, seed=3) for family in FAMILIES}


class RandomVerdicts(Schedule):
    """The inner schedule's plans and drafts, with verdicts drawn by hypothesis instead of the rule's."""

    exact = True

    def __init__(self, inner: Schedule, data: st.DataObject) -> None:
        self.inner, self.data, self.name = inner, data, inner.name

    def plan(self, state):
        return self.inner.plan(state)

    def update(self, state, plan, result):
        real = self.inner.update(state, plan, result)  # stores the next draft as the schedule would
        if not plan.num_verify:
            return real
        accepted = self.data.draw(st.integers(0, len(plan.chain)), label="accepted")
        if accepted == len(plan.chain) == plan.num_verify:
            return Verdict(accepted, None, torch.zeros(plan.num_verify))
        token = self.data.draw(st.sampled_from([EOS, EOS, 1, 2, 3]), label="token")
        return Verdict(accepted, token, torch.zeros(plan.num_verify))


class RandomOrder(OrderPolicy):
    """Any permutation of the window, drawn by hypothesis (SetDLM verifies in any order)."""

    left_to_right = False
    uses_scores = False

    def __init__(self, data: st.DataObject) -> None:
        self.data = data

    def order(self, positions, scores):
        return self.data.draw(st.permutations(list(positions)), label="order")


def _forward(model, cache, ids, positions, attention):
    call = ModelCall(torch.as_tensor(ids, dtype=torch.long), torch.as_tensor(positions, dtype=torch.long), attention)
    return model.forward(cache, call)


def _probe(model, cache, start):
    """Logits of mask rows and a token row at a few positions, each seeing the cache and itself."""
    positions = [start, start + 1, start + 3, start + 2]
    ids = [model.mask_token_id] * 3 + [5]
    return _forward(model, cache, ids, positions, torch.eye(4, dtype=torch.bool))


def _check_cache(model, stepper):
    state, ledger, cache = stepper.state, stepper.ledger, stepper.cache
    positions = list(cache.positions)
    assert len(positions) == cache.length == len(set(positions))
    assert set(positions) == ledger.cached
    assert all(state.is_resolved(p) for p in positions)  # only accepted tokens are cached
    accepted = set(state.generation_order())
    assert accepted == set(range(state.start)) | set(state.tokens)
    assert {p for p, _ in state.pending} == accepted - ledger.cached  # pending: accepted, not cached
    fresh = model.new_cache(len(positions) + 8)
    _forward(
        model,
        fresh,
        [state.token_at(p) for p in positions],
        positions,
        torch.ones(len(positions), len(positions), dtype=torch.bool).tril(),
    )
    fresh.commit(list(range(len(positions))), positions)
    torch.testing.assert_close(_probe(model, cache, state.start), _probe(model, fresh, state.start), rtol=0, atol=ATOL)


@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture],
)
@given(
    family=st.sampled_from((*FAMILIES, SETDLM)),  # SetDLM verifies in any order: the harder cases
    schedule=st.sampled_from(("packed", "quadratic", "linear", "kbranch", "ar")),
    any_order=st.sampled_from((True, True, False)),
    width=st.integers(2, 5),
    prompt=st.lists(st.integers(0, EOS - 1), min_size=1, max_size=6),
    length=st.integers(2, 10),
    stops=st.lists(st.lists(st.integers(1, 4), min_size=1, max_size=2), max_size=2),
    data=st.data(),
)
def test_the_cache_always_equals_a_fresh_prefill_of_the_committed_tokens(
    models, family, schedule, any_order, width, prompt, length, stops, data
):
    model = models[family]
    config = {"model": model, "schedule": schedule, "max_new_tokens": length, "stop": stops}
    if schedule != "ar":
        config["width"] = width
    decoder = compose(config)
    decoder.schedule = RandomVerdicts(decoder.schedule, data)
    if any_order and family != NEMOTRON:  # Nemotron verifies left to right only
        decoder.order = RandomOrder(data)
    stepper = decoder.stepper(prompt_ids=prompt)
    while (call := stepper.prepare()) is not None:
        stepper.finish(
            _forward(model, stepper.cache, call.input_ids, call.position_ids, call.attention)[call.output_rows], 0.0
        )
        _check_cache(model, stepper)
    output = stepper.result().output_ids
    assert len(output) <= length and EOS not in output[:-1]
    for stop in stops:  # no stop sequence ends before the output does
        assert all(tuple(output[i : i + len(stop)]) != tuple(stop) for i in range(len(output) - len(stop)))


class _Exact(Schedule):
    exact = True

    def plan(self, state):  # pragma: no cover - never called
        raise AssertionError

    update = plan


def _ledger(eos=(EOS,)):
    ctx = DecodeContext(width=4, order=None, rule=None, traits=LayoutTraits(False, True), eos_token_ids=frozenset(eos))
    return CacheLedger(DecodeState(prompt=(5, 6, 7), max_new_tokens=8, ctx=ctx))


def test_a_verdict_accepts_the_chain_prefix_and_the_verifier_token():
    ledger = _ledger()
    plan = CallPlan(pending=((0, 5), (1, 6), (2, 7)), order=(4, 3, 5), chain=(9, 8), num_verify=3, drafts=(), width=3)
    ledger.settle(_Exact(), plan, None, Verdict(1, 2, torch.zeros(3)))
    state = ledger.state
    assert state.tokens == {4: 9, 3: 2} and state.generation_order() == [0, 1, 2, 4, 3]
    assert [(v.drafted, v.accepted, v.appended) for v in state.verifications] == [(2, 1, 2)]
    assert state.calls == 1


@pytest.mark.parametrize(
    ("outcome", "problem"),
    [
        (3, "returned int 3, not a Verdict"),
        (None, "returned None for a call that verified a window"),
        (Guess(((3, 1),)), "returned a Guess of 1 token(s) without a verifier's verdict"),
        (Verdict(3, 1, torch.zeros(2)), "accepting 3 draft(s) and token 1 for a chain of 2"),
        (Verdict(2, 1, torch.zeros(2)), "accepting 2 draft(s) and token 1 for a chain of 2 with 2 verified"),
    ],
)
def test_an_exact_schedule_cannot_accept_what_nothing_verified(outcome, problem):
    ledger = _ledger()
    plan = CallPlan(pending=(), order=(3, 4), chain=(1, 2), num_verify=2, drafts=(), width=2)
    with pytest.raises(PluginError, match="bug in that plugin") as info:
        ledger.settle(_Exact(), plan, None, outcome)
    assert problem in str(info.value) and "_Exact" in str(info.value)
    assert not ledger.state.tokens  # nothing was accepted
