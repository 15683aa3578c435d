"""Sampling exactness: every schedule's output distribution is plain AR sampling's (Theorem 3.3).

The main model is :class:`~sampling_models.TableModel`: five ids (three ordinary tokens, EOS, the mask), both
families' conventions, and a drafter whose proposals change completely with the context they are drawn
from. The exact distribution of its first four output tokens (121 outcomes) is enumerated by plain AR
forward passes over all prefixes, with the same temperature / top-k / top-p warp; each schedule is sampled
with 2,000 seeds and compared by a chi-square goodness-of-fit test.

The same test must reject planted bugs (:mod:`planted_bugs`) by a wide margin, so that the verdict does not
hang on the random stream: on four streams of 2,000 seeds each, every bug gave p < 1e-17 (seed reuse, the
subtlest, 1e-18 to 1e-34; another group's proposal on SetDLM 1e-106 to 1e-186; an unnormalised residual
1e-197 to 1e-259), against a rejection threshold of 1e-8.
The slow variant checks a second stream in CI. The correct cases pass at 1e-5 with fixed seeds.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import numpy
import pytest

from decoding_helpers import conditional_logits, tiny_model
from planted_bugs import OtherGroupsProposalBug, ReferenceRejection, StaleProposalBug
from sampling_models import NEMOTRON, SETDLM, TableModel, exact_distribution, gof_pvalue, sample_counts
from specframe import compose
from specframe.acceptance import hostsample
from specframe.acceptance.rejection import SamplingWarp
from specframe.schedules.packed import PackedSchedule
from specframe.schedules.quadratic import QuadraticSchedule

FAMILIES = (NEMOTRON, SETDLM)
PROMPT = [0, 1, 2]
LENGTH = 4
WIDTH = 3
SAMPLES = 2000
PASS = 1e-5  # seeds are fixed, so the correct cases are deterministic; the margin absorbs stream changes
FAIL = 1e-8
TABLE_SEEDS = {NEMOTRON: 3, SETDLM: 5}

WARPS: dict[str, dict[str, Any]] = {
    "t1": {"name": "rejection", "temperature": 1.0},
    "topk": {"name": "rejection", "temperature": 1.0, "top_k": 2},
    "topp": {"name": "rejection", "temperature": 0.8, "top_p": 0.7},
    "topkp": {"name": "rejection", "temperature": 0.8, "top_k": 3, "top_p": 0.7},
}


def _warp(name: str) -> SamplingWarp:
    spec = WARPS[name] if name != "topk3" else {**WARPS["topk"], "top_k": 3}
    return SamplingWarp(spec["temperature"], spec.get("top_k"), spec.get("top_p"))


@pytest.fixture(scope="module")
def models():
    return {family: TableModel(family, seed=TABLE_SEEDS[family]) for family in FAMILIES}


def _pvalue(model, schedule, acceptance, warp: str, *, first_seed: int = 0, width: int = WIDTH) -> float:
    decoder = compose(
        {
            "model": model,
            "schedule": schedule if isinstance(schedule, (str, dict)) else "packed",
            "acceptance": acceptance if isinstance(acceptance, (str, dict)) else "rejection",
            "width": "auto" if schedule == "ar" else width,  # ar takes no width
            "max_new_tokens": LENGTH,
        }
    )
    if not isinstance(schedule, (str, dict)):
        decoder.schedule = schedule
    if not isinstance(acceptance, (str, dict)):
        decoder.rule = acceptance
    counts = sample_counts(lambda s: decoder.generate(prompt_ids=PROMPT, seed=s).output_ids, SAMPLES, first_seed)
    return gof_pvalue(counts, exact_distribution(model, PROMPT, LENGTH, _warp(warp)))


# -- the production sampler, every schedule -----------------------------------------------------------------------
CASES = [(f, s, "t1") for f in FAMILIES for s in ("ar", "linear", "quadratic", "packed", "kbranch")]
CASES += [(f, "packed", w) for f in FAMILIES for w in ("topk", "topp", "topkp")]
# top-k and top-p on the host: every rule method
CASES += [(f, s, w) for f in FAMILIES for s in ("ar", "linear") for w in ("topk", "topp")]
SLOW_CASES = [(f, "quadratic", w) for f in FAMILIES for w in ("topk", "topp")] + [(SETDLM, "kbranch", "topp")]


@pytest.mark.parametrize(("family", "schedule", "warp"), CASES)
def test_schedule_samples_the_ar_distribution(models, family, schedule, warp):
    assert _pvalue(models[family], schedule, WARPS[warp], warp) > PASS


@pytest.mark.slow
@pytest.mark.parametrize(("family", "schedule", "warp"), SLOW_CASES)
def test_multi_group_schedules_sample_the_truncated_distributions(models, family, schedule, warp):
    assert _pvalue(models[family], schedule, WARPS[warp], warp) > PASS


def test_the_reference_sampler_is_exact(models):
    """The planted bugs below are one change each to this sampler, so it must pass where they fail."""
    assert _pvalue(models[NEMOTRON], "packed", ReferenceRejection(), "t1") > PASS
    assert _pvalue(models[SETDLM], "quadratic", ReferenceRejection(top_k=2), "topk") > PASS


# -- planted bugs -------------------------------------------------------------------------------------------------
# name -> (family, schedule, acceptance rule, warp of the exact distribution); rule bugs do not depend on the
# family, so each runs on one; schedule bugs run on both.
BUGS: dict[str, tuple[str, Callable[[], Any], Callable[[], Any], str]] = {
    "unnormalised-residual": (NEMOTRON, PackedSchedule, lambda: ReferenceRejection(bug="unnormalised-residual"), "t1"),
    "residual-without-positive-part": (
        SETDLM,
        PackedSchedule,
        lambda: ReferenceRejection(bug="residual-without-positive-part"),
        "t1",
    ),
    "top-k-drafter-only": (
        SETDLM,
        QuadraticSchedule,
        lambda: ReferenceRejection(top_k=2, bug="top-k-drafter-only"),
        "topk",
    ),
    "seed-reuse": (NEMOTRON, PackedSchedule, lambda: ReferenceRejection(bug="seed-reuse"), "t1"),
}
for _family in FAMILIES:
    BUGS[f"other-groups-proposal-{_family}"] = (_family, OtherGroupsProposalBug, ReferenceRejection, "t1")
    BUGS[f"stale-proposal-{_family}"] = (_family, StaleProposalBug, ReferenceRejection, "t1")


@pytest.mark.parametrize("bug", sorted(BUGS))
def test_the_suite_rejects_a_planted_bug(models, bug):
    family, schedule, rule, warp = BUGS[bug]
    assert _pvalue(models[family], schedule(), rule(), warp) < FAIL


@pytest.mark.slow
@pytest.mark.parametrize("stream", [1])
@pytest.mark.parametrize("bug", sorted(BUGS))
def test_planted_bugs_are_rejected_on_other_random_streams(models, bug, stream):
    family, schedule, rule, warp = BUGS[bug]
    assert _pvalue(models[family], schedule(), rule(), warp, first_seed=100_000 * stream) < FAIL


@pytest.mark.parametrize(("warp", "path"), [("topk", "top_k_candidates"), ("topp", "top_p_candidates")])
def test_host_and_dense_paths_mix_exactly(models, monkeypatch, warp, path):
    """Calls alternate between the host path and the dense one (as a tie at the k-th logit or NaN logits make
    them): proposals drawn by one path are verified by the other, and the output is still AR sampling's."""
    original = getattr(hostsample, path)
    calls = Counter()

    def every_other(*args, **kwargs):
        calls["all"] += 1
        return original(*args, **kwargs) if calls["all"] % 2 else None

    monkeypatch.setattr(hostsample, path, every_other)
    for family in FAMILIES:
        assert _pvalue(models[family], "packed", WARPS[warp], warp) > PASS
    assert calls["all"] > 2 * SAMPLES


