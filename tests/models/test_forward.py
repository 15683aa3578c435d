"""The inference forward (models/forward.py) equals the network's own modules, batches requests exactly,
shares the network's weights, follows edits, and picks its CPU kernels as models/cpu.py says."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from oracles import network_logits
from specframe import kernels
from specframe.errors import InputError
from specframe.models import load_model
from specframe.models.base import ModelBackend, ModelCall
from specframe.models.compiled import GRAPH
from specframe.models.cpu import (
    PACK_MIN_ELEMENTS,
    PACKED_MIN_ROWS,
    TRANSPOSED_SKIP_ROWS,
    InvariantLinear,
    Prepacked,
    Transposed,
    onednn_available,
)
from specframe.models.forward import Linear, Padded

ROWS = 9
OUTPUT = [0, 4, 8, 2]


def _inputs(model):
    generator = torch.Generator().manual_seed(5)
    ids = torch.randint(0, model.vocab_size, (7 + ROWS,), generator=generator)
    positions = torch.arange(7 + ROWS) + 60  # crosses the Llama-4 scaling step of the test checkpoints (64)
    attention = torch.ones(ROWS, ROWS, dtype=torch.bool).tril()
    attention[5:, 5:] = True
    return ids, positions, attention


def _two_calls(model, adapter_rows=None):
    """A 7-row causal prefill, then a call mixing causal rows and a bidirectional block; both calls' logits."""
    ids, positions, attention = _inputs(model)
    cache = model.new_cache(32)
    first = model.forward(cache, ModelCall(ids[:7], positions[:7], torch.ones(7, 7, dtype=torch.bool).tril()))
    cache.commit(list(range(7)))
    second = model.forward(
        cache,
        ModelCall(ids[7:], positions[7:], attention, output_rows=torch.tensor(OUTPUT), adapter_rows=adapter_rows),
    )
    return first, second


def _reference(model, adapter_rows=None):
    """The same two calls' logits from the network's own modules over the whole sequence (tests/oracles.py)."""
    ids, positions, attention = _inputs(model)
    mask = torch.ones(7 + ROWS, 7 + ROWS, dtype=torch.bool).tril()
    mask[7:, 7:] = attention
    adapter = None if adapter_rows is None else torch.cat([torch.zeros(7, dtype=torch.bool), adapter_rows])
    logits = network_logits(model, ids, positions, mask, adapter)
    return logits[:7], logits[7:][OUTPUT]


def _paths(model, adapter_rows=None):
    return _reference(model, adapter_rows), _two_calls(model, adapter_rows)


def test_eager_path_equals_reference_path_in_float64(model64):
    reference, eager = _paths(model64)
    for ref, got in zip(reference, eager, strict=True):
        torch.testing.assert_close(got, ref, rtol=0, atol=1e-11)


@pytest.mark.parametrize("folder", ["nemotron_dir", "nemotron_mlp_dir"])  # o_proj; o_proj and down_proj
def test_eager_path_equals_reference_with_adapter_rows(folder, request):
    adapted = load_model(request.getfixturevalue(folder), dtype="float64", adapter=True)
    rows = torch.tensor([False] * 5 + [True] * 4)
    reference, eager = _paths(adapted, rows)
    torch.testing.assert_close(eager[1], reference[1], rtol=0, atol=1e-11)
    _, plain = _paths(adapted, None)
    assert not torch.allclose(eager[1][1:3], plain[1][1:3])  # the adapter did act on the block rows


@pytest.mark.parametrize("kernels_on", [True, False], ids=["ours", "torch"])
def test_float32_paths_agree_with_a_down_proj_adapter(nemotron_mlp_dir, kernels_on, monkeypatch):
    if not kernels_on:
        monkeypatch.setenv(kernels.SWITCH, "0")
    adapted = load_model(nemotron_mlp_dir, dtype="float32", adapter=True)
    assert adapted.inference.weights.invariant == (kernels_on and kernels.available())
    rows = torch.tensor([False] * 5 + [True] * 4)
    reference, eager = _paths(adapted, rows)
    assert all(layer.down_lora is not None for layer in adapted.inference.weights.layers)
    torch.testing.assert_close(eager[1], reference[1], rtol=1e-4, atol=1e-4)


