"""The public exact-AR reference for plugin authors' sampling tests (specframe.testing.reference)."""

from __future__ import annotations

from collections import Counter

import pytest

from decoding_helpers import tiny_model
from sampling_models import NEMOTRON, SETDLM, TableModel, exact_distribution
from specframe import compose, hookimpl
from specframe.acceptance.base import Verdict
from specframe.acceptance.rejection import RejectionSampling, SamplingWarp
from specframe.plugins import plugin_registered
from specframe.testing.reference import ar_distribution, goodness_of_fit

PROMPT = [0, 1, 2]


@pytest.mark.parametrize(("family", "seed"), [(NEMOTRON, 3), (SETDLM, 5)])
@pytest.mark.parametrize("warp", [SamplingWarp(), SamplingWarp(0.8, 2, 0.7)], ids=["t1", "truncated"])
def test_the_family_layout_gives_the_suites_hand_written_forward(family, seed, warp):
    # The suite's reference feeds the TableModel a causal forward written by hand (tests/sampling_models.py).
    model = TableModel(family, seed=seed)
    assert ar_distribution(model, PROMPT, 4, warp) == exact_distribution(model, PROMPT, 4, warp)


class _AcceptsEverything(RejectionSampling):
    """Not exact: every draft is accepted, so the output follows the drafter, not the verifier."""

    def verify(self, drafts, logits, generator):
        verdict = super().verify((), logits[len(drafts) :][:1], generator) if len(drafts) < len(logits) else None
        return Verdict(len(drafts), None if verdict is None else verdict.token, logits.amax(-1))


class _Plugin:
    @hookimpl
    def register_acceptance_rules(self, register):
        register("accepts-everything", _AcceptsEverything)


@pytest.mark.parametrize("family", [NEMOTRON, SETDLM])
def test_a_real_network_passes_when_exact_and_fails_when_not(family, tmp_path):
    model = tiny_model(family, tmp_path, vocab=6, seed=4, logit_scale=0.3)  # flat: many outputs, many drafts
    model.eos_token_ids = ()  # every output has 3 tokens, so that drafts decide them
    exact = ar_distribution(model, PROMPT, 3)
    assert abs(sum(exact.values()) - 1) < 1e-12 and len(exact) >= 5**3  # (the mask id may be ruled out)

    def counts(acceptance, samples):
        decoder = compose(
            {"model": model, "schedule": "packed", "acceptance": acceptance, "width": 3, "max_new_tokens": 3}
        )
        return Counter(tuple(decoder.generate(prompt_ids=PROMPT, seed=s).output_ids) for s in range(samples))

    assert goodness_of_fit(counts("rejection", 1500), exact) > 1e-4
    with plugin_registered(_Plugin(), "not_exact"):
        assert goodness_of_fit(counts("accepts-everything", 1000), exact) < 1e-8


def test_an_output_the_model_cannot_produce_fails_outright():
    assert goodness_of_fit({(1,): 5, (9,): 1}, {(1,): 0.5, (2,): 0.5}) == 0.0


def test_a_distribution_with_one_likely_output_is_refused_rather_than_a_nan():
    with pytest.raises(ValueError, match="can tell nothing"):
        goodness_of_fit({(1,): 100}, {(1,): 1.0})
