"""specframe's CPU operators on their own: GGUF's block layouts, row invariance, and closeness to plain arithmetic.

Row invariance is the property the lossless claim rests on: a row's output must be bitwise the same whatever
other rows share its call. It is checked for every variant this CPU can run (the portable C++ path included),
every weight format, and row counts chosen by hypothesis.
"""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from specframe import kernels

pytestmark = pytest.mark.skipif(not kernels.available(), reason=f"no kernels: {kernels.unavailable_reason()}")

GGML = {"q8_0": gguf.GGMLQuantizationType.Q8_0, "q4_0": gguf.GGMLQuantizationType.Q4_0}
GGML["q4_1"] = gguf.GGMLQuantizationType.Q4_1
FORMATS = ("f32", "bf16", "q8_0", "q4_0", "q4_1")


@pytest.fixture(params=kernels.variants() or ["none"])
def variant(request):
    best = kernels.variant()
    kernels.select_variant(request.param)
    yield request.param
    kernels.select_variant(best)


def _weights(fmt: str, out: int, inner: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(what the kernel reads, the float32 weights it stands for)."""
    weight = torch.randn(out, inner, generator=torch.Generator().manual_seed(seed))
    if fmt == "f32":
        return weight, weight
    if fmt == "bf16":
        return weight.bfloat16(), weight.bfloat16().float()
    blocks = kernels.quantize(weight, fmt)
    return blocks, kernels.dequantize(blocks, fmt)


def _linear(x: torch.Tensor, data: torch.Tensor, fmt: str, out: int) -> torch.Tensor:
    return torch.ops.specframe_kernels.linear(x, data, kernels.format_of(fmt).code, out)


def _layouts(data: torch.Tensor, fmt: str) -> list[tuple[torch.Tensor, int]]:
    """``(weight, operator code)`` of every layout the variant in use runs: GGUF's, and interleaved where it can."""
    code = kernels.format_of(fmt).code
    out = [(data, code)]
    if kernels.format_of(fmt).quantized and kernels.group_rows():
        out.append((kernels.repack(data, fmt, kernels.group_rows()), code + kernels.PACKED_OFFSET))
    return out


@pytest.mark.parametrize("fmt", ["q8_0", "q4_0", "q4_1"])
def test_quantize_writes_llama_cpp_blocks_byte_for_byte_and_dequantize_reads_them(fmt):
    weight = torch.randn(37, 96, generator=torch.Generator().manual_seed(3))
    weight[0, :32] = 0.0  # an all-zero block (scale 0)
    ours = kernels.quantize(weight, fmt)
    theirs = np.asarray(gguf.quants.quantize(weight.numpy(), GGML[fmt])).reshape(37, -1)
    assert ours.dtype == torch.uint8 and np.array_equal(ours.numpy(), theirs)
    decoded = gguf.quants.dequantize(theirs, GGML[fmt]).reshape(37, 96)
    assert torch.equal(kernels.dequantize(ours, fmt), torch.from_numpy(decoded))


def test_bad_formats_and_shapes_are_named():
    with pytest.raises(ValueError, match="unknown weight format 'q5_k'"):
        kernels.format_of("q5_k")
    with pytest.raises(ValueError, match="multiple of 32"):
        kernels.quantize(torch.randn(4, 40), "q8_0")
    with pytest.raises(ValueError, match="not a block format"):
        kernels.quantize(torch.randn(4, 64), "bf16")
    with pytest.raises(RuntimeError, match="expected 136 for 128 inputs"):
        _linear(torch.randn(2, 128), torch.zeros(3, 60, dtype=torch.uint8), "q8_0", 3)


@settings(max_examples=25, deadline=None)
@given(
    fmt=st.sampled_from(FORMATS),
    rows=st.integers(1, 19),
    out=st.integers(1, 23),
    blocks=st.integers(1, 5),
    extra=st.sampled_from([0, 0, 5, 17]),
    seed=st.integers(0, 2**16),
)
def test_every_row_is_bitwise_what_it_is_alone_in_every_variant(fmt, rows, out, blocks, extra, seed):
    inner = 32 * blocks + (extra if fmt in ("f32", "bf16") else 0)  # dense: tails off the vector width too
    data, _ = _weights(fmt, out, inner, seed)
    x = torch.randn(rows, inner, generator=torch.Generator().manual_seed(seed + 1))
    x = x.bfloat16() if fmt == "bf16" else x
    best = kernels.variant()
    try:
        for name in kernels.variants():
            kernels.select_variant(name)
            for weight, code in _layouts(data, fmt):
                together = torch.ops.specframe_kernels.linear(x, weight, code, out)
                for start in range(rows):
                    for count in {1, rows - start}:
                        alone = torch.ops.specframe_kernels.linear(x[start : start + count], weight, code, out)
                        assert torch.equal(alone, together[start : start + count]), (name, code, start, count)
    finally:
        kernels.select_variant(best)


@pytest.mark.parametrize("fmt", FORMATS)
def test_linear_is_close_to_float64_arithmetic(variant, fmt):
    data, weight = _weights(fmt, 45, 160, seed=5)
    x = torch.randn(6, 160, generator=torch.Generator().manual_seed(6))
    x = x.bfloat16() if fmt == "bf16" else x
    expected = F.linear(x.double(), weight.double())
    if kernels.format_of(fmt).quantized:  # activations are quantized to 8 bits per block of 32
        tolerance = 0.03 * expected.abs().max().item()
    else:
        tolerance = (1e-5 if fmt == "f32" else 1e-2) * expected.abs().max().item()
    layouts = _layouts(data, fmt)
    first = torch.ops.specframe_kernels.linear(x, *layouts[0], 45)
    for weight, code in layouts:
        got = torch.ops.specframe_kernels.linear(x, weight, code, 45)
        torch.testing.assert_close(got.double(), expected, rtol=0, atol=tolerance)
        # the layouts hold the same codes and scales: they differ only in the float order of the blocks' sums
        torch.testing.assert_close(got, first, rtol=0, atol=1e-5 * expected.abs().max().item())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("dim", "span"), [(40, 33), (128, 70)])  # a tail off the vector width; many vectors
