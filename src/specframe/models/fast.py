"""The inference forward of a :class:`~specframe.models.transformer.DecoderNetwork`: few, large operations.

The network's modules (one ``nn.Linear`` per projection, as the checkpoint names them) serve training and
readability; inference runs this flat forward instead, built once after loading:

* one fused QKV projection and one fused gate/up projection per layer. The checkpoint's separate tensors
  are copied once into a fused matrix and the module's own parameters become views of it, so the weights
  are not held twice and in-place edits of a module's weight are seen here;
* matrices multiplied with the kernel that suits the row count and dtype (:mod:`specframe.models.kernels`);
* rotary cos/sin and Llama-4 query scales read from tables built once for every position (one gather per
  call instead of a dozen elementwise operations), with RoPE applied to queries and keys together;
* one additive attention mask per call (not one boolean-to-float conversion per layer), keys and values read
  from the cache as views, grouped-query attention without repeating keys, no einops, no dtype round trips
  in float32/float64.

Anything derived from the weights (prepacked copies, fused per-head qk-norm weights) is rebuilt when a
parameter of the network changes in place (tracked by tensor version counters) or an adapter is attached.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from specframe.models.calls import ModelCall
from specframe.models.kernels import Projection, prepack_allowed
from specframe.models.layers import RotaryEmbedding, llama4_query_scale

TABLE_BYTES_LIMIT = 64 * 2**20
"""Largest rotary table built ahead (beyond it, cos/sin are computed per call from the position ids)."""


def fuse_projections(network: nn.Module) -> None:
    """Store each layer's q/k/v and gate/up weights in one fused matrix, the module weights becoming views.

    Call once after loading (the checkpoint keeps its separate tensors; nothing is copied twice). The fused
    matrices are reachable as ``attn.qkv_weight`` and ``mlp.gate_up_weight``.
    """
    for layer in network.body.layers:
        attn, mlp = layer.self_attn, layer.mlp
        attn.qkv_weight = _fuse(attn, _FUSED[0][1])
        mlp.gate_up_weight = _fuse(mlp, _FUSED[1][1])


_FUSED = (("self_attn", ("q_proj", "k_proj", "v_proj")), ("mlp", ("gate_proj", "up_proj")))


def _fused_parts(layer: nn.Module) -> list[torch.Tensor]:
    """A layer's weights that :func:`fuse_projections` made views of a fused matrix."""
    return [getattr(getattr(layer, module), name).weight for module, names in _FUSED for name in names]


def _fuse(module: nn.Module, names: tuple[str, ...]) -> torch.Tensor:
    parts = [getattr(module, n).weight for n in names]
    fused = torch.cat([p.detach() for p in parts], dim=0)
    start = 0
    for name, part in zip(names, parts, strict=True):
        rows = part.shape[0]
        getattr(module, name).weight = nn.Parameter(fused[start : start + rows], requires_grad=part.requires_grad)
        start += rows
    return fused


@dataclass
class _Layer:
    input_norm: torch.Tensor
    post_norm: torch.Tensor
    qkv: Projection
    o: Projection
    gate_up: Projection
    down: Projection
    qk_norm: torch.Tensor | None  # [heads + kv_heads, head_dim]: q_norm then k_norm weights
    lora: nn.Module | None