def test_the_suite_rejects_a_bug_planted_in_the_host_top_k_path(models, monkeypatch):
    """The host path's correction drawn from p instead of the residual max(p - q, 0): rejected."""
    monkeypatch.setattr(hostsample, "_residual", lambda p, q: p)
    assert _pvalue(models[NEMOTRON], "packed", {**WARPS["topk"], "top_k": 3}, "topk3") < FAIL


def test_the_suite_rejects_a_bug_planted_in_the_host_nucleus(models, monkeypatch):
    """The host nucleus without its crossing token (the mass up to a token, not before it, compared with
    top_p), in verifier and drafter alike: rejected, though every draft is verified consistently."""
    original = hostsample.host_nucleus

    def without_crossing(probs, top_p, ids=None):
        ids, kept = original(probs, top_p, ids)
        counts = (kept > 0).sum(1)
        rows = numpy.flatnonzero(counts > 1)
        kept[rows, counts[rows] - 1] = 0
        return ids, kept

    monkeypatch.setattr(hostsample, "host_nucleus", without_crossing)
    assert _pvalue(models[SETDLM], "packed", WARPS["topp"], "topp") < FAIL


@pytest.mark.parametrize("warp", ["topk", "topp", "topkp"])
def test_a_seed_reproduces_its_output_whatever_ran_before(models, warp):
    """Whether a call takes the host or the dense path depends on its own logits only: one seed, one output."""
    decoder = compose(
        {"model": models[SETDLM], "schedule": "packed", "acceptance": WARPS[warp], "width": WIDTH, "max_new_tokens": 8}
    )
    first = [decoder.generate(prompt_ids=PROMPT, seed=s).output_ids for s in range(20)]
    again = [decoder.generate(prompt_ids=PROMPT, seed=s).output_ids for s in reversed(range(20))][::-1]
    assert first == again and len({tuple(x) for x in first}) > 3


