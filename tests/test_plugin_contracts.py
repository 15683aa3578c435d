"""A third-party plugin that breaks its interface while decoding gets an error naming it, not a bare traceback.

Each plugin here makes one mistake a plugin author makes (found by writing plugins from the documentation
alone): a plan or verdict of the wrong type, an update that returns nothing or accepts nothing, an order that
is not a permutation, a method that raises. Built-in code that raises is never blamed on a plugin.
"""

from __future__ import annotations

import pytest

from decoding_helpers import NEMOTRON, SETDLM, eos_ids, tiny_model
from specframe import compose
from specframe.acceptance.greedy import GreedyAcceptance
from specframe.acceptance.rejection import RejectionSampling
from specframe.cli import main
from specframe.errors import PluginError
from specframe.hookspecs import hookimpl
from specframe.ledger import outcome_pairs
from specframe.orders.base import OrderPolicy
from specframe.plan import Guess
from specframe.plugins import plugin_registered
from specframe.schedules.base import Schedule, verify_only_plan, verify_planned_chain
from specframe.schedules.packed import PackedSchedule
from specframe.testing.models import write_random_checkpoint


@pytest.fixture(scope="module", params=[NEMOTRON, SETDLM])
def model(request, tmp_path_factory):
    return tiny_model(request.param, tmp_path_factory.mktemp("contracts"), vocab=12, seed=1)


class _PlanDict(Schedule):
    def plan(self, state):
        return {"order": ()}

    def update(self, state, plan, result):  # pragma: no cover - never reached
        return 0


class _UpdateNone(Schedule):
    def plan(self, state):
        return verify_only_plan(state)

    def update(self, state, plan, result):
        verify_planned_chain(state, plan, result)  # forgets to return the verdict


class _AcceptsNothing(Schedule):
    def plan(self, state):
        return verify_only_plan(state)

    def update(self, state, plan, result):
        return 0  # never passes the result to the acceptance rule (and returns what update() used to)


class _PlanRaises(Schedule):
    def plan(self, state):
        raise RuntimeError("boom in plan")

    def update(self, state, plan, result):  # pragma: no cover - never reached
        return 0


class _DropsOne(OrderPolicy):
    left_to_right = True
    uses_scores = False

    def order(self, positions, scores):
        return list(positions)[:-1]


class _ClaimsLeftToRight(OrderPolicy):
    left_to_right = True  # which lets it past Nemotron's check when the decoder is composed
    uses_scores = False

    def order(self, positions, scores):
        return sorted(positions, reverse=True)


class _TupleVerdict(GreedyAcceptance):
    def verify(self, drafts, logits, generator):
        return (0, int(logits[0].argmax()))


class _VerifyRaises(GreedyAcceptance):
    def verify(self, drafts, logits, generator):
        raise ValueError("boom in verify")


class _SamplesWithoutTheFlag(RejectionSampling):
    stochastic = False  # forgotten: the rule still draws from the generator it is given

    def __init__(self):
        super().__init__(temperature=1.0)


class _FailsLater(PackedSchedule):
    def update(self, state, plan, result):
        if state.calls == 4:  # after some text has been written
            raise ZeroDivisionError("late")
        return super().update(state, plan, result)


class _CommitsOneMore(PackedSchedule):
    """Verifies as Packed-SS does, then commits the accepted tokens and one more draft token, as a guess."""

    def update(self, state, plan, result):
        verdict = super().update(state, plan, result)
        pairs = outcome_pairs(plan, verdict)
        position = plan.order[len(pairs)] if len(pairs) < len(plan.order) else None
        if position is not None and position in state.drafts:
            ref = state.drafts[position]
            return Guess((*pairs, (position, ref.proposals.token_list[ref.row])))
        return verdict


class _Plugin:
    @hookimpl
    def register_schedules(self, register):
        register("fails-later", _FailsLater)
        register("plan-dict", _PlanDict)
        register("update-none", _UpdateNone)
        register("accepts-nothing", _AcceptsNothing)
        register("plan-raises", _PlanRaises)
        register("commits-one-more", _CommitsOneMore)

    @hookimpl
    def register_order_policies(self, register):
        register("drops-one", _DropsOne)
        register("claims-ltr", _ClaimsLeftToRight)

    @hookimpl
    def register_acceptance_rules(self, register):
        register("tuple-verdict", _TupleVerdict)
        register("verify-raises", _VerifyRaises)
        register("samples-unflagged", _SamplesWithoutTheFlag)


@pytest.fixture(autouse=True)
def registered():
    with plugin_registered(_Plugin(), "contract_breakers"):
        yield


CASES = [
    ({"schedule": "plan-dict", "width": 3}, "schedule 'plan-dict'", "plan() returned dict, not a CallPlan"),
    ({"schedule": "update-none", "width": 3}, "schedule 'update-none'", "update() returned None for a call that"),
    (
        {"schedule": "accepts-nothing", "width": 3},
        "schedule 'accepts-nothing'",
        "update() returned int 0, not a Verdict",
    ),
    ({"schedule": "plan-raises", "width": 3}, "schedule 'plan-raises'", "RuntimeError: boom in plan while decoding"),
    (
        {"schedule": "commits-one-more", "width": 3},
        "schedule 'commits-one-more'",
        "update() returned a Guess of",
    ),
    ({"order": "drops-one", "width": 3}, "order policy 'drops-one'", "not a permutation"),
    ({"order": "claims-ltr", "width": 3}, "order policy 'claims-ltr'", "sets left_to_right = True, but order()"),
    ({"acceptance": "tuple-verdict", "width": 3}, "acceptance rule 'tuple-verdict'", "is a tuple, not a Verdict"),
    ({"acceptance": "verify-raises"}, "acceptance rule 'verify-raises'", "raised ValueError: boom in verify"),
]


