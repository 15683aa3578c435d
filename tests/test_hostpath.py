"""The host path of the decoding loop: layout templates, one host read per call, device-side sampling."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats

import specframe.acceptance.select as select
import specframe.hostread as hostread
from decoding_helpers import NEMOTRON, SETDLM, eos_ids, tiny_model
from specframe import compose
from specframe.acceptance.base import DraftRef, Proposals, Verdict
from specframe.acceptance.greedy import GreedyAcceptance
from specframe.acceptance.rejection import RejectionSampling, sample_rows
from specframe.errors import InputError
from specframe.models.base import ModelCall
from specframe.plan import CallPlan, DraftGroup

PROMPT = [3, 5, 7, 9, 11, 2]
SAMPLING = {"name": "rejection", "temperature": 1.0, "top_k": 8}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("hostpath")
    return {f: tiny_model(f, root / f, vocab=24, seed=3, dtype="float64") for f in (NEMOTRON, SETDLM)}


def _decoder(model, schedule, *, order="ltr", acceptance="greedy", width=4, length=40):
    config = {"model": model, "schedule": schedule, "order": order, "acceptance": acceptance}
    width = "auto" if schedule == "ar" else width  # ar takes no width
    return compose({**config, "width": width, "max_new_tokens": length, "seed": 0})


def _same_call(templated, fresh, vocab):
    for name in ("input_ids", "position_ids", "attention", "output_rows", "verify_rows"):
        assert torch.equal(getattr(templated, name), getattr(fresh, name)), name
    assert len(templated.draft_rows) == len(fresh.draft_rows)
    assert all(torch.equal(a, b) for a, b in zip(templated.draft_rows, fresh.draft_rows, strict=True))
    assert templated.commit_rows == fresh.commit_rows
    assert (templated.adapter_rows is None) == (fresh.adapter_rows is None)
    if fresh.adapter_rows is not None:
        assert torch.equal(templated.adapter_rows, fresh.adapter_rows)
    logits = torch.randn(fresh.output_rows.shape[0], vocab, dtype=torch.float64)
    return logits


@pytest.mark.parametrize(
    ("family", "schedule", "order"),
    [
        (NEMOTRON, "packed", "ltr"),
        (NEMOTRON, "linear", "ltr"),
        (NEMOTRON, "quadratic", "ltr"),
        (SETDLM, "packed", "confidence"),
        (SETDLM, "linear", "confidence"),
        (SETDLM, "quadratic", "ltr"),
    ],
)
def test_templated_calls_equal_fresh_layouts(models, family, schedule, order):
    """Every call the decoder makes from a template is exactly the family's fresh layout of the same plan."""
    model = models[family]
    decoder = _decoder(model, schedule, order=order, acceptance=SAMPLING)
    builder = decoder.builder
    original = builder.physical
    seen = {"templated": 0, "calls": 0}

    def checked_physical(plan):
        call = original(plan)
        fresh = builder.build(plan)
        logits = _same_call(call, fresh, model.vocab_size)
        mine, theirs = builder.read(call, logits), builder.read(fresh, logits)
        assert torch.equal(mine.verify_logits, theirs.verify_logits)
        assert all(torch.equal(a, b) for a, b in zip(mine.draft_logits, theirs.draft_logits, strict=True))
        seen["templated"] += call.checked
        seen["calls"] += 1
        return call

    builder.physical = checked_physical
    with eos_ids(model, ()):
        for seed in range(3):
            decoder.generate(prompt_ids=PROMPT, seed=seed)
    assert seen["templated"] >= seen["calls"] - 3  # all but the prompt calls
    # Far fewer layouts were built than calls made: shapes repeat.
    assert len(builder._templates.templates) < seen["calls"] / 2