# -- the outcome space ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("warp", sorted(WARPS))
def test_the_outcome_space_supports_the_test(models, family, warp):
    exact = exact_distribution(models[family], PROMPT, LENGTH, _warp(warp))
    assert sum(exact.values()) == pytest.approx(1.0, abs=1e-12)
    cells = [p for p in exact.values() if p * SAMPLES >= 5]
    assert len(cells) >= (30 if warp == "t1" else 6), "too concentrated for a goodness-of-fit test with power"
    if warp == "t1":
        assert any(len(seq) < LENGTH for seq in exact), "EOS must be reachable, so early stops are tested too"


def test_the_exact_distribution_matches_the_models_own_calls(models):
    """The enumeration reads the same verifier rows a decoder's call would: one AR step, two ways."""
    model = models[SETDLM]
    warp = _warp("t1")
    exact = exact_distribution(model, PROMPT, 1, warp)
    first = warp.probs(model.verifier_logits(PROMPT)[None])[0]
    for (token,), p in exact.items():
        assert p == pytest.approx(float(first[token]), abs=1e-12)


@pytest.mark.parametrize(
    ("family", "schedule", "learning", "delta"),
    [
        (NEMOTRON, "auto", True, 0.0004),
        (SETDLM, "packed", True, 0.0004),
        (SETDLM, "auto", True, 0.0004),
        (NEMOTRON, "auto", False, 0.0003),
    ],
    ids=["nemotron-auto-learning", "setdlm-packed-learning", "setdlm-auto-learning", "nemotron-auto-per-request"],
)
def test_choices_per_call_sample_the_ar_distribution(models, family, schedule, learning, delta):
    """Width / schedule "auto" switch between AR calls and drafting candidates with the acceptance seen so far
    (so the plan of a call depends on earlier random outcomes), and the output still follows AR sampling.

    Under sampling ``compose`` makes the choice per request (``deterministic``: the tokens a seed gives must
    not depend on earlier requests); ``learning`` turns that off, so that acceptance learned from earlier
    requests' random outcomes steers later plans (as under greedy decoding), which must stay exact too.
    """
    decoder = compose(
        {
            "model": models[family],
            "schedule": schedule,
            "acceptance": WARPS["t1"],
            "width": "auto",
            "max_new_tokens": LENGTH,
            "cost": {"tau": 0.002, "delta": delta},  # rows dear enough that AR calls win some of the time
        }
    )
    assert decoder.schedule.deterministic
    decoder.schedule.deterministic = not learning
    chosen: Counter = Counter()

    def generate(seed: int) -> list[int]:
        result = decoder.generate(prompt_ids=PROMPT, seed=seed)
        chosen.update(result.metrics.schedule_histogram())
        return result.output_ids

    counts = sample_counts(generate, SAMPLES)
    assert chosen["ar"] > 0 and len(chosen) >= 2, chosen
    assert gof_pvalue(counts, exact_distribution(models[family], PROMPT, LENGTH, _warp("t1"))) > PASS