@pytest.mark.parametrize(("config", "who", "what"), CASES, ids=[c[0][next(iter(c[0]))] for c in CASES])
def test_a_broken_plugin_is_named_with_what_it_did(model, config, who, what):
    decoder = compose({"model": model, "max_new_tokens": 6, "cost": {"tau": 1e-3, "delta": 1e-5}, **config})
    with pytest.raises(PluginError) as info:
        decoder.generate(prompt_ids=[3, 4, 5])
    message = str(info.value)
    assert who in message and "(plugin 'contract_breakers', distribution '<local>')" in message
    assert what in message and "bug in that plugin" in message


def test_the_plugins_own_exception_is_the_cause(model):
    decoder = compose({"model": model, "schedule": "plan-raises", "width": 2, "max_new_tokens": 4})
    with pytest.raises(PluginError) as info:
        decoder.generate(prompt_ids=[3, 4, 5])
    assert isinstance(info.value.__cause__, RuntimeError) and str(info.value.__cause__) == "boom in plan"


def test_a_builtin_that_raises_is_not_blamed_on_a_plugin(model, monkeypatch):
    from specframe.schedules.packed import PackedSchedule

    def broken(self, state):
        raise RuntimeError("a bug of specframe's own")

    monkeypatch.setattr(PackedSchedule, "plan", broken)
    decoder = compose({"model": model, "schedule": "packed", "width": 2, "max_new_tokens": 4})
    with pytest.raises(RuntimeError, match="a bug of specframe's own"):
        decoder.generate(prompt_ids=[3, 4, 5])


def test_the_command_line_prints_one_line_or_with_debug_the_traceback(capsys, monkeypatch, tmp_path):
    folder = write_random_checkpoint(NEMOTRON, tmp_path / "m", seed=1)
    args = ["generate", "--model", str(folder), "--schedule", "plan-raises", "--width", "2", "--max-new-tokens", "2",
            "--prompt-ids", "3,4,5"]  # fmt: skip
    for off in (None, "", "0", "off", "False", "NO"):  # each means no traceback (a set "0" used to mean one)
        if off is None:
            monkeypatch.delenv("SPECFRAME_DEBUG", raising=False)
        else:
            monkeypatch.setenv("SPECFRAME_DEBUG", off)
        assert main(args) == 1, off
        err = capsys.readouterr().err
        assert err.startswith("error: schedule 'plan-raises' (plugin 'contract_breakers'") and err.count("\n") == 1
    for on in ("1", "true", "Yes", "ON"):
        monkeypatch.setenv("SPECFRAME_DEBUG", on)
        with pytest.raises(PluginError):
            main(args)
    monkeypatch.setenv("SPECFRAME_DEBUG", "abc")
    assert main(args) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: environment variable SPECFRAME_DEBUG='abc' is not a switch") and err.count("\n") == 1


def test_a_failure_after_some_text_ends_the_line_before_the_error(capsys, tmp_path):
    folder = write_random_checkpoint(NEMOTRON, tmp_path / "m", seed=1)
    args = ["--schedule", "fails-later", "--width", "2", "--max-new-tokens", "24"]
    code = main(["generate", "--model", str(folder), *args, "def f(x):"])
    out, err = capsys.readouterr()
    assert code == 1 and "ZeroDivisionError: late" in err
    assert out.strip() and out.endswith("\n")  # text was written, and the line was ended


def test_a_sampling_rule_without_the_stochastic_flag_is_reproduced_by_its_seed(model):
    # Every rule gets the request's seeded generator: without it this rule drew from torch's global one.
    decoder = compose({"model": model, "acceptance": "samples-unflagged", "width": 3, "max_new_tokens": 24})
    first = [decoder.generate(prompt_ids=[1, 2], seed=seed).output_ids for seed in range(4)]
    again = [decoder.generate(prompt_ids=[1, 2], seed=seed).output_ids for seed in range(4)]
    assert first == again
    assert len({tuple(ids) for ids in first}) > 1  # it does sample: the seeds give different outputs


@pytest.mark.parametrize("schedule", ["fails-later", "commits-one-more", "update-none"])
def test_a_broken_plugin_is_named_in_a_batch_too(model, schedule):
    """Each request of a batch plans with its own copy of the schedule, which is still blamed on its plugin."""
    decoder = compose({"model": model, "schedule": schedule, "width": 3, "max_new_tokens": 30})
    with eos_ids(model, ()), pytest.raises(PluginError, match=f"schedule '{schedule}' \\(plugin 'contract_breakers'"):
        decoder.generate_many([[3, 4, 5], [6, 7]], max_batch=2)
