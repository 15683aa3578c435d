"""The engine's batching interface: requests admitted and retired between steps, any Batch implementation."""

from __future__ import annotations

import asyncio
import json

import pytest
from serve_helpers import acceptance, expected_text, offline

from specframe.batching import Batch
from specframe.serve.builder import decoder_factory
from specframe.serve.engine import Engine
from specframe.serve.protocol import DecodeOptions, Job

GREEDY = DecodeOptions(json.dumps("packed"), json.dumps("ltr"), json.dumps("greedy"), 4)


class CountingBatch(Batch):
    """The engine core's batch, recording how many requests each step advanced."""

    def __init__(self, pool=None) -> None:
        super().__init__(pool)
        self.sizes: list[int] = []

    def step(self):
        self.sizes.append(len(self))
        return super().step()


def _run(engine, jobs, *, hold_first=False):
    async def main():
        loop = asyncio.get_running_loop()
        if hold_first:
            with engine.hold():
                submissions = [engine.submit(job, loop) for job in jobs]
        else:
            submissions = [engine.submit(job, loop) for job in jobs]
        results = []
        for submission in submissions:
            while (event := await submission.next()).kind not in ("done", "error"):
                pass
            results.append(event)
        return results

    engine.start()
    try:
        return asyncio.run(main())
    finally:
        engine.close()


def _jobs(model, prompts, max_tokens=8):
    return [Job("completion", model.encode_prompt(p), GREEDY, max_tokens, None, stream=True) for p in prompts]


PROMPTS = ["def fib(n):", "import os\n", "class Stack:", "x = [", "with open(", "# Return the sum"]


def test_requests_beyond_the_batch_are_admitted_as_others_retire(served_model):
    batch = CountingBatch()
    engine = Engine(decoder_factory(served_model, threads=1, max_tokens=64), max_active=2, batch=batch)
    results = _run(engine, _jobs(served_model, PROMPTS), hold_first=True)
    assert max(batch.sizes) == 2 and batch.sizes[0] == 2  # never more than max_active in one step
    for prompt, event in zip(PROMPTS, results, strict=True):
        assert event.kind == "done"
        expected = offline(served_model, served_model.encode_prompt(prompt), max_tokens=8)
        assert event.generation.output_ids == expected.output_ids
        assert expected_text(served_model, event.generation) == expected_text(served_model, expected)
    assert engine.decoders.composed == 1  # one decoder serves every request with the same options


def test_one_step_advances_every_admitted_request(served_model):
    batch = CountingBatch()
    engine = Engine(decoder_factory(served_model, threads=1, max_tokens=64), max_active=16, batch=batch)
    results = _run(engine, _jobs(served_model, PROMPTS), hold_first=True)
    assert batch.sizes[0] == len(PROMPTS)  # admitted together, stepped together
    assert all(event.kind == "done" for event in results)


def test_a_request_the_decoder_refuses_fails_alone(served_model):
    engine = Engine(decoder_factory(served_model, threads=1, max_tokens=64), max_active=4)
    too_long = Job("completion", [1] * 10, GREEDY, served_model.max_positions + 5, None)
    results = _run(engine, [*_jobs(served_model, PROMPTS[:2]), too_long])
    assert [event.kind for event in results] == ["done", "done", "error"]
    assert results[2].error.status == 400 and "context" in results[2].error.message


def test_the_output_room_the_server_grants_is_exactly_what_the_decoder_accepts(served_model):
    """A chat request without max_tokens gets the room its prompt leaves: not one token more than
    ``fits_context`` allows (it would be refused only after queueing) and not one less."""
    from specframe.decoder import fits_context
    from specframe.serve.protocol import Limits, check_length

    context = served_model.max_positions + 1
    for prompt in (context - 1, context - 5):
        job = Job("chat", [1] * prompt, GREEDY, 10_000, None)
        check_length(job, context, Limits(max_prompt_tokens=context, max_tokens=10_000), False, "max_tokens")
        assert fits_context(prompt, job.max_tokens, served_model)
        assert not fits_context(prompt, job.max_tokens + 1, served_model)