# -- real (tiny, random) networks ---------------------------------------------------------------------------------
REAL_VOCAB = 6  # ids 0-3 ordinary, 4 EOS, 5 mask
REAL_PROMPT = [0, 1, 2, 3, 1]


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("schedule", ["quadratic", "packed"])
def test_real_networks_sample_the_ar_distribution(tmp_path_factory, family, schedule):
    """The transformer families themselves, with flattened logits (many outcomes, many accepted drafts)."""
    scale = {NEMOTRON: 0.3, SETDLM: 0.05}[family]
    model = tiny_model(family, tmp_path_factory.mktemp(family), vocab=REAL_VOCAB, seed=4, logit_scale=scale)
    decoder = compose(
        {"model": model, "schedule": schedule, "acceptance": WARPS["t1"], "width": WIDTH, "max_new_tokens": 3}
    )
    counts = sample_counts(lambda s: decoder.generate(prompt_ids=REAL_PROMPT, seed=s).output_ids, SAMPLES)
    exact = exact_distribution(
        model, REAL_PROMPT, 3, _warp("t1"), lambda ids: conditional_logits(model, list(enumerate(ids)), len(ids))
    )
    assert gof_pvalue(counts, exact) > PASS


# -- batched decoding -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("schedule", ["ar", "linear", "quadratic", "packed", "kbranch", "auto", "native"])
@pytest.mark.parametrize("warp", ["t1", "topkp"])
def test_a_batched_request_samples_the_tokens_its_seed_gives_alone(models, family, schedule, warp):
    """Every request has its own generator: in a batch, a seed gives the tokens it gives decoded alone."""
    config = {"model": models[family], "schedule": schedule, "acceptance": WARPS[warp], "max_new_tokens": LENGTH}
    config["width"] = "auto" if schedule in ("ar", "auto") else WIDTH
    config["cost"] = {"tau": 0.007, "delta": 0.0002, "host_s": 0.001}
    seeds = list(range(40))
    limits = [1 + s % LENGTH for s in seeds]  # requests finish at different steps
    prompts = [PROMPT[: 1 + s % 3] for s in seeds]
    alone = [
        compose(config).generate(prompt_ids=p, seed=s, max_new_tokens=n).output_ids
        for p, s, n in zip(prompts, seeds, limits, strict=True)
    ]
    batched = compose(config).generate_many(prompts, seeds=seeds, max_new_tokens=limits, max_batch=7)
    assert [g.output_ids for g in batched] == alone
    assert len({tuple(x) for x in alone}) > 10  # the seeds sample different outputs


@pytest.mark.parametrize("family", FAMILIES)
def test_batched_packed_ss_samples_the_ar_distribution(models, family):
    decoder = compose(
        {"model": models[family], "schedule": "packed", "acceptance": WARPS["t1"], "width": WIDTH, "max_new_tokens": 4}
    )
    results = decoder.generate_many([PROMPT] * SAMPLES, seeds=list(range(SAMPLES)), max_batch=32)
    counts = Counter(tuple(g.output_ids) for g in results)
    assert gof_pvalue(counts, exact_distribution(models[family], PROMPT, LENGTH, _warp("t1"))) > PASS
