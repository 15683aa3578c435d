"""Greedy exactness: every speculative schedule reproduces plain AR greedy decoding token for token.

Property-based over both families, all speculative schedules, widths, prompts, output limits, EOS and
multi-token stop sequences, in float64 on the CPU. Plain AR is itself checked against a full recomputation
without any cache, and any-order (confidence) verification against the serial reference of Proposition C.1.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from decoding_helpers import (
    FAMILIES,
    NEMOTRON,
    SETDLM,
    SYNTHETIC_COST,
    conditional_logits,
    eos_ids,
    generate,
    tiny_model,
)
from specframe import batching, compose
from specframe.acceptance.base import Verdict
from specframe.errors import ConfigError
from specframe.ledger import outcome_pairs
from specframe.plan import Guess
from specframe.schedules.base import Schedule

VOCAB = 24
EOS = VOCAB - 2
SPECULATIVE = ("linear", "quadratic", "packed", "kbranch", {"name": "kbranch", "k": 3}, "auto")
# Cost models that push width / schedule "auto" to different corners: rows cheap (wide drafts), rows dear
# (narrow drafts and plain AR calls), and one in between.
COSTS = (
    {"tau": 0.01, "delta": 0.0},
    {"tau": 0.0005, "delta": 0.002},
    {"tau": 0.007, "delta": 0.0002, "host_s": 0.001},
)


def slow_ok(examples: int) -> settings:
    return settings(
        max_examples=examples,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture],
    )


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("exact")
    return {family: tiny_model(family, root / family, vocab=VOCAB, seed=1) for family in FAMILIES}


prompts = st.lists(st.integers(0, EOS - 1), min_size=1, max_size=8)


@slow_ok(160)
@given(
    family=st.sampled_from(FAMILIES),
    schedule=st.sampled_from(SPECULATIVE),
    width=st.one_of(st.integers(1, 6), st.just("auto")),
    prompt=prompts,
    length=st.integers(1, 18),
    use_eos=st.booleans(),
    use_stop=st.booleans(),
    cost=st.sampled_from(COSTS),
)
def test_greedy_speculative_schedules_reproduce_ar(
    models, family, schedule, width, prompt, length, use_eos, use_stop, cost
):
    model = models[family]
    with eos_ids(model, (EOS,) if use_eos else ()):
        reference = generate(model, "ar", prompt, length)
        stop = ()
        if use_stop and len(reference.output_ids) >= 4:
            stop = (tuple(reference.output_ids[2:4]),)  # a two-token marker that does occur
            reference = generate(model, "ar", prompt, length, stop=stop)
        result = generate(model, schedule, prompt, length, width=width, stop=stop, cost=cost)
    assert result.output_ids == reference.output_ids
    assert result.stop_reason == reference.stop_reason
    assert result.metrics.generated_tokens == len(result.output_ids)


@pytest.mark.parametrize("family", FAMILIES)
def test_ar_equals_greedy_full_recomputation_without_cache(models, family):
    model = models[family]
    prompt = [3, 9, 4, 17, 2]
    with eos_ids(model, ()):
        output = generate(model, "ar", prompt, 24).output_ids
    context = list(enumerate(prompt))
    for token in output:
        position = len(context)
        assert int(conditional_logits(model, context, position).argmax()) == token
        context.append((position, token))


class Recorder(Schedule):
    """Wraps a schedule and records, per call, the context and the tokens it accepted (in order)."""

    def __init__(self, inner: Schedule) -> None:
        self.inner = inner
        self.name = inner.name
        self.calls: list[tuple[list[tuple[int, int]], list[tuple[int, int]]]] = []

    def plan(self, state):
        return self.inner.plan(state)

    def update(self, state, plan, result):
        context = [(p, state.token_at(p)) for p in state.generation_order()]
        outcome = self.inner.update(state, plan, result)
        # before EOS / stop pruning, as the serial reference generates them
        accepted = [(p, t) for p, t in outcome_pairs(plan, outcome) if p <= state.end]
        self.calls.append((context, accepted))
        return outcome


@slow_ok(60)
@given(
    schedule=st.sampled_from(("ar", *SPECULATIVE)),
    order=st.sampled_from(("confidence", "ltr")),
    width=st.one_of(st.integers(1, 6), st.just("auto")),
    prompt=prompts,
    length=st.integers(1, 16),
    use_eos=st.booleans(),
)
# Found by hypothesis: EOS accepted at 20, then at 19, in one call; the row kept for 19 had seen the dropped 20
@example(schedule="quadratic", order="confidence", width=4, prompt=[21, 15, 6, 21, 21, 4, 21], length=14, use_eos=True)
def test_any_order_verification_matches_the_serial_reference(models, schedule, order, width, prompt, length, use_eos):
    """Proposition C.1: each accepted token is the greedy any-order conditional given the call's prefix and
    the tokens accepted before it in the same call; the output is what that serial reference produces."""
    model = models[SETDLM]
    with eos_ids(model, (EOS,) if use_eos else ()):
        decoder = compose(
            {
                "model": model,
                "schedule": schedule,
                "order": order,
                "width": "auto" if schedule == "ar" else width,  # ar takes no width
                "max_new_tokens": length,
                "cost": SYNTHETIC_COST,
            }
        )
        recorder = Recorder(decoder.schedule)
        decoder.schedule = recorder
        result = decoder.generate(prompt_ids=prompt)
    for context, accepted in recorder.calls:
        group: list[tuple[int, int]] = []
        for position, token in accepted:
            logits = conditional_logits(model, context + group, position)
            assert int(logits.argmax()) == token, (context, group, position)
            group.append((position, token))
    assert len(result.output_ids) == sum(1 for _ in result.output_ids)


def test_left_to_right_only_family_refuses_other_orders(models):
    with pytest.raises(ConfigError, match="left to right only"):
        compose({"model": models[NEMOTRON], "schedule": "packed", "order": "confidence"})


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("schedule", SPECULATIVE)
def test_the_exactness_tests_see_accepted_drafts(models, family, schedule):
    """The properties above are only meaningful if drafts do get accepted, sometimes several in a row."""
    accepted = []
    with eos_ids(models[family], ()):
        for seed in range(12):
            prompt = [(seed * 7 + i * 5) % EOS for i in range(1 + seed % 6)]
            accepted += [v.accepted for v in generate(models[family], schedule, prompt, 16).metrics.verifications]
    assert max(accepted) >= 2
    assert sum(1 for a in accepted if a) >= 3


def test_edge_cases_one_token_prompt_and_limit_below_width(models):
    for family in FAMILIES:
        with eos_ids(models[family], ()):
            reference = generate(models[family], "ar", [5], 3).output_ids
            for schedule in SPECULATIVE:
                assert generate(models[family], schedule, [5], 3, width=8).output_ids == reference
                assert generate(models[family], schedule, [5], 1, width=8).output_ids == reference[:1]


@pytest.mark.parametrize("mlp_rank", [0, 5], ids=["o_proj", "o_proj+down_proj"])
def test_proposal_only_adapter_changes_drafts_but_never_the_output(tmp_path, mlp_rank):
    """Nemotron's LoRA applies to drafting rows only, so verification (and the output) stays the base model's."""
    from specframe.models import load_model
    from specframe.testing.models import write_random_checkpoint

    folder = write_random_checkpoint(
        NEMOTRON, tmp_path / "lora", seed=1, tokenizer=False, lora_rank=4, lora_mlp_rank=mlp_rank, vocab_size=VOCAB,
        mask_token_id=VOCAB - 1, eos_token_id=EOS, pad_token_id=EOS, bos_token_id=1,
    )  # fmt: skip
    base = load_model(folder, dtype="float64")
    adapted = load_model(folder, dtype="float64", adapter=True)
    assert adapted.has_adapter and not base.has_adapter
    drafted_differently = False
    for prompt in ([3, 4, 5], [7], [1, 2, 9, 12, 4]):
        with eos_ids(base, ()), eos_ids(adapted, ()):
            reference = generate(base, "ar", prompt, 16).output_ids
            for schedule in SPECULATIVE:
                with_adapter = generate(adapted, schedule, prompt, 16)
                without = generate(base, schedule, prompt, 16)
                assert with_adapter.output_ids == reference == without.output_ids
                drafted_differently |= with_adapter.metrics.accept_lengths != without.metrics.accept_lengths
    assert drafted_differently


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("schedule", ["ar", "native", *SPECULATIVE], ids=str)
def test_update_returns_the_verdict_of_its_call(models, family, schedule, monkeypatch):
    """``Schedule.update`` returns its call's verdict (a guess for ``native``), which the ledger records once."""
    # A fixed cost model under which rows are free: with another, "auto" may pick plain AR calls once the tiny
    # model's drafts fail, and accept none.
    config = {"model": models[family], "schedule": schedule, "max_new_tokens": 16, "cost": {"tau": 0.01, "delta": 0.0}}
    config["width"] = "auto" if schedule == "ar" else 4  # ar takes no width
    decoder = compose(config)
    update = type(decoder.schedule).update
    seen = []

    def checked(self, state, plan, result):
        returned = update(self, state, plan, result)
        if schedule == "native" and plan.num_verify == 0:
            assert isinstance(returned, Guess) and returned.pairs
        elif plan.num_verify:
            assert isinstance(returned, Verdict) and 0 <= returned.accepted <= len(plan.chain)
            seen.append(returned.accepted)
        else:
            assert returned is None
        return returned

    monkeypatch.setattr(type(decoder.schedule), "update", checked)  # every request's copy
    accepted = 0
    with eos_ids(models[family], ()):
        for seed in range(3):
            result = decoder.generate(prompt_ids=[(seed * 5 + i) % EOS for i in range(1 + seed)])
            assert result.metrics.accepted_tokens == sum(seen)  # the ledger recorded each verdict once
            accepted += sum(seen)
            seen.clear()
    if schedule not in ("ar", "native"):
        assert accepted  # drafts were accepted, so the check has teeth