def test_a_request_cancelled_while_it_is_admitted_is_retired_before_it_decodes(served_model):
    """The client goes away while the engine composes its decoder (it is then neither waiting nor active)."""
    from serve_helpers import wait_for

    factory, submissions = decoder_factory(served_model, threads=1, max_tokens=64), []

    def composing(options):
        submissions[0].cancel()  # the disconnect arrives mid-admission
        return factory(options)

    engine = Engine(composing, max_active=4)
    engine.start()
    try:

        async def submit():
            submissions.append(engine.submit(_jobs(served_model, ["def fib(n):"], max_tokens=60)[0], loop))

        loop = asyncio.new_event_loop()
        loop.run_until_complete(submit())
        wait_for(lambda: engine.metrics.value("specframe_requests_finished_total", finish_reason="cancelled") == 1,
                 "the cancelled request to be retired")  # fmt: skip
        assert engine.active_count == 0 and len(engine.batch) == 0
        assert engine.metrics.value("specframe_generation_tokens_total") == 0
    finally:
        engine.close()
        loop.close()


def test_concurrent_sampled_requests_with_width_auto_each_give_their_output_alone(served_model):
    """Served requests share one decoder per option set; each plans with its own schedule copy, so sampled
    width-auto requests admitted, stepped and retired together each give what ``generate`` gives alone."""
    sampled = DecodeOptions(json.dumps("packed"), json.dumps("ltr"), json.dumps(acceptance(0.8)), "auto")
    prompts = PROMPTS * 2
    jobs = [Job("completion", served_model.encode_prompt(p), sampled, 12, seed, stream=True)
            for seed, p in enumerate(prompts)]  # fmt: skip
    engine = Engine(decoder_factory(served_model, threads=1, max_tokens=64), max_active=5)
    results = _run(engine, jobs)
    for seed, (prompt, event) in enumerate(zip(prompts, results, strict=True)):
        expected = offline(served_model, served_model.encode_prompt(prompt), width="auto", temperature=0.8,
                           max_tokens=12, seed=seed)  # fmt: skip
        assert event.kind == "done" and event.generation.output_ids == expected.output_ids
    assert engine.decoders.composed == 1


def test_with_a_kv_block_pool_requests_wait_for_free_blocks_and_decode_as_alone(served_model):
    from specframe.models.paged import BlockPool

    jobs = _jobs(served_model, PROMPTS, max_tokens=8)
    probe = decoder_factory(served_model, threads=1, max_tokens=64)(GREEDY)
    need = max(probe.stepper(prompt_ids=job.prompt_ids, max_new_tokens=8).capacity for job in jobs)
    pool = BlockPool.for_model(served_model, blocks=2 * -(-need // 8), block_size=8)  # two requests at a time
    batch = CountingBatch(pool)
    engine = Engine(decoder_factory(served_model, threads=1, max_tokens=64), max_active=6, batch=batch)
    results = _run(engine, jobs, hold_first=True)
    for prompt, event in zip(PROMPTS, results, strict=True):
        expected = offline(served_model, served_model.encode_prompt(prompt), max_tokens=8)
        assert event.kind == "done" and event.generation.output_ids == expected.output_ids
    assert max(batch.sizes) == 2 < len(PROMPTS)  # admitted by free blocks, not by max_active
    assert pool.free_blocks == pool.blocks


def test_a_request_no_kv_block_pool_of_the_server_could_hold_fails_alone_with_a_400(served_model):
    from specframe.models.paged import BlockPool

    pool = BlockPool.for_model(served_model, blocks=2, block_size=8)
    engine = Engine(decoder_factory(served_model, threads=1, max_tokens=64), max_active=4, batch=Batch(pool))
    results = _run(engine, _jobs(served_model, ["def fib(n):"], max_tokens=30))
    assert results[0].kind == "error" and results[0].error.status == 400
    message = results[0].error.message
    assert "can never fit this pool of 2 blocks" in message and "--kv-blocks" in message


def test_serve_pages_kv_caches_from_one_pool_when_given_kv_blocks():
    from specframe.errors import ConfigError
    from specframe.serve.builder import build_app

    app = build_app("nemotron-stdlib-tiny", schedule="packed", width=4, threads=1, kv_blocks=12, kv_block_size=8)
    pool = app.state.api.engine.batch.pool
    assert pool.blocks == 12 and pool.block_size == 8 and pool.free_blocks == 12
    plain = build_app("nemotron-stdlib-tiny", schedule="packed", width=4, threads=1, prefill_chunk=32)
    assert plain.state.api.engine.batch.pool is None and plain.state.api.engine.batch.prefill_chunk == 32
    with pytest.raises(ConfigError, match="kv_blocks must be an integer >= 1, got 0"):
        build_app("nemotron-stdlib-tiny", schedule="packed", width=4, threads=1, kv_blocks=0)