def test_setdlm_shares_one_template_across_verification_orders(models):
    builder = _decoder(models[SETDLM], "packed", order="confidence").builder
    for order in [(10, 11, 12), (12, 10, 11), (11, 12, 10)]:
        plan = CallPlan(((9, 4),), order, (5, 6), 3, (DraftGroup(0, (10, 11, 12)),), 3)
        _same_call(builder.physical(plan), builder.build(plan), 24)
    assert len(builder._templates.templates) == 1


def test_templated_calls_validate_tokens_and_positions_on_the_host(models):
    model = models[NEMOTRON]
    builder = _decoder(model, "packed").builder

    def plan(base, chain):
        order = (base + 1, base + 2, base + 3)
        return CallPlan(((base, 4),), order, chain, len(chain) + 1, (DraftGroup(0, order),), 3)

    assert builder.physical(plan(10, (5, 6))).checked
    with pytest.raises(InputError, match="outside the model's vocabulary"):
        builder.physical(plan(10, (5, model.vocab_size)))
    with pytest.raises(InputError, match="outside the model's context"):
        builder.physical(plan(model.max_positions - 1, (5, 6)))


@pytest.fixture
def host_reads(monkeypatch):
    """Counts host reads of tensors: one per ``host_lists`` call, one per direct tolist/item/int/float/bool."""
    count = {"reads": 0, "inside": False}
    original_lists = hostread.host_lists

    def counted_lists(tensors):
        count["reads"] += 1
        count["inside"] = True
        try:
            return original_lists(tensors)
        finally:
            count["inside"] = False

    monkeypatch.setattr(hostread, "host_lists", counted_lists)
    for name in ("tolist", "item", "__int__", "__float__", "__bool__", "__index__", "numpy", "cpu"):
        method = getattr(torch.Tensor, name)

        def counted(self, *args, _method=method, **kwargs):
            if not count["inside"]:
                count["reads"] += 1
            return _method(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, counted)
    return count


@pytest.mark.parametrize("family", [NEMOTRON, SETDLM])
@pytest.mark.parametrize("schedule", ["packed", "linear", "ar"])
@pytest.mark.parametrize("acceptance", ["greedy", "sampling"])
def test_at_most_one_host_read_per_call(models, host_reads, monkeypatch, family, schedule, acceptance):
    """Once a request's layouts exist, each call reads the device once (the prompt call: once more, to validate).

    Checked on the path every device takes: without numpy's host argmax, which reads CPU logits in place
    (a read, but no synchronisation: it exists on the CPU only).
    """
    monkeypatch.setattr(select, "numpy", None)
    model = models[family]
    rule = SAMPLING if acceptance == "sampling" else "greedy"
    decoder = _decoder(model, schedule, order="confidence" if family == SETDLM else "ltr", acceptance=rule)
    with eos_ids(model, ()):
        decoder.generate(prompt_ids=PROMPT)  # lays out this request's shapes
        host_reads["reads"] = 0
        generation = decoder.generate(prompt_ids=PROMPT)
    assert generation.metrics.nfe > 10
    assert host_reads["reads"] <= generation.metrics.nfe + 1


def test_read_together_reads_many_results_in_one_transfer(monkeypatch):
    calls = []
    original = hostread.host_lists
    monkeypatch.setattr(hostread, "host_lists", lambda tensors: calls.append(len(tensors)) or original(tensors))
    proposals = Proposals(tokens=torch.tensor([4, 2]), scores=torch.tensor([0.5, 0.25]))
    verdict = Verdict.deferred((torch.tensor([7, 1]),), lambda values: (values[0][1], values[0][0]), torch.ones(2))
    hostread.read_together(verdict, proposals, None)
    assert calls == [3]
    assert (verdict.accepted, verdict.token) == (1, 7)
    assert proposals.token_list == [4, 2] and proposals.score_list == [0.5, 0.25]
    hostread.read_together(verdict, proposals)  # already read: nothing to transfer
    assert calls == [3]