# -- batched decoding: each request's output is what it gets decoded alone ------------------------------------------
BATCHED = ("ar", "native", *SPECULATIVE)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("schedule", BATCHED, ids=str)
def test_generate_many_equals_decoding_each_request_alone(models, family, schedule):
    """Prompts of different lengths, limits, EOS and stop sequences ending requests at different steps."""
    config = {"model": models[family], "schedule": schedule, "max_new_tokens": 12, "cost": SYNTHETIC_COST}
    config["stop"] = [[17, 18], [2, 2]]
    if schedule != "ar":
        config["width"] = 4
    prompts = [[1, 2, 3], [7], [5, 9, 11, 2, 8, 13], [4, 4], [20, 1, 6, 3]]
    limits = [12, 12, 9, 4, 7]
    with eos_ids(models[family], (EOS,)):
        alone = [compose(config).generate(prompt_ids=p, max_new_tokens=n) for p, n in zip(prompts, limits, strict=True)]
        for max_batch in (1, 2, 8):
            batched = compose(config).generate_many(prompts, max_new_tokens=limits, max_batch=max_batch)
            assert [g.output_ids for g in batched] == [g.output_ids for g in alone]
            assert [g.stop_reason for g in batched] == [g.stop_reason for g in alone]
            if schedule != "auto":  # auto's choices (not its output) carry over between requests decoded alone
                assert [g.metrics.rows_per_call for g in batched] == [g.metrics.rows_per_call for g in alone]
            for g in batched:
                assert len(g.metrics.batch_rows) == len(g.metrics.call_s) == g.metrics.nfe
                assert sum(g.metrics.call_s) == pytest.approx(g.metrics.model_s)  # each forward's time, once
                assert all(b >= r for b, r in zip(g.metrics.batch_rows, g.metrics.rows_per_call, strict=True))
    if schedule != "native":  # (whose output is not the AR model's)
        assert len({g.stop_reason for g in alone}) == 3  # requests end for every reason, at different steps


