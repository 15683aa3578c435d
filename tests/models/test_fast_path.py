"""The fast eager forward equals the module-by-module reference forward, shares its weights and follows edits."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from specframe.models.kernels import (
    PACK_MIN_ELEMENTS,
    PACKED_MIN_ROWS,
    TRANSPOSED_SKIP_ROWS,
    Projection,
    onednn_available,
)

from specframe.models import load_model
from specframe.models.base import ModelCall
from specframe.models.compiled import GRAPH

ROWS = 9


def _two_calls(model, adapter_rows=None):
    """A 7-row causal prefill, then a call mixing causal rows and a bidirectional block; both calls' logits."""
    generator = torch.Generator().manual_seed(5)
    cache = model.new_cache(32)
    ids = torch.randint(0, model.vocab_size, (7 + ROWS,), generator=generator)
    positions = torch.arange(7 + ROWS) + 60  # crosses the Llama-4 scaling step of the test checkpoints (64)
    first = model.forward(cache, ModelCall(ids[:7], positions[:7], torch.ones(7, 7, dtype=torch.bool).tril()))
    cache.commit(list(range(7)))
    attention = torch.ones(ROWS, ROWS, dtype=torch.bool).tril()
    attention[5:, 5:] = True
    second = model.forward(
        cache,
        ModelCall(ids[7:], positions[7:], attention, output_rows=torch.tensor([0, 4, 8, 2]), adapter_rows=adapter_rows),
    )
    return first, second


def _paths(model, adapter_rows=None):
    results = {}
    for path in ("reference", "eager"):
        model.path = path
        results[path] = _two_calls(model, adapter_rows)
    model.path = "eager"
    return results["reference"], results["eager"]


def test_eager_path_equals_reference_path_in_float64(model64):
    reference, eager = _paths(model64)
    for ref, got in zip(reference, eager, strict=True):
        torch.testing.assert_close(got, ref, rtol=0, atol=1e-11)


def test_eager_path_equals_reference_with_adapter_rows(nemotron_dir):
    adapted = load_model(nemotron_dir, dtype="float64", adapter=True)
    rows = torch.tensor([False] * 5 + [True] * 4)
    reference, eager = _paths(adapted, rows)
    torch.testing.assert_close(eager[1], reference[1], rtol=0, atol=1e-11)
    _, plain = _paths(adapted, None)
    assert not torch.allclose(eager[1][1:3], plain[1][1:3])  # the adapter did act on the block rows


def test_fused_weights_are_shared_and_in_place_edits_are_seen(nemotron_dir):
    model = load_model(nemotron_dir, dtype="float64")
    attn = model.network.body.layers[0].self_attn
    assert attn.q_proj.weight.untyped_storage().data_ptr() == attn.qkv_weight.untyped_storage().data_ptr()
    before = _two_calls(model)[1]
    with torch.no_grad():
        attn.k_proj.weight.mul_(1.5)
        model.network.body.layers[1].mlp.down_proj.weight.mul_(0.5)
    after_eager = _two_calls(model)[1]
    model.path = "reference"
    after_reference = _two_calls(model)[1]
    assert not torch.allclose(after_eager, before)
    torch.testing.assert_close(after_eager, after_reference, rtol=0, atol=1e-11)


def test_float32_paths_agree(setdlm_dir):
    model = load_model(setdlm_dir, dtype="float32")
    reference, eager = _paths(model)
    for ref, got in zip(reference, eager, strict=True):
        torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4)