def test_attention_matches_sdpa_and_each_row_is_bitwise_what_it_is_alone(variant, dtype, dim, span):
    generator = torch.Generator().manual_seed(7)
    rows, heads, kv_heads = 9, 6, 2
    q = torch.randn(rows, heads, dim, generator=generator).to(dtype)
    cache = torch.randn(2, span + 17, kv_heads, dim, generator=generator).to(dtype)
    visible = torch.rand(rows, span, generator=generator) < 0.6
    visible[:, 0] = True
    scale = dim**-0.5
    out = torch.ops.specframe_kernels.attention(q, cache[0], cache[1], visible, scale)
    mask = torch.zeros(rows, span).masked_fill(~visible, float("-inf"))
    expected = F.scaled_dot_product_attention(
        q.double().transpose(0, 1)[None],
        cache[0, :span].double().transpose(0, 1)[None],
        cache[1, :span].double().transpose(0, 1)[None],
        attn_mask=mask.double(),
        enable_gqa=True,
    )[0].transpose(0, 1)
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(out.double(), expected.reshape(rows, -1), rtol=tolerance, atol=tolerance)
    for r in range(rows):
        alone = torch.ops.specframe_kernels.attention(q[r : r + 1], cache[0], cache[1], visible[r : r + 1], scale)
        assert torch.equal(alone, out[r : r + 1])


@pytest.mark.parametrize("dim", [8, 16, 40, 64])
def test_attention_skips_hidden_keys_exactly(variant, dim):
    """A hidden key contributes nothing: the same visible keys with hidden ones between give the same bits.

    Packed together the visible keys fill whole groups of four (the kernel's fast path); spread out with
    hidden keys between, the same keys fall in partly hidden groups (its key-by-key path).
    """
    generator = torch.Generator().manual_seed(8)
    q = torch.randn(3, 4, dim, generator=generator)
    keys, values = torch.randn(2, 60, 2, dim, generator=generator)
    chosen = [0, 1, 2, 3, 4, 5, 6, 7, 9, 12, 13, 14, 15, 16, 18, 21, 22, 23, 24, 25, 26, 27, 30, 33, 34, 41, 47, 52]
    visible = torch.zeros(3, 60, dtype=torch.bool)
    visible[:, chosen] = True
    spread = torch.ops.specframe_kernels.attention(q, keys, values, visible, 0.25)
    packed = torch.ops.specframe_kernels.attention(
        q, keys[chosen], values[chosen], torch.ones(3, len(chosen), dtype=torch.bool), 0.25
    )
    assert torch.equal(spread, packed)