@pytest.mark.parametrize("schedule", ["packed", "linear", "auto"])
def test_a_decoder_that_already_decoded_alone_batches_each_request_as_alone(schedule):
    """What a schedule keeps from earlier requests (``auto``'s learned pick) is shared by the batch's copies,
    but each request's own planning state is not: the candidate that planned a call judges its result. The
    bundled model (whose drafts are accepted) and a cost model marked as measured (call times are learned)
    make interleaved requests pick different candidates."""
    cost = {**SYNTHETIC_COST, "source": "calibrated"}
    config = {"model": "nemotron-stdlib-tiny", "schedule": schedule, "width": 8, "max_new_tokens": 24}
    decoder = compose({**config, "cost": cost, "threads": 1})
    prompts = ["def fib(n):", "import os\n", "class Stack:", "x = [", "with open(", "# Return the sum"]
    alone = [decoder.generate(p).output_ids for p in prompts]
    assert [g.output_ids for g in decoder.generate_many(prompts, max_batch=3)] == alone


@pytest.mark.parametrize(
    ("schedule", "order"),
    [("packed", "confidence"), ("quadratic", "confidence"), ("kbranch", "confidence"), ("auto", "ltr")],
)
def test_generate_many_takes_a_width_per_request(models, schedule, order):
    """Mixed widths in one batch (any-order verification, where the width changes the output; under ``auto``
    a request's width is the largest it chooses, and its candidates are the composed decoder's)."""
    widths = [1, 3, 6, 2]
    prompts = [[1, 2, 3], [7, 8], [5, 9, 11], [4]]
    config = {"model": models[SETDLM], "schedule": schedule, "order": order, "max_new_tokens": 10}
    config["cost"] = SYNTHETIC_COST
    alone = [
        compose({**config, "width": w}).generate(prompt_ids=p).output_ids for p, w in zip(prompts, widths, strict=True)
    ]
    batched = compose({**config, "width": 6}).generate_many(prompts, widths=widths, max_batch=3)
    assert [g.output_ids for g in batched] == alone