def test_a_down_proj_adapter_set_after_loading_is_seen(nemotron_dir):
    from specframe.models.layers import LowRankUpdate

    model = load_model(nemotron_dir, dtype="float64")
    rows = torch.tensor([False] * 5 + [True] * 4)
    before = _two_calls(model, rows)[1]
    assert not model.inference.has_lora
    mlp = model.network.body.layers[1].mlp
    update = LowRankUpdate(mlp.down_proj.in_features, mlp.down_proj.out_features, 3, 0.5).double()
    with torch.no_grad():
        update.lora_A.normal_(generator=torch.Generator().manual_seed(0))
        update.lora_B.normal_(generator=torch.Generator().manual_seed(1))
    mlp.down_lora = update
    model.has_adapter = True  # as a loader that attaches an adapter says (the reference reads it)
    assert model.inference.stale()
    after = _two_calls(model, rows)[1]
    assert model.inference.has_lora and not model.inference.stale()
    assert update.lora_B.data_ptr() in {t.data_ptr() for t in model.inference.weights.tensors()}  # read in place
    torch.testing.assert_close(after, _reference(model, rows)[1], rtol=0, atol=1e-11)
    drafting = torch.tensor(rows.tolist())[OUTPUT]
    assert torch.equal(after[~drafting], before[~drafting]) and not torch.allclose(after[drafting], before[drafting])
    mlp.down_lora = None
    assert model.inference.stale() and torch.equal(_two_calls(model, rows)[1], before)


