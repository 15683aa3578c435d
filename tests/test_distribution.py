"""Sampling exactness: every schedule's output distribution equals plain AR sampling (Theorem 3.3).

On a tiny vocabulary and short outputs the AR distribution over whole continuations is enumerated exactly
(from cache-free recomputations, with the same temperature / top-k / top-p warp); each schedule is sampled
with many seeds and compared by a chi-square test. The same test is shown to reject two plausible bugs:
verifying a Packed-SS draft against the proposal of the wrong (newer) prefix, and drawing the correction
from a residual without the positive part.
"""

from __future__ import annotations

import itertools
from collections import Counter

import numpy as np
import pytest
import torch
from scipy import stats

from decoding_helpers import FAMILIES, NEMOTRON, SETDLM, conditional_logits, tiny_model
from specframe import compose
from specframe.acceptance.base import Proposals
from specframe.acceptance.rejection import RejectionSampling, SamplingWarp
from specframe.schedules.base import accept_verdict, planned_chain, propose, store_drafts
from specframe.schedules.packed import PackedSchedule

VOCAB = 6  # ids 0-3 ordinary, 4 EOS, 5 mask
PROMPT = [0, 1, 2, 3, 1]
LENGTH = 3
SAMPLES = 2000
PASS = 1e-4  # seeds are fixed, so these are deterministic; the margin guards against platform noise
FAIL = 1e-6

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("dist")
    # Random weights give very peaked outputs; scaling the logits down spreads the mass over many outcomes.
    return {
        NEMOTRON: tiny_model(NEMOTRON, root / "nemotron", vocab=VOCAB, seed=4, logit_scale=0.3),
        SETDLM: tiny_model(SETDLM, root / "setdlm", vocab=VOCAB, seed=5, logit_scale=0.05),
    }


def exact_distribution(model, warp: SamplingWarp) -> dict[tuple[int, ...], float]:
    """Probability of every continuation of PROMPT under AR sampling with ``warp``, EOS and LENGTH stopping."""
    eos = set(model.eos_token_ids)
    out: dict[tuple[int, ...], float] = {}

    def expand(prefix: tuple[int, ...], mass: float) -> None:
        if len(prefix) == LENGTH or (prefix and prefix[-1] in eos):
            out[prefix] = out.get(prefix, 0.0) + mass
            return
        context = list(enumerate(PROMPT + list(prefix)))
        probs = warp.probs(conditional_logits(model, context, len(context))[None])[0].tolist()
        for token, p in enumerate(probs):
            if p > 0:
                expand((*prefix, token), mass * p)

    expand((), 1.0)
    return out


def sample_counts(model, schedule, acceptance, *, width=3) -> Counter:
    decoder = compose(
        {"model": model, "schedule": schedule, "acceptance": acceptance, "width": width, "max_new_tokens": LENGTH}
    )
    return Counter(tuple(decoder.generate(prompt_ids=PROMPT, seed=seed).output_ids) for seed in range(SAMPLES))


def chisquare_pvalue(counts: Counter, exact: dict[tuple[int, ...], float]) -> float:
    assert set(counts) <= set(exact), f"impossible outputs sampled: {set(counts) - set(exact)}"
    total = sum(counts.values())
    big = [seq for seq, p in exact.items() if p * total >= 5]
    assert len(big) >= 4, "the outcome space is too concentrated for a meaningful test"
    observed = [counts.get(seq, 0) for seq in big]
    expected = [exact[seq] * total for seq in big]
    rest_expected = total - sum(expected)
    if rest_expected > 1e-9:
        observed.append(total - sum(observed))
        expected.append(rest_expected)
    expected_arr = np.asarray(expected, dtype=np.float64)
    return stats.chisquare(observed, expected_arr / expected_arr.sum() * total).pvalue


WARPS = {
    "t1": {"name": "rejection", "temperature": 1.0},
    "topk": {"name": "rejection", "temperature": 1.0, "top_k": 2},
    "topp": {"name": "rejection", "temperature": 0.8, "top_p": 0.7},
}
CASES = [(f, s, "t1") for f in FAMILIES for s in ("ar", "linear", "quadratic", "packed", "kbranch")]
CASES += [(f, "packed", w) for f in FAMILIES for w in ("topk", "topp")]


