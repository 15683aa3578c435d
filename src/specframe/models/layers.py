"""Building blocks shared by the model families: RMSNorm, RoPE (default and YaRN), attention, SwiGLU.

The modules hold the network's parameters under the checkpoint's names. Their own forward is training's (the
specframe-training plugin) and the test suite's reference for the inference forward: batched rows
``[B, T, ...]`` attending among themselves under a ``[B, T, T]`` mask (see :class:`ForwardContext`), with
autograd. Inference runs :mod:`specframe.models.forward` over the same parameters. Rotary embeddings are
computed from each row's own position id, so rows may carry arbitrary, scattered or repeated positions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import nn


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype reductions run in: float64 stays float64, everything else runs in float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


class RMSNorm(nn.Module):
    """Root-mean-square layer norm over the last axis, computed in at least float32.

    Args:
        size: Size of the normalised (last) axis.
        eps: Added to the mean square before the square root.
    """

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Normalise ``x`` (any shape ending in ``size``) and scale it by the learned weight."""
        wide = x.to(compute_dtype(x.dtype))
        wide = wide * torch.rsqrt(wide.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * wide.to(x.dtype)


@dataclass(frozen=True)
class RopeSpec:
    """Rotary-embedding settings as a checkpoint's config describes them.

    Attributes:
        theta: Base of the geometric frequency progression (``rope_theta``).
        kind: ``"default"`` or ``"yarn"`` (``rope_type``).
        factor: YaRN context extension factor.
        original_max_positions: Context length the model was pretrained with (YaRN's
            ``original_max_position_embeddings``).
        beta_fast: Rotations above which a frequency is kept as it is (YaRN).
        beta_slow: Rotations below which a frequency is fully interpolated (YaRN).
        mscale: YaRN magnitude scale of the numerator of the attention factor.
        mscale_all_dim: YaRN magnitude scale of the denominator of the attention factor.
        attention_factor: Explicit YaRN attention factor; derived from ``factor`` / ``mscale`` when ``None``.
        truncate: Whether YaRN rounds the correction range outwards to whole dimensions.
    """

    theta: float
    kind: str = "default"
    factor: float = 1.0
    original_max_positions: int | None = None
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float | None = None
    mscale_all_dim: float | None = None
    attention_factor: float | None = None
    truncate: bool = True


def yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    """YaRN's magnitude correction ``0.1 * mscale * ln(scale) + 1`` (1 when the context is not extended)."""
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def yarn_attention_factor(spec: RopeSpec) -> float:
    """The factor YaRN multiplies cos/sin by (so attention logits scale by its square).

    With both ``mscale`` and ``mscale_all_dim`` set it is the ratio of their magnitude corrections, hence
    exactly 1 when they are equal; otherwise it is the plain correction of ``factor``.
    """
    if spec.attention_factor is not None:
        return float(spec.attention_factor)
    if spec.mscale and spec.mscale_all_dim:
        return yarn_mscale(spec.factor, spec.mscale) / yarn_mscale(spec.factor, spec.mscale_all_dim)
    return yarn_mscale(spec.factor)


def _yarn_correction_dim(rotations: float, dim: int, base: float, context: int) -> float:
    """The (fractional) dimension whose wavelength completes ``rotations`` turns over ``context`` positions."""
    return dim * math.log(context / (rotations * 2 * math.pi)) / (2 * math.log(base))


def rope_inverse_frequencies(spec: RopeSpec, dim: int) -> tuple[torch.Tensor, float]:
    """Inverse frequencies (float64, ``[dim // 2]``) and the cos/sin scale of a rotary embedding.

    YaRN blends, dimension by dimension, the original frequency (high-frequency dimensions, many rotations
    over the original context) with the frequency divided by ``factor`` (low-frequency dimensions), along a
    linear ramp between the dimensions that rotate ``beta_fast`` and ``beta_slow`` times over
    ``original_max_positions``.

    Args:
        spec: RoPE settings.
        dim: Rotated size of a head.

    Returns:
        ``(inv_freq, attention_factor)``.
    """
    exponents = torch.arange(0, dim, 2, dtype=torch.float64) / dim
    inv_freq = 1.0 / (spec.theta**exponents)
    if spec.kind == "default":
        return inv_freq, 1.0
    if spec.kind != "yarn":
        raise ValueError(f"unsupported rope type {spec.kind!r}")
    if spec.original_max_positions is None:
        raise ValueError("YaRN needs original_max_positions")
    low = _yarn_correction_dim(spec.beta_fast, dim, spec.theta, spec.original_max_positions)
    high = _yarn_correction_dim(spec.beta_slow, dim, spec.theta, spec.original_max_positions)
    if spec.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # avoid a zero-width ramp
    ramp = ((torch.arange(dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    blended = inv_freq * (1 - ramp) + (inv_freq / spec.factor) * ramp
    return blended, yarn_attention_factor(spec)


class RotaryEmbedding:
    """Cos/sin tables for arbitrary position ids (not a module: it holds no weights).

    Args:
        spec: RoPE settings.
        dim: Head size.
        device: Where the tables live.
        dtype: Dtype of the returned cos/sin (angles are computed in float32, or float64 for float64).
    """

    def __init__(self, spec: RopeSpec, dim: int, device: torch.device, dtype: torch.dtype) -> None:
        inv_freq, self.attention_factor = rope_inverse_frequencies(spec, dim)
        self.angle_dtype = compute_dtype(dtype)
        self.inv_freq = inv_freq.to(device=device, dtype=self.angle_dtype)
        self.dtype = dtype

    def __call__(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(cos, sin)``, each ``[..., dim]``, for position ids shaped ``[...]`` (``[R]`` or ``[B, T]``)."""
        angles = positions.to(self.angle_dtype)[..., None] * self.inv_freq
        angles = torch.cat([angles, angles], dim=-1)
        cos = (angles.cos() * self.attention_factor).to(self.dtype)
        sin = (angles.sin() * self.attention_factor).to(self.dtype)
        return cos, sin


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` (``[..., heads, dim]``) by per-row angles, pairing dimension ``i`` with ``i + dim/2``."""
    first, second = x.chunk(2, dim=-1)
    rotated = torch.cat([-second, first], dim=-1)
    return x * cos[..., None, :] + rotated * sin[..., None, :]


def llama4_query_scale(positions: torch.Tensor, beta: float, length: int, dtype: torch.dtype) -> torch.Tensor:
    """Llama-4 query scaling ``1 + beta * ln(1 + floor(pos / length))`` per row (exactly 1 below ``length``)."""
    wide = positions.to(compute_dtype(dtype))
    return (1 + beta * torch.log1p(torch.floor(wide / length))).to(dtype)


@dataclass
class ForwardContext:
    """Per-call tensors shared by every layer of a batched, cache-free forward.

    Attributes:
        cos: ``[B, T, head_dim]`` rotary cosines.
        sin: ``[B, T, head_dim]`` rotary sines.
        mask: ``[B, T, P + T]`` boolean attention mask (True = may attend).
        query_scale: ``[B, T]`` per-row query multiplier, or ``None``.
        adapter_rows: ``[B, T]`` boolean rows that get low-rank adapters, or ``None``.
        prefix: Per layer, the ``[B, P, kv_heads, head_dim]`` keys and values of ``P`` earlier rows that the
            new rows also attend to (they come first in ``mask``'s last dimension).
        capture: A list that receives each layer's ``(keys, values)`` of the prefix and the new rows together
            (the prefix of a next call).
    """

    cos: torch.Tensor
    sin: torch.Tensor
    mask: torch.Tensor
    query_scale: torch.Tensor | None = None
    adapter_rows: torch.Tensor | None = None
    prefix: list[tuple[torch.Tensor, torch.Tensor]] | None = None
    capture: list[tuple[torch.Tensor, torch.Tensor]] | None = None


class LowRankUpdate(nn.Module):
    """A LoRA update ``scale * B(A(x))`` with ``A`` ``[rank, in]`` and ``B`` ``[out, rank]``."""

    def __init__(self, in_features: int, out_features: int, rank: int, scale: float) -> None:
        super().__init__()
        self.lora_A = nn.Parameter(torch.zeros(rank, in_features))
        self.lora_B = nn.Parameter(torch.zeros(out_features, rank))
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The update for inputs ``x`` (``[..., in]``)."""
        return F.linear(F.linear(x, self.lora_A), self.lora_B) * self.scale


def adapted(
    projected: torch.Tensor, x: torch.Tensor, update: LowRankUpdate | None, rows: torch.Tensor | None
) -> torch.Tensor:
    """A projection's output ``projected`` of inputs ``x``, plus ``update(x)`` on the adapter ``rows`` only.

    Other rows are ``projected`` as it is (bit for bit): the base weights' output.

    Args:
        projected: ``[..., out]`` output of the base projection.
        x: ``[..., in]`` its input.
        update: The projection's adapter, or ``None``.
        rows: ``[...]`` boolean rows that get the adapter, or ``None`` (no row).
    """
    if update is None or rows is None:
        return projected
    return torch.where(rows[..., None], projected + update(x), projected)


class Attention(nn.Module):
    """Grouped-query self-attention of new rows over cached + new keys, with q/k/v biases or none.

    Args:
        hidden_size: Model width.
        num_heads: Query heads.
        num_kv_heads: Key/value heads (``num_heads`` must be a multiple).
        head_dim: Size of one head (need not equal ``hidden_size / num_heads``).
        qk_norm_eps: When set, per-head RMSNorm ``q_norm`` / ``k_norm`` runs before RoPE (Qwen3).
        qkv_bias: Whether the query, key and value projections add a bias (Qwen2); the output projection
            never does.
    """

    def __init__(
        self,
        hidden_size: int,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        qk_norm_eps: float | None,
        qkv_bias: bool = False,
    ) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.q_proj = nn.Linear(hidden_size, num_heads * head_dim, bias=qkv_bias)
        self.k_proj = nn.Linear(hidden_size, num_kv_heads * head_dim, bias=qkv_bias)
        self.v_proj = nn.Linear(hidden_size, num_kv_heads * head_dim, bias=qkv_bias)
        self.o_proj = nn.Linear(num_heads * head_dim, hidden_size, bias=False)
        self.q_norm = RMSNorm(head_dim, qk_norm_eps) if qk_norm_eps is not None else None
        self.k_norm = RMSNorm(head_dim, qk_norm_eps) if qk_norm_eps is not None else None
        self.o_lora: LowRankUpdate | None = None

    def forward(self, x: torch.Tensor, ctx: ForwardContext, layer: int) -> torch.Tensor:
        """Attend from the batched rows ``x`` (``[B, T, hidden]``) among themselves (and the layer's prefix)."""
        q = rearrange(self.q_proj(x), "... (h d) -> ... h d", d=self.head_dim)
        k = rearrange(self.k_proj(x), "... (h d) -> ... h d", d=self.head_dim)
        v = rearrange(self.v_proj(x), "... (h d) -> ... h d", d=self.head_dim)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rotary(q, ctx.cos, ctx.sin), apply_rotary(k, ctx.cos, ctx.sin)
        if ctx.query_scale is not None:
            q = q * ctx.query_scale[..., None, None]
        if ctx.prefix is not None:
            k, v = (torch.cat([earlier, new], dim=1) for earlier, new in zip(ctx.prefix[layer], (k, v), strict=True))
        if ctx.capture is not None:
            ctx.capture.append((k, v))
        out = F.scaled_dot_product_attention(
            rearrange(q, "b t h d -> b h t d"),
            rearrange(k, "b t h d -> b h t d"),
            rearrange(v, "b t h d -> b h t d"),
            attn_mask=ctx.mask[:, None],
            enable_gqa=self.num_heads != self.num_kv_heads,
        )
        out = rearrange(out, "b h t d -> b t (h d)")
        return adapted(self.o_proj(out), out, self.o_lora, ctx.adapter_rows)


class SwiGLU(nn.Module):
    """The gated MLP ``down(silu(gate(x)) * up(x))``, without biases.

    ``down_lora``, when set, is a proposal-only adapter on ``down_proj`` (its input is
    ``silu(gate(x)) * up(x)``), applied to the rows ``ctx.adapter_rows`` marks.
    """

    def __init__(self, hidden_size: int, intermediate_size: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)
        self.down_lora: LowRankUpdate | None = None

    def forward(self, x: torch.Tensor, ctx: ForwardContext | None = None) -> torch.Tensor:
        """Apply the MLP to rows ``[..., hidden]`` (the adapter on ``ctx.adapter_rows``, given a ``ctx``)."""
        inner = F.silu(self.gate_proj(x)) * self.up_proj(x)
        return adapted(self.down_proj(inner), inner, self.down_lora, None if ctx is None else ctx.adapter_rows)


class DecoderLayer(nn.Module):
    """A pre-norm transformer block: ``x + attn(norm(x))`` then ``x + mlp(norm(x))``."""

    def __init__(
        self,
        hidden_size: int,
        intermediate_size: int,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        eps: float,
        qk_norm: bool,
        qkv_bias: bool = False,
    ) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(hidden_size, eps)
        self.self_attn = Attention(
            hidden_size, num_heads, num_kv_heads, head_dim, eps if qk_norm else None, qkv_bias=qkv_bias
        )
        self.post_attention_layernorm = RMSNorm(hidden_size, eps)
        self.mlp = SwiGLU(hidden_size, intermediate_size)

    def forward(self, x: torch.Tensor, ctx: ForwardContext, layer: int) -> torch.Tensor:
        """Run the block on batched rows ``[B, T, hidden]``."""
        x = x + self.self_attn(self.input_layernorm(x), ctx, layer)
        return x + self.mlp(self.post_attention_layernorm(x), ctx)
