"""Shared layers against their defining formulas (and transformers' RoPE initialisers where installed)."""

from __future__ import annotations

import math

import pytest
import torch

from specframe.models.layers import (
    RMSNorm,
    RopeSpec,
    RotaryEmbedding,
    apply_rotary,
    llama4_query_scale,
    rope_inverse_frequencies,
    yarn_attention_factor,
)

YARN = RopeSpec(theta=1e6, kind="yarn", factor=16.0, original_max_positions=16384, mscale=1.0, mscale_all_dim=1.0)


def test_rmsnorm_matches_formula_in_float64():
    norm = RMSNorm(8, eps=1e-6).double()
    with torch.no_grad():
        norm.weight.copy_(torch.linspace(0.5, 1.5, 8, dtype=torch.float64))
    x = torch.randn(3, 8, dtype=torch.float64)
    expected = x / torch.sqrt((x**2).mean(-1, keepdim=True) + 1e-6) * norm.weight
    torch.testing.assert_close(norm(x), expected, rtol=0, atol=1e-14)


def test_default_rope_frequencies_and_relative_positions():
    inv_freq, factor = rope_inverse_frequencies(RopeSpec(theta=10000.0), 16)
    expected = torch.tensor([10000.0 ** (-2 * i / 16) for i in range(8)], dtype=torch.float64)
    torch.testing.assert_close(inv_freq, expected)
    assert factor == 1.0
    rotary = RotaryEmbedding(RopeSpec(theta=10000.0), 16, torch.device("cpu"), torch.float64)
    q, k = torch.randn(1, 1, 16, dtype=torch.float64), torch.randn(1, 1, 16, dtype=torch.float64)
    # scattered, unsorted positions: the score depends only on the distance between positions
    positions = torch.tensor([907, 3, 40, 944])
    cos, sin = rotary(positions)
    rq = apply_rotary(q.expand(4, 1, 16), cos, sin)
    rk = apply_rotary(k.expand(4, 1, 16), cos, sin)
    assert torch.allclose((rq[0] * rk[3]).sum(), (rq[1] * rk[2]).sum(), atol=1e-10)  # both at distance 37
    torch.testing.assert_close(rq.norm(dim=-1), q.norm(dim=-1).expand(4, 1))  # rotations keep norms


def test_yarn_attention_factor_cases():
    assert yarn_attention_factor(YARN) == 1.0  # mscale == mscale_all_dim
    no_mscale = RopeSpec(theta=1e6, kind="yarn", factor=16.0, original_max_positions=16384)
    assert yarn_attention_factor(no_mscale) == pytest.approx(0.1 * math.log(16) + 1)
    uneven = RopeSpec(theta=1e6, kind="yarn", factor=16.0, original_max_positions=16384, mscale=1.0, mscale_all_dim=0.5)
    assert yarn_attention_factor(uneven) == pytest.approx((0.1 * math.log(16) + 1) / (0.05 * math.log(16) + 1))
    explicit = RopeSpec(theta=1e6, kind="yarn", factor=16.0, original_max_positions=16384, attention_factor=1.3)
    assert yarn_attention_factor(explicit) == 1.3


def test_yarn_keeps_fast_dimensions_and_interpolates_slow_ones():
    default, _ = rope_inverse_frequencies(RopeSpec(theta=1e6), 128)
    yarn, factor = rope_inverse_frequencies(YARN, 128)
    assert factor == 1.0
    wavelengths = 2 * math.pi / default
    fast = wavelengths < 16384 / 32  # more than beta_fast rotations over the original context
    slow = wavelengths > 16384 / 1  # less than beta_slow rotations
    assert fast.any() and slow.any()
    torch.testing.assert_close(yarn[fast], default[fast])
    torch.testing.assert_close(yarn[slow], default[slow] / 16)


@pytest.mark.parametrize(
    "params",
    [
        {"mscale": 1.0, "mscale_all_dim": 1.0},
        {"mscale": 1.0, "mscale_all_dim": 0.5},
        {},
        {"beta_fast": 16.0, "beta_slow": 2.0, "truncate": False},
    ],
)
def test_yarn_matches_transformers(params):
    rope_utils = pytest.importorskip("transformers.modeling_rope_utils")
    from transformers import Ministral3Config

    rope = {"rope_type": "yarn", "rope_theta": 1e6, "factor": 8.0, "original_max_position_embeddings": 4096, **params}
    config = Ministral3Config(
        hidden_size=256, num_attention_heads=4, head_dim=64, max_position_embeddings=32768, rope_parameters=rope
    )
    reference, reference_factor = rope_utils.ROPE_INIT_FUNCTIONS["yarn"](config, "cpu")
    spec = RopeSpec(
        theta=1e6,
        kind="yarn",
        factor=8.0,
        original_max_positions=4096,
        beta_fast=params.get("beta_fast", 32.0),
        beta_slow=params.get("beta_slow", 1.0),
        mscale=params.get("mscale"),
        mscale_all_dim=params.get("mscale_all_dim"),
        truncate=params.get("truncate", True),
    )
    inv_freq, factor = rope_inverse_frequencies(spec, 64)
    torch.testing.assert_close(inv_freq.float(), reference, rtol=1e-6, atol=0)
    assert factor == pytest.approx(reference_factor)


def test_yarn_attention_factor_scales_cos_and_sin():
    spec = RopeSpec(theta=1e4, kind="yarn", factor=4.0, original_max_positions=64)
    rotary = RotaryEmbedding(spec, 8, torch.device("cpu"), torch.float64)
    cos, sin = rotary(torch.tensor([5, 70]))
    torch.testing.assert_close(cos**2 + sin**2, torch.full_like(cos, yarn_attention_factor(spec) ** 2))


def test_llama4_query_scale_is_one_below_the_original_context():
    positions = torch.tensor([0, 1, 16383, 16384, 3 * 16384, 100_000])
    scale = llama4_query_scale(positions, 0.1, 16384, torch.float64)
    expected = [1, 1, 1, 1 + 0.1 * math.log(2), 1 + 0.1 * math.log(4), 1 + 0.1 * math.log(1 + 100_000 // 16384)]
    torch.testing.assert_close(scale, torch.tensor(expected, dtype=torch.float64))
    assert (scale[:3] == 1).all()