@pytest.mark.parametrize(("family", "schedule", "warp"), CASES)
def test_schedule_samples_the_ar_distribution(models, family, schedule, warp):
    spec = WARPS[warp]
    rule = RejectionSampling(spec["temperature"], spec.get("top_k"), spec.get("top_p"))
    exact = exact_distribution(models[family], rule.warp)
    counts = sample_counts(models[family], schedule, spec)
    assert chisquare_pvalue(counts, exact) > PASS


class StaleProposalBug(PackedSchedule):
    """Packed-SS that divides by the proposal of the newest prefix instead of the one the draft came from."""

    def update(self, state, plan, result):
        ctx = state.ctx
        chain = planned_chain(state, plan)
        fresh = ctx.rule.warp.probs(result.draft_logits[0])
        targets = plan.drafts[0].targets
        swapped = []
        for draft, position in zip(chain, plan.chain_positions, strict=True):
            row = targets.index(position)
            token = torch.tensor([draft.token])
            swapped.append(type(draft)(Proposals(token, fresh[row, token], probs=fresh[row : row + 1]), 0))
        verdict = ctx.rule.verify(tuple(swapped), result.verify_logits, ctx.generator)
        accept_verdict(state, plan, tuple(swapped), verdict)
        store_drafts(state, targets, propose(state, result.draft_logits[0]))


class NoPositivePartBug(RejectionSampling):
    """Rejection sampling whose correction is drawn from |p - q| instead of max(p - q, 0)."""

    def verify(self, drafts, logits, generator):
        verdict = super().verify(drafts, logits, generator)
        if verdict.accepted >= len(drafts):
            return verdict
        target = self.warp.probs(logits)[verdict.accepted]
        proposal = drafts[verdict.accepted].proposals.dense(
            torch.tensor([drafts[verdict.accepted].row]), target.shape[-1]
        )[0]
        residual = (target - proposal.to(target.dtype)).abs()
        token = int(torch.multinomial(residual / residual.sum(), 1, generator=generator))
        return type(verdict)(verdict.accepted, token, verdict.scores)


@pytest.fixture(scope="module")
def peaked_model(tmp_path_factory):
    """Unscaled random logits: proposals depend strongly on their context, so staleness matters."""
    return tiny_model(NEMOTRON, tmp_path_factory.mktemp("peaked"), vocab=VOCAB, seed=3)


def test_the_test_rejects_verifying_against_the_wrong_prefix(peaked_model):
    """Packed-SS is exact only if each draft is checked against the proposal it was drawn from."""
    config = {"model": peaked_model, "schedule": "packed", "acceptance": WARPS["t1"], "width": 3}
    decoder = compose({**config, "max_new_tokens": LENGTH})
    exact = exact_distribution(peaked_model, decoder.rule.warp)
    correct = Counter(tuple(decoder.generate(prompt_ids=PROMPT, seed=s).output_ids) for s in range(3000))
    assert chisquare_pvalue(correct, exact) > PASS
    decoder.schedule = StaleProposalBug()
    buggy = Counter(tuple(decoder.generate(prompt_ids=PROMPT, seed=s).output_ids) for s in range(3000))
    assert chisquare_pvalue(buggy, exact) < FAIL


def test_the_test_rejects_a_residual_without_the_positive_part(models):
    model = models[NEMOTRON]
    decoder = compose(
        {"model": model, "schedule": "packed", "acceptance": WARPS["t1"], "width": 3, "max_new_tokens": LENGTH}
    )
    decoder.rule = NoPositivePartBug(1.0)
    counts = Counter(tuple(decoder.generate(prompt_ids=PROMPT, seed=s).output_ids) for s in range(SAMPLES))
    assert chisquare_pvalue(counts, exact_distribution(model, decoder.rule.warp)) < FAIL


def test_outcome_space_is_small_enough_for_the_test(models):
    for family in FAMILIES:
        exact = exact_distribution(models[family], SamplingWarp(1.0))
        assert abs(sum(exact.values()) - 1.0) < 1e-9
        assert len(exact) <= len(list(itertools.product(range(VOCAB), repeat=LENGTH))) + VOCAB * (VOCAB + 1)