def test_fused_weights_are_shared_and_in_place_edits_are_seen(nemotron_dir):
    model = load_model(nemotron_dir, dtype="float64")
    attn = model.network.body.layers[0].self_attn
    assert attn.q_proj.weight.untyped_storage().data_ptr() == attn.qkv_weight.untyped_storage().data_ptr()
    before = _two_calls(model)[1]
    with torch.no_grad():
        attn.k_proj.weight.mul_(1.5)
        model.network.body.layers[1].mlp.down_proj.weight.mul_(0.5)
    after_eager = _two_calls(model)[1]
    after_reference = _reference(model)[1]
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
    big_projection, small_projection = Prepacked(big), (Transposed if dtype == torch.float32 else Prepacked)(small)
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
    projection = Transposed(weight)
    assert projection.transposed.is_contiguous() and torch.equal(projection.transposed, weight.t())
    for rows in (1, *TRANSPOSED_SKIP_ROWS, 4, 18):
        x = torch.randn(rows, 256, generator=generator)
        torch.testing.assert_close(projection(x), F.linear(x, weight), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", ["specframe", "torch"])
def test_float32_eager_path_follows_in_place_edits_of_small_matrices(nemotron_dir, kind, monkeypatch):
    if kind == "torch":
        monkeypatch.setenv(kernels.SWITCH, "0")
    elif not kernels.available():
        pytest.skip(f"no kernels: {kernels.unavailable_reason()}")
    model = load_model(nemotron_dir, dtype="float32")
    expected = InvariantLinear if kind == "specframe" else Transposed  # the test checkpoint's matrices are small
    assert isinstance(model.inference.weights.layers[0].o, expected)
    before = _two_calls(model)[1]
    with torch.no_grad():
        model.network.body.layers[0].self_attn.o_proj.weight.mul_(-1.0)
    after = _two_calls(model)[1]
    torch.testing.assert_close(after, _reference(model)[1], rtol=1e-4, atol=1e-4)
    assert not torch.allclose(after, before, atol=1e-3)


def test_kernels_are_chosen_by_dtype_and_size_and_the_switch_turns_them_off(nemotron_dir, setdlm_dir, monkeypatch):
    def kinds(model):
        return {type(getattr(layer, n)) for layer in model.inference.weights.layers for n in ("qkv", "o", "down")}

    assert kinds(load_model(nemotron_dir, dtype="float64")) == {Linear}  # neither has float64 kernels
    if kernels.available():  # specframe's own: every float32 and bfloat16 matrix, invariant attention
        for folder, dtype in ((nemotron_dir, "float32"), (setdlm_dir, "bfloat16")):
            model = load_model(folder, dtype=dtype)
            assert kinds(model) == {InvariantLinear} and model.inference.weights.invariant
            assert model.kernel_report()["invariant"] and model.kernel_report()["kernels"].startswith("specframe")
    monkeypatch.setenv(kernels.SWITCH, "0")
    if onednn_available():  # torch's, tuned by row count
        assert kinds(load_model(nemotron_dir, dtype="float32")) == {Transposed}  # small float32 matrices
        avx512 = torch.backends.cpu.get_cpu_capability().startswith("AVX512")
        assert kinds(load_model(setdlm_dir, dtype="bfloat16")) == ({Prepacked} if avx512 else {Linear})
    fallback = load_model(nemotron_dir, dtype="float32")
    assert not fallback.inference.weights.invariant and fallback.kernel_report()["kernels"] == "torch"
    monkeypatch.delenv(kernels.SWITCH)
    off = load_model(nemotron_dir, dtype="float32", cpu_tuning=False)
    assert kinds(off) == {Linear} and not off.cpu_tuning and not off.inference.weights.invariant
    monkeypatch.setenv("SPECFRAME_CPU_TUNING", "0")
    assert kinds(load_model(nemotron_dir, dtype="float32")) == {Linear}
    torch.testing.assert_close(_two_calls(off)[1], _reference(off)[1], rtol=1e-4, atol=1e-4)


# --- forward_many: one pass over several requests' rows --------------------------------------------------
def _request(model, seed: int, cached: int, rows: int, adapter: bool, select: bool):
    """A request with ``cached`` committed rows and its next call of ``rows`` rows (random mask, ids)."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, model.vocab_size, (cached + rows,), generator=generator)
    positions = torch.arange(cached + rows)
    cache = model.new_cache(cached + rows + 1)
    if cached:
        model.forward(cache, ModelCall(ids[:cached], positions[:cached], torch.ones(cached, cached).bool().tril()))
        cache.commit(list(range(cached)))
    attention = (torch.rand(rows, rows, generator=generator) < 0.5) | torch.eye(rows, dtype=torch.bool)
    adapter_rows = (torch.rand(rows, generator=generator) < 0.5) if adapter else None
    output_rows = torch.randperm(rows, generator=generator)[: max(1, rows // 2)] if select else None
    return cache, ModelCall(ids[cached:], positions[cached:], attention, output_rows, adapter_rows)


def _segment(cached: int, rows: int):
    """The shape of a request's attention segment (its buffers do not matter to the layout's choice)."""
    empty = torch.empty(0)
    return empty, empty, torch.zeros(rows, cached + rows), slice(cached, cached + rows), None


def _copy(cache):
    twin = type(cache).__new__(type(cache))
    twin.__dict__.update(cache.__dict__)
    twin.keys, twin.values, twin.positions = cache.keys.clone(), cache.values.clone(), list(cache.positions)
    return twin


#: (cached rows, new rows, adapter, selected outputs) per request: ragged (an attention kernel per request)
#: and alike (requests of 1, 2 and 3 rows padded into one kernel each, see ``forward.Padded``).
SHAPES = {
    "ragged": [(7, 1, False, False), (0, 5, True, True), (12, 9, True, False), (3, 2, False, True)]
    + [(20, 34, False, True)],
    "alike": [(10, 1, False, False), (12, 2, True, True), (9, 3, True, False), (11, 2, False, True)]
    + [(13, 1, False, True)],
}


@pytest.mark.parametrize("layout", SHAPES)
@pytest.mark.parametrize("family", ["nemotron", "setdlm"])
def test_forward_many_equals_separate_forwards_in_float64(family, layout, nemotron_dir, setdlm_dir):
    """Equal to float64 rounding: BLAS products of 5 rows and of 50 round differently in the last bits (row
    tiles), exactly as a forward of 5 rows and one of 50 already did; no greedy choice depends on it."""
    model = load_model(
        nemotron_dir if family == "nemotron" else setdlm_dir, dtype="float64", adapter=family == "nemotron"
    )
    shapes = SHAPES[layout]
    padded = Padded.of(model.inference.weights, [_segment(c, n) for c, n, *_ in shapes])
    kernels = len(padded.groups)  # both a padded group of several requests and single ones are compared here
    assert kernels == (5 if layout == "ragged" else 3)
    batch = [_request(model, seed, *shape) for seed, shape in enumerate(shapes)]
    alone = [_copy(cache) for cache, _ in batch]
    expected = [model.forward(cache, call) for cache, (_, call) in zip(alone, batch, strict=True)]
    got = model.forward_many(batch)
    for (cache, call), twin, logits, want in zip(batch, alone, got, expected, strict=True):
        torch.testing.assert_close(logits, want, rtol=0, atol=1e-12)
        assert torch.equal(logits.argmax(-1), want.argmax(-1))
        rows = call.input_ids.shape[0]
        end = cache.length + rows
        assert cache.staged == rows and cache.length == twin.length
        torch.testing.assert_close(cache.keys[:, :end], twin.keys[:, :end], rtol=0, atol=1e-12)
        torch.testing.assert_close(cache.values[:, :end], twin.values[:, :end], rtol=0, atol=1e-12)
    assert model.forward_many([]) == []


def test_forward_many_refuses_a_shared_cache_and_names_the_bad_item(nemotron64):
    one = _request(nemotron64, 1, 3, 2, False, False)
    with pytest.raises(InputError, match="same cache twice"):
        nemotron64.forward_many([one, (one[0], one[1])])
    cache, call = _request(nemotron64, 2, 3, 2, False, False)
    bad = ModelCall(call.input_ids, call.position_ids, call.attention[:1])
    with pytest.raises(InputError, match="batch item 1: attention must be"):
        nemotron64.forward_many([one, (cache, bad)])


def test_the_default_forward_many_runs_forward_per_item():
    class Counting(ModelBackend):
        def forward(self, cache, call):
            return call.input_ids.double()

    calls = [ModelCall(torch.tensor([i, i]), torch.arange(2), torch.ones(2, 2).bool()) for i in range(3)]
    out = Counting().forward_many([(None, call) for call in calls])
    assert [o.tolist() for o in out] == [[0.0, 0.0], [1.0, 1.0], [2.0, 2.0]]


def test_a_call_that_does_not_fit_in_the_cache_is_refused(nemotron64):
    cache = nemotron64.new_cache(4)
    with pytest.raises(InputError, match="does not fit in the KV cache"):
        nemotron64.forward(cache, ModelCall(torch.arange(5), torch.arange(5), torch.ones(5, 5).bool().tril()))


# --- the compiled path's graphs (aot_eager: the same traced graphs, no code generation) --------------------
@pytest.fixture
def compile_at_once(monkeypatch):
    from specframe.models import compiled

    monkeypatch.setattr(compiled, "COMPILE_AFTER", 1)


def _compiled(model):
    model.enable_compiled(backend="aot_eager")
    return model


@pytest.fixture
def torch_kernels(monkeypatch):
    """torch's row-count-tuned kernels (the fallback without specframe's own, SPECFRAME_KERNELS=0)."""
    monkeypatch.setenv(kernels.SWITCH, "0")


has_kernels = pytest.mark.skipif(not kernels.available(), reason=f"no kernels: {kernels.unavailable_reason()}")


@pytest.mark.parametrize("folder", ["nemotron_dir", "nemotron_mlp_dir"])
def test_compiled_graphs_equal_reference_with_adapter_rows(folder, request, compile_at_once):
    adapted = _compiled(load_model(request.getfixturevalue(folder), dtype="float64", adapter=True))
    rows = torch.tensor([False] * 5 + [True] * 4)
    graphs = _two_calls(adapted, rows)
    assert adapted.compiled.graph_calls == 1  # the prompt ran eagerly, the second call as a graph
    reference = _reference(adapted, rows)
    torch.testing.assert_close(graphs[1], reference[1], rtol=0, atol=1e-11)


def test_compiled_graphs_follow_in_place_edits(nemotron_dir, compile_at_once):
    model = _compiled(load_model(nemotron_dir, dtype="float64"))
    before = _two_calls(model)[1]
    with torch.no_grad():
        model.network.body.layers[1].mlp.down_proj.weight.mul_(0.5)
    after = _two_calls(model)[1]
    torch.testing.assert_close(after, _reference(model)[1], rtol=0, atol=1e-11)
    assert not torch.allclose(after, before)


@pytest.mark.skipif(not onednn_available(), reason="this torch build has no oneDNN")
def test_compiled_graphs_use_the_prepacked_kernels_in_bfloat16(setdlm_dir, compile_at_once, torch_kernels):
    reference = load_model(setdlm_dir, dtype="float64")
    exact = _two_calls(reference)[1].float()
    model = load_model(setdlm_dir, dtype="bfloat16")
    if not torch.backends.cpu.get_cpu_capability().startswith("AVX512"):
        assert all(type(layer.qkv) is Linear for layer in model.inference.weights.layers)  # oneDNN would raise
        return
    assert all(isinstance(layer.qkv, Prepacked) for layer in model.inference.weights.layers)
    eager = _two_calls(model)[1]
    _compiled(model)
    graphs = _two_calls(model)[1]
    assert model.compiled.graph_calls == 1
    weights = model.compiled.graphs[GRAPH].args[0]  # the weights the graph was traced with
    assert all(type(layer.o).__name__ == "_GraphPrepacked" for layer in weights.layers)
    # bfloat16 rounds differently in the two attention formulations: as close to float64 as the eager path
    assert (graphs - exact).abs().max() <= 2 * (eager - exact).abs().max()


@pytest.mark.skipif(not onednn_available(), reason="this torch build has no oneDNN")
def test_compiled_graphs_multiply_small_float32_matrices_by_their_transposed_copies(
    nemotron_dir, compile_at_once, torch_kernels
):
    model = load_model(nemotron_dir, dtype="float32")
    eager = _two_calls(model)[1]
    _compiled(model)
    graphs = _two_calls(model)[1]
    assert model.compiled.graph_calls == 1
    weights = model.compiled.graphs[GRAPH].args[0]
    for layer, eager_layer in zip(weights.layers, model.inference.weights.layers, strict=True):
        for name in ("qkv", "o", "gate_up", "down"):  # the graph multiplies by the eager path's copies
            assert getattr(layer, name).transposed is getattr(eager_layer, name).transposed
    torch.testing.assert_close(graphs, eager, rtol=1e-4, atol=1e-4)


@has_kernels
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_compiled_graphs_run_the_invariant_kernels_and_match_the_eager_path(nemotron_dir, compile_at_once, dtype):
    reference = _two_calls(load_model(nemotron_dir, dtype="float64"))[1].float()
    model = load_model(nemotron_dir, dtype=dtype)
    eager = _two_calls(model)[1]
    _compiled(model)
    graphs = _two_calls(model)[1]
    assert model.compiled.graph_calls == 1
    weights = model.compiled.graphs[GRAPH].args[0]
    assert weights.invariant and all(isinstance(layer.o, InvariantLinear) for layer in weights.layers)
    assert (graphs - reference).abs().max() <= 2 * (eager - reference).abs().max() + 1e-6


def test_compiled_graphs_follow_an_edit_first_seen_by_forward_many(nemotron_dir, compile_at_once):
    model = _compiled(load_model(nemotron_dir, dtype="float32"))  # small float32 matrices: transposed copies
    _two_calls(model)
    assert model.compiled.graph_calls == 1
    with torch.no_grad():
        model.network.body.layers[0].self_attn.o_proj.weight.mul_(-1.0)
    model.forward_many([_request(model, 3, 0, 2, False, False)])  # the eager batch path refreshes the weights
    after = _two_calls(model)[1]
    assert model.compiled.graph_calls == 2  # a new graph, on the new weights
    torch.testing.assert_close(after, _reference(model)[1], rtol=1e-4, atol=1e-4)


def test_bfloat16_is_never_prepacked_where_onednn_cannot(monkeypatch, setdlm_dir):
    """oneDNN packs bfloat16 only with AVX-512; on an AVX2-only CPU its reorder raised at load."""
    from specframe.models import cpu

    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")
    assert not cpu.prepack_allowed(1 << 20, torch.device("cpu"), torch.bfloat16)
    assert cpu.prepack_allowed(1 << 20, torch.device("cpu"), torch.float32) == cpu.onednn_available()
    monkeypatch.setenv(kernels.SWITCH, "0")
    model = load_model(setdlm_dir, dtype="bfloat16")
    assert {type(layer.qkv) for layer in model.inference.weights.layers} == {Linear}


def test_cpu_tuning_off_at_load_packs_nothing(monkeypatch, nemotron_dir):
    """cpu_tuning=False reaches the backend before any weight is packed (it used to be applied afterwards)."""
    from specframe.models import cpu

    def refuse(*args, **kwargs):
        raise AssertionError("a weight was packed although cpu_tuning=False")

    monkeypatch.setattr(cpu.Prepacked, "__init__", refuse)
    monkeypatch.setattr(cpu.InvariantLinear, "__init__", refuse)
    model = load_model(nemotron_dir, dtype="float32", cpu_tuning=False)
    assert not model.cpu_tuning and model.kernel_report()["kernels"] == "torch"