@pytest.mark.skipif(not onednn_available(), reason="this torch build has no oneDNN")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_projection_uses_prepacked_kernel_where_it_wins_and_agrees_with_f_linear(dtype):
    generator = torch.Generator().manual_seed(0)
    big = torch.randn(PACK_MIN_ELEMENTS // 256, 256, generator=generator).to(dtype)
    small = torch.randn(64, 256, generator=generator).to(dtype)
    big_projection, small_projection = Projection(big, prepack=True), Projection(small, prepack=True)
    assert big_projection.packed is not None
    assert (small_projection.packed is None) == (dtype == torch.float32)  # bfloat16 prepacks every matrix
    assert Projection(big, prepack=False).packed is None
    tolerance = 1e-4 if dtype == torch.float32 else 5e-2
    for rows in (1, PACKED_MIN_ROWS, 18):
        x = torch.randn(rows, 256, generator=generator).to(dtype)
        for projection, weight in ((big_projection, big), (small_projection, small)):
            expected = F.linear(x.double(), weight.double())
            got = projection(x).double()
            torch.testing.assert_close(got, expected, rtol=tolerance, atol=tolerance * expected.abs().max().item())


@pytest.mark.skipif(not onednn_available(), reason="this torch build has no oneDNN")
def test_small_float32_matrices_use_their_transposed_copy_and_agree_with_f_linear():
    generator = torch.Generator().manual_seed(1)
    weight = torch.randn(96, 256, generator=generator)
    projection = Projection(weight, prepack=True)
    assert projection.packed is None and projection.transposed is not None
    assert projection.transposed.is_contiguous() and torch.equal(projection.transposed, weight.t())
    assert Projection(weight, prepack=False).transposed is None
    assert Projection(weight.to(torch.bfloat16), prepack=True).transposed is None  # bfloat16 prepacks instead
    assert Projection(torch.randn(PACK_MIN_ELEMENTS // 256, 256), prepack=True).transposed is None
    for rows in (1, *TRANSPOSED_SKIP_ROWS, 4, 18):
        x = torch.randn(rows, 256, generator=generator)
        torch.testing.assert_close(projection(x), F.linear(x, weight), rtol=1e-5, atol=1e-5)


def test_float32_eager_path_follows_in_place_edits_of_small_matrices(nemotron_dir):
    model = load_model(nemotron_dir, dtype="float32")
    assert model.fast.layers[0].o.transposed is not None  # the test checkpoint's matrices are small
    before = _two_calls(model)[1]
    with torch.no_grad():
        model.network.body.layers[0].self_attn.o_proj.weight.mul_(-1.0)
    after = _two_calls(model)[1]
    model.path = "reference"
    torch.testing.assert_close(after, _two_calls(model)[1], rtol=1e-4, atol=1e-4)
    assert not torch.allclose(after, before, atol=1e-3)


def test_float64_never_prepacks():
    weight = torch.randn(PACK_MIN_ELEMENTS // 256, 256, dtype=torch.float64)
    assert Projection(weight, prepack=True).packed is None


# --- the compiled path's graphs (aot_eager: the same traced graphs, no code generation) --------------------
@pytest.fixture
def compile_at_once(monkeypatch):
    from specframe.models import compiled

    monkeypatch.setattr(compiled, "COMPILE_AFTER", 1)


def _compiled(model):
    model.enable_compiled(backend="aot_eager")
    return model


def test_compiled_graphs_equal_reference_with_adapter_rows(nemotron_dir, compile_at_once):
    adapted = _compiled(load_model(nemotron_dir, dtype="float64", adapter=True))
    rows = torch.tensor([False] * 5 + [True] * 4)
    graphs = _two_calls(adapted, rows)
    assert adapted.compiled.graph_calls == 1  # the prompt ran eagerly, the second call as a graph
    adapted.path = "reference"
    reference = _two_calls(adapted, rows)
    torch.testing.assert_close(graphs[1], reference[1], rtol=0, atol=1e-11)


def test_compiled_graphs_follow_in_place_edits(nemotron_dir, compile_at_once):
    model = _compiled(load_model(nemotron_dir, dtype="float64"))
    before = _two_calls(model)[1]
    with torch.no_grad():
        model.network.body.layers[1].mlp.down_proj.weight.mul_(0.5)
    after = _two_calls(model)[1]
    model.path = "reference"
    torch.testing.assert_close(after, _two_calls(model)[1], rtol=0, atol=1e-11)
    assert not torch.allclose(after, before)


@pytest.mark.skipif(not onednn_available(), reason="this torch build has no oneDNN")
def test_compiled_graphs_use_the_prepacked_kernels_in_bfloat16(setdlm_dir, compile_at_once):
    reference = load_model(setdlm_dir, dtype="float64")
    exact = _two_calls(reference)[1].float()
    model = load_model(setdlm_dir, dtype="bfloat16")
    assert model.fast.prepacked
    eager = _two_calls(model)[1]
    _compiled(model)
    graphs = _two_calls(model)[1]
    assert model.compiled.graph_calls == 1
    step = model.compiled.graphs[GRAPH].args[0]  # the GraphStep the graph was traced from
    assert all(set(layer.packed) == {"qkv", "o", "gate_up", "down"} for layer in step.layers)
    # bfloat16 rounds differently in the two attention formulations: as close to float64 as the eager path
    assert (graphs - exact).abs().max() <= 2 * (eager - exact).abs().max()


@pytest.mark.skipif(not onednn_available(), reason="this torch build has no oneDNN")
def test_compiled_graphs_multiply_small_float32_matrices_by_their_transposed_copies(nemotron_dir, compile_at_once):
    model = load_model(nemotron_dir, dtype="float32")
    eager = _two_calls(model)[1]
    _compiled(model)
    graphs = _two_calls(model)[1]
    assert model.compiled.graph_calls == 1
    step = model.compiled.graphs[GRAPH].args[0]
    for layer, fast in zip(step.layers, model.fast.layers, strict=True):
        for name in ("qkv", "o", "gate_up", "down"):  # the buffers are detached views of the copies
            assert getattr(layer, f"{name}_t").data_ptr() == getattr(fast, name).transposed.data_ptr()
    torch.testing.assert_close(graphs, eager, rtol=1e-4, atol=1e-4)