def test_sample_rows_follows_the_weights_and_never_draws_a_zero_weight():
    weights = torch.tensor([0.0, 0.2, 0.0, 0.5, 0.3, 0.0], dtype=torch.float64).repeat(30000, 1)
    draws = sample_rows(weights, torch.Generator().manual_seed(0)).squeeze(-1)
    counts = np.bincount(draws.numpy(), minlength=6)
    assert counts[[0, 2, 5]].sum() == 0
    expected = np.array([0.2, 0.5, 0.3]) * len(draws)
    assert stats.chisquare(counts[[1, 3, 4]], expected).pvalue > 1e-3
    # Unnormalised rows of different mass work alike.
    scaled = sample_rows(torch.tensor([[0.0, 3.0], [7.0, 0.0]]), torch.Generator().manual_seed(1))
    assert scaled.squeeze(-1).tolist() == [1, 0]


@pytest.mark.parametrize("rule_class", [GreedyAcceptance, RejectionSampling])
def test_a_rule_subclass_overriding_verify_is_used_by_packed(models, rule_class):
    """Packed-SS's one-pass step must not bypass a subclass's own verify (or propose)."""
    calls = []

    class Recording(rule_class):
        def verify(self, drafts, logits, generator):
            calls.append(len(drafts))
            return super().verify(drafts, logits, generator)

    decoder = _decoder(models[NEMOTRON], "packed", acceptance=SAMPLING if rule_class is RejectionSampling else "greedy")
    decoder.rule = Recording()
    generation = decoder.generate(prompt_ids=PROMPT)
    assert len(calls) == generation.metrics.nfe


def test_a_checked_call_skips_only_the_value_check(models, host_reads):
    model = models[NEMOTRON]
    rows = 3
    args = (torch.tensor([3, 4, 5]), torch.tensor([0, 1, 2]), torch.ones(rows, rows, dtype=torch.bool).tril())
    model.forward(model.new_cache(8), ModelCall(*args))
    assert host_reads["reads"] == 1  # the value check's one read
    model.forward(model.new_cache(8), ModelCall(*args, checked=True))
    assert host_reads["reads"] == 1
    bad = (torch.tensor([3, 4, model.vocab_size]), *args[1:])
    with pytest.raises(InputError, match="outside the model's vocabulary"):
        model.forward(model.new_cache(8), ModelCall(*bad, checked=False))
    with pytest.raises(InputError, match="attention must be"):  # shapes still checked
        model.forward(
            model.new_cache(8), ModelCall(*args[:2], torch.ones(rows, rows + 1, dtype=torch.bool), checked=True)
        )


@pytest.mark.parametrize("top_k", [None, 6])
def test_vectorised_rejection_accepts_at_the_exact_rate_and_emits_p(top_k):
    """One draft d ~ q (the rule's own proposal) verified against p: P(accept) = sum min(p, q), output ~ p.

    Runs the rule's one-pass step (``propose_and_verify``), which draws the verifier's token and the next
    proposal together, so a bias in either draw or in the acceptance test shows up here.
    """
    rule = RejectionSampling(1.0, top_k)
    generator = torch.Generator().manual_seed(7)
    logits = torch.randn(3, 12, generator=torch.Generator().manual_seed(11), dtype=torch.float64)
    p, q = rule.warp.probs(logits[:1])[0], rule.warp.probs(logits[2:])[0]
    trials, accepted = 6000, 0
    emitted = np.zeros(12)
    draft = rule.propose(logits[2:], generator)
    for _ in range(trials):
        proposals, verdict = rule.propose_and_verify((DraftRef(draft, 0),), logits, 2, generator)
        accepted += verdict.accepted
        emitted[draft.token_list[0] if verdict.accepted else verdict.token] += 1
        draft = proposals  # the next trial's draft: drawn by the one-pass step from the same q
    rate = float(torch.minimum(p, q).sum())
    assert abs(accepted / trials - rate) < 4 * (rate * (1 - rate) / trials) ** 0.5
    support = p.numpy() > 0
    assert emitted[~support].sum() == 0
    assert stats.chisquare(emitted[support], p.numpy()[support] * trials).pvalue > 1e-3
