"""The compiled path (one graph over a fixed-capacity cache, masked attention) is exact too.

Greedy: every speculative schedule on the compiled path reproduces plain AR on the eager path token for
token, in float64. The graph logic (masking over the whole capacity, symbolic row counts, keys and values
as outputs) is exercised property-based with the ``aot_eager`` backend, which traces the same graph but
generates no code; the real inductor backend runs a fixed matrix of schedules on both families and a
sampling test (the graph costs a compilation of tens of seconds on a small CPU, hence the ``slow`` mark).
Whether a row count or a width change recompiles is read from dynamo's own cache of the graph.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from decoding_helpers import FAMILIES, NEMOTRON, SETDLM, generate, tiny_model
from specframe import compose
from specframe.errors import ConfigError
from specframe.models import compiled as compiled_module
from specframe.models.base import ModelCall
from specframe.models.compiled import CAPACITY_STEP, GRAPH

VOCAB = 24

# torch's own torch/utils/mkldnn.py (imported by inductor through torch.fx.experimental.optimization) still
# decorates with torch.jit.script_method; specframe uses neither torch.jit nor that module
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    """Per family: an eager model and a same-weight model on the compiled path (aot_eager backend)."""
    root = tmp_path_factory.mktemp("compiled")
    out = {}
    for family in FAMILIES:
        eager = tiny_model(family, root / f"{family}-eager", vocab=VOCAB, seed=1)
        graphs = tiny_model(family, root / f"{family}-graphs", vocab=VOCAB, seed=1)
        graphs.enable_compiled(backend="aot_eager")
        out[family] = (eager, graphs)
    return out


@pytest.fixture(scope="module", autouse=True)
def _compile_early():
    saved = compiled_module.COMPILE_AFTER
    compiled_module.COMPILE_AFTER = 1  # compile at the first call over a non-empty cache
    yield
    compiled_module.COMPILE_AFTER = saved


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    family=st.sampled_from(FAMILIES),
    schedule=st.sampled_from(("ar", "linear", "quadratic", "packed")),
    width=st.integers(1, 5),
    prompt=st.lists(st.integers(0, VOCAB - 3), min_size=1, max_size=8),
    length=st.integers(1, 18),
)
def test_compiled_graphs_reproduce_eager_ar(pairs, family, schedule, width, prompt, length):
    eager, graphs = pairs[family]
    reference = generate(eager, "ar", prompt, length)
    assert generate(graphs, schedule, prompt, length, width=width).output_ids == reference.output_ids


def test_one_graph_serves_every_schedule_and_width(pairs):
    for family in FAMILIES:
        eager, graphs = pairs[family]
        # no graph left by earlier examples
        graphs.compiled = type(graphs.compiled)(graphs.inference, graphs.device, "aot_eager")
        compiled = graphs.compiled
        result = generate(graphs, "packed", [1, 2, 3], 16, width=3)
        assert result.output_ids == generate(eager, "ar", [1, 2, 3], 16).output_ids
        assert compiled.graph_calls > 0 and compiled.compiled_graphs() == 1
        calls = compiled.graph_calls
        for schedule, width in (("packed", 5), ("linear", 2), ("quadratic", 3), ("ar", 1), ("packed", 1)):
            generate(graphs, schedule, [4, 5], 30, width=width)
        assert compiled.graph_calls > calls + 5  # the later requests' steady-state calls ran as the graph
        assert set(compiled.graphs) == {GRAPH}
        assert compiled.compiled_graphs() == 1, "a schedule, width or row count recompiled the graph"


def test_caches_have_a_fixed_zeroed_capacity_and_reuse_free_buffers(pairs):
    _, graphs = pairs[NEMOTRON]
    cache = graphs.new_cache(10)
    assert cache.capacity == CAPACITY_STEP and not cache.keys.any()
    cache.keys.fill_(1.0)
    held = graphs.new_cache(10)  # the first cache is still alive: fresh buffers
    assert held.keys.data_ptr() != cache.keys.data_ptr()
    pointer = held.keys.data_ptr()
    del held
    again = graphs.new_cache(CAPACITY_STEP - 1)
    assert again.keys.data_ptr() == pointer and not again.keys.any()


def test_a_cache_made_under_inference_mode_is_not_reused_outside_it(pairs):
    """Calibration (width "auto") times calls under torch.inference_mode; its freed cache buffers are inference
    tensors, which torch refuses to zero or write outside that mode: the next request's cache of the same
    capacity crashed ``specframe generate --compile`` on a machine with no cost model cached yet."""
    eager, graphs = pairs[NEMOTRON]
    with torch.inference_mode():
        graphs.new_cache(10)  # freed at once: its buffers go back to the pool
    cache = graphs.new_cache(10)
    assert not cache.keys.is_inference() and not cache.keys.any()
    reference = generate(eager, "ar", [1, 2, 3], 8).output_ids
    assert generate(graphs, "packed", [1, 2, 3], 8, width=3).output_ids == reference
    with torch.inference_mode():  # the other way round stays allowed: a normal buffer is reused there
        pointer = graphs.new_cache(10).keys.data_ptr()
        assert graphs.new_cache(10).keys.data_ptr() == pointer


def test_one_graph_serves_every_row_count_and_capacity(pairs):
    eager, graphs = pairs[SETDLM]
    graphs.compiled = type(graphs.compiled)(graphs.inference, graphs.device, "aot_eager")
    compiled = graphs.compiled
    ids = torch.arange(300) % (VOCAB - 2)
    for capacity, prompt in ((40, 6), (CAPACITY_STEP + 10, 9)):  # two cache capacities
        cache = graphs.new_cache(capacity)
        reference = eager.new_cache(cache.capacity)  # the same rounded-up capacity
        for model, c in ((graphs, cache), (eager, reference)):
            model.forward(
                c, ModelCall(ids[:prompt], torch.arange(prompt), torch.ones(prompt, prompt, dtype=torch.bool).tril())
            )
            c.commit(list(range(prompt)))
        start = prompt
        for rows in (1, 5, 2, 7, 1, 3, 34):
            attention = torch.rand(rows, rows, generator=torch.Generator().manual_seed(rows)) < 0.5
            attention |= torch.eye(rows, dtype=torch.bool)
            before = compiled.graph_calls
            span = (ids[start : start + rows], torch.arange(start, start + rows), attention)
            got = graphs.forward(cache, ModelCall(*span))
            expected = eager.forward(reference, ModelCall(*span))
            assert compiled.graph_calls == before + 1
            torch.testing.assert_close(got, expected, rtol=0, atol=1e-10)
            for c in (cache, reference):
                c.commit(list(range(rows)))
            start += rows
    assert set(compiled.graphs) == {GRAPH}
    assert compiled.compiled_graphs() == 1  # traced at 1 row, served 2 to 34 rows and both capacities


def test_direct_calls_equal_calls_through_dynamo(pairs):
    """The compiled code called without dynamo gives the same logits and cache rows as through dynamo."""
    _, graphs = pairs[NEMOTRON]
    graphs.compiled = type(graphs.compiled)(graphs.inference, graphs.device, "aot_eager")
    compiled = graphs.compiled
    cache = graphs.new_cache(40)
    graphs.forward(cache, ModelCall(torch.arange(5), torch.arange(5), torch.ones(5, 5, dtype=torch.bool).tril()))
    cache.commit(list(range(5)))
    start = 5
    for rows in (1, 4, 2, 9, 1):
        attention = torch.rand(rows, rows, generator=torch.Generator().manual_seed(rows)) < 0.5
        attention |= torch.eye(rows, dtype=torch.bool)
        span = ((torch.arange(rows) * 7) % (VOCAB - 2), torch.arange(start, start + rows), attention)
        saved = cache.keys.clone(), cache.values.clone()
        direct, calls = compiled.direct, compiled.direct_calls
        through_dynamo = None
        if direct is not None:  # the first call over the cache compiles the graph (and builds the direct call)
            compiled.direct = None
            through_dynamo = graphs.forward(cache, ModelCall(*span)), cache.keys.clone(), cache.values.clone()
            compiled.direct = direct
            cache.keys.copy_(saved[0]), cache.values.copy_(saved[1])
        got = graphs.forward(cache, ModelCall(*span))
        assert compiled.direct is not None and compiled.direct_calls == calls + 1
        if through_dynamo is not None:
            assert torch.equal(got, through_dynamo[0])
            assert torch.equal(cache.keys, through_dynamo[1]) and torch.equal(cache.values, through_dynamo[2])
        assert not torch.equal(cache.keys[:, start : start + rows], saved[0][:, start : start + rows])  # written
        cache.commit(list(range(rows)))
        start += rows
    assert compiled.compiled_graphs() == 1


def test_recompilations_show_in_the_graph_count(pairs):
    """The count the tests above rely on does see a second graph (here: int32 ids, which calls may use)."""
    _, graphs = pairs[NEMOTRON]
    graphs.compiled = type(graphs.compiled)(graphs.inference, graphs.device, "aot_eager")
    compiled = graphs.compiled
    cache = graphs.new_cache(8)
    for rows, dtype, graphs_then in (
        (3, torch.int64, 0),
        (2, torch.int64, 1),
        (1, torch.int64, 1),
        (2, torch.int32, 2),
    ):
        start = cache.length
        span = (
            torch.arange(rows, dtype=dtype),
            torch.arange(start, start + rows, dtype=dtype),
            torch.ones(rows, rows).bool(),
        )
        graphs.forward(cache, ModelCall(*span))  # the first call (an empty cache) runs eagerly
        cache.commit(list(range(rows)))
        assert compiled.compiled_graphs() == graphs_then


def test_compile_without_a_cpu_compiler_is_a_clear_error(pairs, monkeypatch):
    _, graphs = pairs[NEMOTRON]
    monkeypatch.setattr(compiled_module.shutil, "which", lambda name: None)
    fresh = type(graphs.compiled)
    with pytest.raises(ConfigError, match="C\\+\\+ compiler"):
        fresh(graphs.inference, graphs.device)


# --- the real compiler (inductor) ------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_inductor_graphs_reproduce_ar_in_float64(tmp_path, family):
    eager = tiny_model(family, tmp_path / "eager", vocab=VOCAB, seed=2)
    graphs = tiny_model(family, tmp_path / "graphs", vocab=VOCAB, seed=2)
    compose({"model": graphs, "schedule": "ar", "compile": True})
    prompts = [[1, 2, 3, 4], [7]]
    for schedule in ("ar", "packed", "linear", "quadratic"):  # all share the 1-row and the many-row graph
        for prompt in prompts:
            expected = generate(eager, "ar", prompt, 14).output_ids
            assert generate(graphs, schedule, prompt, 14, width=3).output_ids == expected, (schedule, prompt)
    assert graphs.compiled.graph_calls > 0 and graphs.compiled.compile_seconds > 0


@pytest.mark.slow
@pytest.mark.parametrize(("family", "warp"), [(NEMOTRON, "t1"), (SETDLM, "topk")])
def test_inductor_graphs_sample_the_ar_distribution(tmp_path, family, warp):
    from decoding_helpers import conditional_logits
    from sampling_models import exact_distribution, gof_pvalue, sample_counts
    from test_distribution import PASS, REAL_PROMPT, REAL_VOCAB, SAMPLES, WARPS, WIDTH, _warp

    scale = 0.3 if family == NEMOTRON else 0.05
    model = tiny_model(family, tmp_path / "m", vocab=REAL_VOCAB, seed=4 if family == NEMOTRON else 5, logit_scale=scale)
    exact = exact_distribution(
        model, REAL_PROMPT, 3, _warp(warp), lambda ids: conditional_logits(model, list(enumerate(ids)), len(ids))
    )
    model.enable_compiled()
    decoder = compose(
        {"model": model, "schedule": "packed", "acceptance": WARPS[warp], "width": WIDTH, "max_new_tokens": 3}
    )
    counts = sample_counts(lambda seed: decoder.generate(prompt_ids=REAL_PROMPT, seed=seed).output_ids, SAMPLES)
    assert model.compiled.graph_calls > 0
    assert gof_pvalue(counts, exact) > PASS


def test_attention_spans_the_rows_up_to_the_call_rounded_up_not_the_whole_capacity(pairs):
    from specframe.models.compiled import SPAN_STEP

    _, graphs = pairs[NEMOTRON]
    compiled = graphs.compiled
    for capacity, end, expected in ((256, 1, SPAN_STEP), (256, SPAN_STEP + 1, 2 * SPAN_STEP), (256, 250, 256)):
        span = compiled.span(capacity, end)
        assert torch.equal(span, torch.arange(expected))
    assert compiled.span(256, 3) is compiled.span(256, 5)  # one tensor per span, reused
    compiled.cuda = True  # CUDA graphs are captured per shape: there the whole capacity
    try:
        assert compiled.span(512, 3).shape[0] == 512
    finally:
        compiled.cuda = False


def test_prompts_run_on_the_graph_once_it_exists_on_the_cpu(pairs, monkeypatch):
    eager, graphs = pairs[NEMOTRON]
    graphs.compiled = type(graphs.compiled)(graphs.inference, graphs.device, "aot_eager")
    compiled = graphs.compiled
    prompt = torch.arange(6) % (VOCAB - 2)
    causal = torch.ones(6, 6, dtype=torch.bool).tril()
    first = graphs.new_cache(40)
    graphs.forward(
        first, ModelCall(prompt, torch.arange(6), causal)
    )  # no graph yet: eager, not counted towards compiling
    assert (compiled.eager_calls, compiled.graph_calls, compiled.seen) == (1, 0, 0)
    first.commit(list(range(6)))
    graphs.forward(first, ModelCall(prompt[:1], torch.tensor([6]), torch.ones(1, 1, dtype=torch.bool)))  # compiles
    assert compiled.graph_calls == 1
    cache, reference = graphs.new_cache(40), eager.new_cache(40)
    got = graphs.forward(cache, ModelCall(prompt, torch.arange(6), causal))  # a new request's prompt: on the graph
    expected = eager.forward(reference, ModelCall(prompt, torch.arange(6), causal))
    assert (compiled.eager_calls, compiled.graph_calls) == (1, 2)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-10)
    cache.commit(list(range(6)))
    reference.commit(list(range(6)))
    nxt = (prompt[:2], torch.arange(6, 8), torch.ones(2, 2, dtype=torch.bool).tril())  # the cache the graph wrote
    torch.testing.assert_close(
        graphs.forward(cache, ModelCall(*nxt)), eager.forward(reference, ModelCall(*nxt)), rtol=0, atol=1e-10
    )
    monkeypatch.setattr(compiled_module, "PROMPT_ROWS", 5)  # longer prompts stay eager
    graphs.forward(graphs.new_cache(40), ModelCall(prompt, torch.arange(6), causal))
    assert compiled.eager_calls == 2