class RopeTables:
    """Rotary cos and signed sin (``[-sin, sin]`` halves) for positions, plus Llama-4 query scales.

    Tables cover every position up to the model's context when they fit in :data:`TABLE_BYTES_LIMIT`;
    otherwise values are computed per call exactly as :class:`RotaryEmbedding` does.
    """

    def __init__(
        self, rotary: RotaryEmbedding, positions: int, beta: float, scale_length: int, dtype: torch.dtype
    ) -> None:
        self.rotary = rotary
        self.beta, self.scale_length, self.dtype = beta, scale_length, dtype
        dim = 2 * rotary.inv_freq.shape[0]
        self.half = dim // 2
        itemsize = torch.empty((), dtype=dtype).element_size()
        self.cos = self.sin = self.scale = None
        if 2 * positions * dim * itemsize <= TABLE_BYTES_LIMIT:
            every = torch.arange(positions, device=rotary.inv_freq.device)
            self.cos, self.sin = self._compute(every)
            self.scale = self._scale(every)

    def _compute(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        cos, sin = self.rotary(positions)
        signed = torch.cat([-sin[..., : self.half], sin[..., self.half :]], dim=-1)
        return cos, signed

    def _scale(self, positions: torch.Tensor) -> torch.Tensor | None:
        if not self.beta:
            return None
        return llama4_query_scale(positions, self.beta, self.scale_length, self.dtype)

    def lookup(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """``(cos, signed sin, query scale or None)`` for ``[R]`` position ids."""
        if self.cos is None:
            cos, sin = self._compute(positions)
            return cos, sin, self._scale(positions)
        scale = None if self.scale is None else self.scale.index_select(0, positions)
        return self.cos.index_select(0, positions), self.sin.index_select(0, positions), scale


class FastForward:
    """The inference forward of a loaded network over a KV cache (see the module docstring).

    Args:
        network: The loaded network (call :func:`fuse_projections` on it first).
        rotary: The backend's rotary embedding.
        query_scale: ``(beta, length)`` of the Llama-4 query scaling (beta 0 disables it).
        device: The weights' device.
        dtype: The weights' dtype.
    """

    def __init__(
        self,
        network: nn.Module,
        rotary: RotaryEmbedding,
        query_scale: tuple[float, int],
        device: torch.device,
        dtype: torch.dtype,
    ) -> None:
        self.network = network
        self.device, self.dtype = device, dtype
        dims = network.config.dims
        self.heads, self.kv_heads, self.head_dim = dims.num_heads, dims.num_kv_heads, dims.head_dim
        self.eps = dims.rms_norm_eps
        self.wide = dtype in (torch.float16, torch.bfloat16)  # norms run in float32 for half precision
        self.tables = RopeTables(rotary, dims.max_positions, query_scale[0], query_scale[1], dtype)
        self._watched: list[torch.Tensor] = []
        self._versions: list[int] = []
        self._lora_count = -1
        self.refresh()

    # -- weights -------------------------------------------------------------------------------------------
    def refresh(self) -> None:
        """Rebuild everything derived from the weights (called automatically when they change)."""
        body = self.network.body
        matrices = [layer.self_attn.qkv_weight for layer in body.layers]
        matrices += [layer.mlp.gate_up_weight for layer in body.layers]
        nbytes = sum(m.numel() * m.element_size() for m in matrices) * 2  # the rest is about as large again
        prepack = prepack_allowed(nbytes, self.device, self.dtype)
        self.layers = [self._layer(layer, prepack) for layer in body.layers]
        head = body.embed_tokens.weight if self.network.head is None else self.network.head.weight
        self.head = Projection(head, prepack=prepack)
        self.embed = body.embed_tokens.weight
        self.final_norm = body.norm.weight
        self.prepacked = any(p.packed is not None for x in self.layers for p in (x.qkv, x.o, x.gate_up, x.down))
        self._attention = [layer.self_attn for layer in body.layers]
        self._lora_count = self._count_lora()
        # one tensor per version counter: the q/k/v and gate/up weights are views of their fused matrix and
        # share its counter (stale() runs before every call, with its tensors out of the CPU's caches)
        fused = [layer.self_attn.qkv_weight for layer in body.layers] + [
            layer.mlp.gate_up_weight for layer in body.layers
        ]
        views = {id(p) for layer in body.layers for p in _fused_parts(layer)}
        self._watched = [p for p in self.network.parameters() if id(p) not in views] + fused
        self._versions = [t._version for t in self._watched]

    def _layer(self, layer: nn.Module, prepack: bool) -> _Layer:
        attn, mlp = layer.self_attn, layer.mlp
        qk_norm = None
        if attn.q_norm is not None and attn.k_norm is not None:
            qk_norm = torch.cat(
                [attn.q_norm.weight.expand(self.heads, -1), attn.k_norm.weight.expand(self.kv_heads, -1)]
            )
        return _Layer(
            input_norm=layer.input_layernorm.weight,
            post_norm=layer.post_attention_layernorm.weight,
            qkv=Projection(attn.qkv_weight, prepack=prepack),
            o=Projection(attn.o_proj.weight, prepack=prepack),
            gate_up=Projection(mlp.gate_up_weight, prepack=prepack),
            down=Projection(mlp.down_proj.weight, prepack=prepack),
            qk_norm=qk_norm,
            lora=attn.o_lora,
        )

    @property
    def has_lora(self) -> bool:
        """Whether a proposal-only adapter is attached."""
        return self._lora_count > 0

    def _count_lora(self) -> int:
        return sum(attention.o_lora is not None for attention in self._attention)

    def stale(self) -> bool:
        """Whether a weight changed in place or an adapter was attached since the last :meth:`refresh`."""
        if self._count_lora() != self._lora_count:
            return True
        return [t._version for t in self._watched] != self._versions

    # -- the forward ---------------------------------------------------------------------------------------
    def _norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        # the formula of RMSNorm (fewer operations than F.rms_norm, which decomposes on the CPU)
        wide = x.float() if self.wide else x
        wide = wide * torch.rsqrt(wide.pow(2).mean(-1, keepdim=True).add_(self.eps))
        return weight * (wide.to(x.dtype) if self.wide else wide)

    def hidden(self, call: ModelCall) -> torch.Tensor:
        """Final normalised hidden states of the call's output rows; stages the rows' keys and values."""
        if self.stale():
            self.refresh()
        cache, input_ids, position_ids, attention = call.cache, call.input_ids, call.position_ids, call.attention
        adapter_rows = call.adapter_rows
        rows = input_ids.shape[0]
        cache.reserve(rows)
        start = cache.length
        cos, sin, scale = self.tables.lookup(position_ids)
        cos, sin = cos[:, None], sin[:, None]
        mask = torch.zeros(rows, start + rows, dtype=self.dtype, device=self.device)
        mask[:, start:].masked_fill_(~attention, float("-inf"))
        h, kv, d = self.heads, self.kv_heads, self.head_dim
        half = d // 2
        gqa = h != kv
        x = F.embedding(input_ids, self.embed)
        for index, layer in enumerate(self.layers):
            qkv = layer.qkv(self._norm(x, layer.input_norm))
            qk = qkv[:, : (h + kv) * d].view(rows, h + kv, d)
            if layer.qk_norm is not None:
                qk = self._norm(qk, layer.qk_norm)
            rotated = torch.cat([qk[..., half:], qk[..., :half]], dim=-1)
            qk = torch.addcmul(qk * cos, rotated, sin)
            q = qk[:, :h]
            if scale is not None:
                q = q * scale[:, None, None]
            keys, values = cache.write(index, qk[:, h:], qkv[:, (h + kv) * d :].view(rows, kv, d))
            out = F.scaled_dot_product_attention(
                q.transpose(0, 1)[None],
                keys.transpose(0, 1)[None],
                values.transpose(0, 1)[None],
                attn_mask=mask,
                enable_gqa=gqa,
            )
            out = out[0].transpose(0, 1).reshape(rows, h * d)
            projected = layer.o(out)
            if layer.lora is not None and adapter_rows is not None:
                projected = torch.where(adapter_rows[:, None], projected + layer.lora(out), projected)
            x = x + projected
            gate_up = layer.gate_up(self._norm(x, layer.post_norm))
            inner = gate_up.shape[1] // 2
            x = x + layer.down(F.silu(gate_up[:, :inner]) * gate_up[:, inner:])
        if call.output_rows is not None:
            x = x.index_select(0, call.output_rows)
        return self._norm(x, self.final_norm)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Output-layer logits of final hidden states."""
        return self.head(hidden)