@slow_ok(40)
@given(
    family=st.sampled_from(FAMILIES),
    schedule=st.sampled_from(BATCHED),
    requests=st.lists(st.tuples(prompts, st.integers(1, 10)), min_size=1, max_size=5),
    use_eos=st.booleans(),
    data=st.data(),
)
def test_any_arrival_and_finish_pattern_gives_each_request_its_own_output(
    models, family, schedule, requests, use_eos, data
):
    """Steppers driven by hand: requests arrive at random steps and sit out random steps; each batch of calls
    runs in one ``forward_many``. Every request's tokens are its tokens decoded alone."""
    config = {"model": models[family], "schedule": schedule, "cost": SYNTHETIC_COST, "max_new_tokens": 10}
    if schedule != "ar":
        config["width"] = data.draw(st.integers(1, 5), label="width")
    with eos_ids(models[family], (EOS, 6) if use_eos else ()):
        alone = [compose(config).generate(prompt_ids=p, max_new_tokens=n).output_ids for p, n in requests]
        decoder = compose(config)
        waiting = [decoder.stepper(prompt_ids=p, max_new_tokens=n) for p, n in requests]
        steppers, active = list(waiting), []
        while waiting or active:
            arrivals = data.draw(st.integers(0 if active else 1, len(waiting)), label="arrivals")
            active += waiting[:arrivals]
            del waiting[:arrivals]
            stepping = [s for s in active if data.draw(st.booleans(), label="steps")] or active[:1]
            calls = [(s, s.prepare()) for s in stepping]
            outputs, seconds, rows = batching.forward(decoder.model, calls, decoder.sync)
            for (stepper, _), logits in zip(calls, outputs, strict=True):
                stepper.finish(logits, seconds, rows)
            active = [s for s in active if not s.done]
    assert [s.result().output_ids for s in steppers] == alone