@pytest.mark.parametrize("fmt", ["q8_0", "q4_0", "q4_1"])
@pytest.mark.parametrize("group", [8, 16])
def test_repack_moves_every_byte_once_and_pads_with_zeros(fmt, group):
    blocks, _ = _weights(fmt, 21, 96, seed=2)
    packed = kernels.repack(blocks, fmt, group)
    groups = -(-21 // group)
    assert packed.shape == (groups, 3 * group * kernels.format_of(fmt).block_bytes)
    padding = groups * group * 3 * kernels.format_of(fmt).block_bytes - blocks.numel()
    assert torch.equal(packed.flatten().sort().values[padding:], blocks.flatten().sort().values)
    assert int((packed == 0).sum()) >= padding
    # row 5's scale of block 1 (its first two bytes) sits in group 0, block 1's scales, slot 5
    codes = 32 if fmt == "q8_0" else 16
    block = group * kernels.format_of(fmt).block_bytes
    scales = packed[0, block + group * codes : block + group * codes + 2 * group]
    assert torch.equal(scales[10:12], blocks[5, kernels.format_of(fmt).block_bytes :][:2])
    with pytest.raises(ValueError, match="multiple of 4"):
        kernels.repack(blocks, fmt, 6)


def test_interleaved_weights_of_another_variant_are_refused_with_what_to_do():
    grouped = [name for name in kernels.variants() if name != "portable"]
    if not grouped:
        pytest.skip("this CPU runs no SIMD variant")
    best = kernels.variant()
    blocks, _ = _weights("q4_1", 16, 64, seed=1)
    code = kernels.format_of("q4_1").code + kernels.PACKED_OFFSET
    try:
        kernels.select_variant(grouped[0])
        wrong = kernels.repack(blocks, "q4_1", 4 * kernels.group_rows())
        with pytest.raises(RuntimeError, match="load the model again after select_variant"):
            torch.ops.specframe_kernels.linear(torch.randn(1, 64), wrong, code, 16)
        kernels.select_variant("portable")
        assert kernels.group_rows() == 0
        with pytest.raises(RuntimeError, match="cannot run on the 'portable' kernels"):
            torch.ops.specframe_kernels.linear(torch.randn(1, 64), kernels.repack(blocks, "q4_1", 8), code, 16)
    finally:
        kernels.select_variant(best)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_adapt_changes_marked_rows_only_each_alone(variant, dtype):
    generator = torch.Generator().manual_seed(9)
    rows, inner, rank, out = 7, 96, 8, 40
    x = torch.randn(rows, inner, generator=generator).to(dtype)
    projected = torch.randn(rows, out, generator=generator).to(dtype)
    a = (torch.randn(rank, inner, generator=generator) / 10).to(dtype)
    b = (torch.randn(out, rank, generator=generator) / 10).to(dtype)
    marked = torch.tensor([False, True, True, False, True, False, True])
    got = torch.ops.specframe_kernels.adapt(projected, x, a, b, 2.0, marked)
    assert got.dtype == dtype and torch.equal(got[~marked], projected[~marked])
    expected = projected.double() + 2.0 * (x.double() @ a.double().T @ b.double().T)
    tolerance = 1e-5 if dtype == torch.float32 else 5e-2
    torch.testing.assert_close(got[marked].double(), expected[marked], rtol=tolerance, atol=tolerance)
    for r in range(rows):  # a marked row's update does not depend on the other rows of the call
        alone = torch.ops.specframe_kernels.adapt(projected[r : r + 1], x[r : r + 1], a, b, 2.0, marked[r : r + 1])
        assert torch.equal(alone, got[r : r + 1])
    none = torch.zeros(rows, dtype=torch.bool)
    assert torch.equal(torch.ops.specframe_kernels.adapt(projected, x, a, b, 2.0, none), projected)
    with pytest.raises(RuntimeError, match="shapes do not fit"):
        torch.ops.specframe_kernels.adapt(projected, x, b, a, 2.0, marked)


@pytest.mark.parametrize("adapter_dtype", [torch.float32, torch.bfloat16])
def test_adapt_gives_the_dense_kernel_s_products_bitwise_for_float32_rows(variant, adapter_dtype):
    """The update of float32 rows is the two products by ``linear`` (bfloat16 adapters beside 4-bit weights)."""
    generator = torch.Generator().manual_seed(5)
    rows, inner, rank, out = 6, 576, 64, 40
    x, projected = torch.randn(rows, inner, generator=generator), torch.randn(rows, out, generator=generator)
    a = (torch.randn(rank, inner, generator=generator) / 10).to(adapter_dtype)
    b = (torch.randn(out, rank, generator=generator) / 10).to(adapter_dtype)
    marked = torch.tensor([False, False, False, True, True, True])
    got = torch.ops.specframe_kernels.adapt(projected, x, a, b, 2.0, marked)
    code = kernels.format_of("f32" if adapter_dtype == torch.float32 else "bf16").code
    linear = torch.ops.specframe_kernels.linear
    update = linear(linear(x[marked], a, code, rank), b, code, out)
    assert torch.equal(got[marked], projected[marked] + update * 2.0)
    assert torch.equal(got[~marked], projected[~marked])
