"""The output is a function of the model, the prompt, the configuration and the seed only.

With ``width: "auto"`` the widths are chosen per call. Where they change the output (any-order verification,
sampling with a seed), the choice must not read this machine's cost model or the time calls take: the same
request gives the same tokens under any cost model, any load, and on a decoder's first and later calls.
"""

from __future__ import annotations

import random

import pytest

import specframe.auto.setup as auto_setup
import specframe.decoder as decoder_module
from specframe import compose
from specframe.auto.costs import NOMINAL_COST, CostModel
from specframe.exactness import width_changes_output
from specframe.models import load_model
from specframe.orders.confidence import ConfidenceOrder
from specframe.orders.ltr import LeftToRight

#: Machines as different as the calibration can describe: rows nearly free (a GPU), rows dear (a small CPU),
#: and one with a large decoder overhead. Measured ("calibrated", "cache") models are corrected by timing.
MACHINES = (
    CostModel(tau=1e-3, delta=1e-6, source="calibrated"),
    CostModel(tau=1e-4, delta=2e-4, source="calibrated"),
    CostModel(tau=5e-4, delta=2e-5, host_s=2e-3, host_row_s=1e-4, source="cache"),
)

SCHEDULES = ("ar", "packed", "linear", "quadratic", "kbranch", "auto", "native")
ACCEPTANCE = ("greedy", {"name": "rejection", "temperature": 1.0})
PROMPT = "def fib(n):"
LENGTH = 24


class _LoadedClock:
    """A ``time`` stand-in whose clock advances by a random 0.1-30 ms per reading: a machine under bursty load."""

    def __init__(self, seed: int) -> None:
        self._random = random.Random(seed)
        self._now = 0.0

    def perf_counter(self) -> float:
        self._now += self._random.uniform(1e-4, 3e-2)
        return self._now


@pytest.fixture(scope="module", params=["setdlm-stdlib-tiny", "nemotron-stdlib-tiny"])
def bundled(request):
    return load_model(request.param)


def _outputs(model, monkeypatch, config) -> list[list[int]]:
    """The output of ``config`` on every machine (each under its own load), and of a decoder's second call."""
    outputs = []
    for index, machine in enumerate(MACHINES):
        monkeypatch.setattr(auto_setup, "cost_model_for", lambda *args, machine=machine, **kwargs: machine)
        monkeypatch.setattr(decoder_module, "time", _LoadedClock(index) if index else decoder_module.time)
        decoder = compose({"model": model, "max_new_tokens": LENGTH, "seed": 3, **config})
        outputs.append(decoder.generate(PROMPT).output_ids)
        if index == 0:  # the same decoder again: nothing learned on the first call may change the second
            outputs.append(decoder.generate(PROMPT).output_ids)
    return outputs


@pytest.mark.parametrize("acceptance", ACCEPTANCE, ids=["greedy", "rejection"])
@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("order", ["ltr", "confidence"])
def test_same_request_same_output_on_any_machine_and_load(bundled, monkeypatch, order, schedule, acceptance):
    if order == "confidence" and bundled.family != "setdlm":
        pytest.skip("only SetDLM verifies in any order")
    outputs = _outputs(bundled, monkeypatch, {"schedule": schedule, "order": order, "acceptance": acceptance})
    assert all(o == outputs[0] for o in outputs), outputs


def test_any_order_output_does_not_follow_the_cost_model(monkeypatch):
    """The trial's case: SetDLM, confidence order, greedy, ``width: "auto"``, machines of different costs."""
    model = load_model("setdlm-stdlib-tiny")
    outputs = _outputs(model, monkeypatch, {"schedule": "packed", "order": "confidence"})
    assert len({tuple(o) for o in outputs}) == 1, outputs


def test_width_auto_with_output_dependent_on_width_never_calibrates(monkeypatch):
    def calibrate(*args, **kwargs):
        raise AssertionError("the machine's cost model was read")

    monkeypatch.setattr(auto_setup, "cost_model_for", calibrate)
    decoder = compose({"model": "setdlm-stdlib-tiny", "order": "confidence", "max_new_tokens": 4})
    assert decoder.schedule.deterministic and decoder.describe()["schedule"]["deterministic"] is True
    assert decoder.schedule.cost == NOMINAL_COST
    decoder.generate(PROMPT)


def test_which_settings_make_the_width_change_the_output():
    from specframe.acceptance.greedy import GreedyAcceptance
    from specframe.acceptance.rejection import RejectionSampling

    class Unsaid(GreedyAcceptance):  # a plugin's subclass: it inherits no exactness
        pass

    class Declared(Unsaid):
        output_depends_on_width = False

    assert not width_changes_output(LeftToRight(), GreedyAcceptance())
    assert width_changes_output(ConfidenceOrder(), GreedyAcceptance())
    assert width_changes_output(LeftToRight(), RejectionSampling())
    assert width_changes_output(LeftToRight(), Unsaid())
    assert not width_changes_output(LeftToRight(), Declared())
