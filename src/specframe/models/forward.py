"""How a call's rows become logits: the one inference forward of the transformer families.

A call is ``R`` new rows (token ids, position ids, an ``[R, R]`` mask among them) evaluated against a
request's :class:`~specframe.models.cache.KVCache`, a fixed-capacity buffer written by index. Every path runs
:func:`step`, a plain function of the model's :class:`Weights` and the call's tensors:

* **eager** (the default): :class:`Forward` builds the mask and the rows' cache slots and calls :func:`step`;
* **batched** (:meth:`Forward.run` with several requests): the requests' rows are concatenated, so the
  embedding, every projection, the MLP and the output layer run once over all of them, while attention runs
  per request over its own cache (it never crosses requests);
* **compiled** (:mod:`specframe.models.compiled`): :func:`graph_call`, which builds the mask inside the graph
  from the cache length and then calls the same :func:`step`, wrapped by ``torch.compile``.

Weights are built once at load: each layer's q/k/v and gate/up matrices are fused into one matrix
(:func:`fuse`; the network's own parameters become views of it, so nothing is held twice, training and export
still see the checkpoint's tensors, and in-place edits reach the fused matrix). A projection is an object
called on ``[R, in]`` rows; the kernel is chosen by swapping that object (:class:`Linear` by default, the CPU
kernels of :mod:`specframe.models.cpu` where they apply, their graph-friendly forms in compiled graphs). With
specframe's row-invariant kernels (``Weights.invariant``) attention is their operator too, each request's rows
over its own cache, so every row's logits are bitwise what a one-row call gives it; an eager call then runs all
its layers as one operator call (:class:`LayerProgram`), the same operators in the same order without a trip
through Python for each.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import pad_sequence

from specframe.models.base import ModelCall
from specframe.models.cache import KVCache
from specframe.models.layers import RotaryEmbedding, llama4_query_scale

TABLE_BYTES_LIMIT = 64 * 2**20
"""Largest rotary table built ahead (beyond it, cos/sin are computed per call from the position ids)."""


class Linear:
    """The default projection ``x @ weight.T`` (``F.linear``) of a bias-free ``[out, in]`` weight.

    Args:
        weight: The ``[out, in]`` matrix.
        blocks: Its checkpoint's block-quantized form ``(format, uint8 blocks)``, which only a kernel that
            runs blocks takes (:func:`specframe.models.cpu.kernel` refuses such a model elsewhere).
    """

    __slots__ = ("weight",)

    def __init__(self, weight: torch.Tensor, blocks: Blocks | None = None) -> None:
        self.weight = weight

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """``x @ weight.T`` for ``x`` shaped ``[R, in]``."""
        return F.linear(x, self.weight)

    def for_graph(self) -> Linear:
        """The form of this projection a compiled graph calls (kernels that pick by row count cannot)."""
        return self

    @property
    def quantized(self) -> bool:
        """Whether the projection runs block-quantized weights (a kernel's; this one runs ``weight``)."""
        return False

    @property
    def operator(self) -> tuple[torch.Tensor, int, int] | None:
        """``(data, format code, out_features)`` when this projection is ``specframe_kernels::linear``.

        A whole layer then runs as one operator call (:class:`LayerProgram`); ``None`` here.
        """
        return None


Blocks = tuple[str, torch.Tensor]
"""A matrix stored block-quantized: its format (``"q4_1"``, ...) and its ``uint8`` blocks
(:mod:`specframe.kernels.quant`)."""

Adapter = tuple[torch.Tensor, torch.Tensor, float]
"""A proposal-only LoRA on a projection: ``(A [rank, in], B [out, rank], scale)``."""

Kernel = Callable[..., Linear]
"""Makes the projection object of a weight, ``kernel(weight, blocks=None)``: :class:`Linear`, or a CPU kernel
(:func:`specframe.models.cpu.kernel`)."""


@dataclass
class LayerWeights:
    """One decoder layer's tensors and projections.

    Attributes:
        input_norm: Attention RMSNorm weight.
        post_norm: MLP RMSNorm weight.
        qkv: Fused q/k/v projection (``[(heads + 2 kv_heads) head_dim, hidden]``).
        o: Attention output projection.
        gate_up: Fused gate/up projection (``[2 intermediate, hidden]``).
        down: MLP output projection.
        qk_norm: ``[heads + kv_heads, head_dim]`` per-head q_norm then k_norm weights (Qwen3), or ``None``.
        qkv_bias: ``[(heads + 2 kv_heads) head_dim]`` fused q/k/v biases (Qwen2), added to every row after the
            projection (an elementwise add per row, so rows stay invariant), or ``None``.
        lora: The proposal-only adapter on the attention output projection ``o``, or ``None``.
        down_lora: The proposal-only adapter on the MLP output projection ``down``, or ``None``.
    """

    input_norm: torch.Tensor
    post_norm: torch.Tensor
    qkv: Linear
    o: Linear
    gate_up: Linear
    down: Linear
    qk_norm: torch.Tensor | None
    lora: Adapter | None
    qkv_bias: torch.Tensor | None = None
    down_lora: Adapter | None = None

    def adapters(self) -> tuple[Adapter | None, Adapter | None]:
        """The layer's adapters: on ``o``, then on ``down`` (each ``None`` when absent)."""
        return self.lora, self.down_lora


@dataclass
class Weights:
    """Everything :func:`step` reads besides the call: weights, rotary tables and sizes."""

    embed: torch.Tensor
    layers: list[LayerWeights]
    final_norm: torch.Tensor
    head: Linear
    tables: RopeTables
    heads: int
    kv_heads: int
    head_dim: int
    eps: float
    wide: bool  # half precision: norms and softmax run in float32
    dtype: torch.dtype
    invariant: bool = False  # attention by specframe's row-invariant kernel (masks are then bool "visible")
    program: LayerProgram | None = None  # the layers as one operator call (eager calls on the invariant kernels)

    def for_graph(self) -> Weights:
        """These weights with every projection swapped for the form a compiled graph calls."""
        graph = [dataclasses.replace(x, **{n: getattr(x, n).for_graph() for n in _PROJECTIONS}) for x in self.layers]
        return dataclasses.replace(self, layers=graph, head=self.head.for_graph(), program=None)

    def tensors(self) -> Iterator[torch.Tensor]:
        """Every tensor the step reads (for CUDA graphs, which must read them in place)."""
        for value in (self.embed, self.final_norm, self.tables.cos, self.tables.sin, self.tables.scale):
            if value is not None:
                yield value
        for layer in self.layers:
            yield from (layer.input_norm, layer.post_norm, *(getattr(layer, n).weight for n in _PROJECTIONS))
            yield from (t for t in (layer.qk_norm, layer.qkv_bias) if t is not None)
            yield from (t for adapter in layer.adapters() if adapter is not None for t in adapter[:2])


_PROJECTIONS = ("qkv", "o", "gate_up", "down")


@dataclass(frozen=True)
class LayerProgram:
    """Every decoder layer as the arguments of one ``specframe_kernels::decode_layers`` call.

    That operator runs, per layer, the same invariant operators :func:`step` calls one by one (RMSNorm, the
    projections, RoPE, the cache writes, attention, the adapters, SiLU x up, the residual adds), in the same
    order, so its rows are bitwise the step's; it only spares the ~15 trips through Python and torch's
    dispatcher a layer costs (about a millisecond of a 1-row SmolLM2-135M call on a 2-core EPYC).

    Attributes:
        tensors: 12 a layer: the two norms, the four projections' data, the qkv bias, the ``o`` and ``down``
            adapters' A and B and the per-head q/k norm weights (``None`` where absent).
        codes: 8 a layer: each projection's format code and output features.
        scales: 2 a layer: the adapters' scales.
    """

    tensors: list[torch.Tensor | None]
    codes: list[int]
    scales: list[float]

    @classmethod
    def of(cls, layers: Sequence[LayerWeights], invariant: bool) -> LayerProgram | None:
        """The program of ``layers``, or ``None`` where the step must run them itself.

        That is: torch's kernels, a projection that is not the invariant operator, a norm or bias in another
        dtype than the rest, or an adapter whose dtype the ``adapt`` operator does not take.
        """
        if not invariant or not layers:
            return None
        x_dtype = layers[0].input_norm.dtype
        tensors: list[torch.Tensor | None] = []
        codes: list[int] = []
        scales: list[float] = []
        for layer in layers:
            operators = [getattr(layer, name).operator for name in _PROJECTIONS]
            own = (layer.input_norm, layer.post_norm, layer.qkv_bias, layer.qk_norm)  # the model's dtype, unpromoted
            if any(op is None for op in operators) or any(t is not None and t.dtype != x_dtype for t in own):
                return None
            tensors += [layer.input_norm, layer.post_norm, *(op[0] for op in operators), layer.qkv_bias]  # type: ignore[index]
            codes += [value for op in operators for value in op[1:]]  # type: ignore[index]
            for adapter in layer.adapters():
                if adapter is not None and adapter[0].dtype not in (torch.float32, torch.bfloat16):
                    return None
                tensors += [None, None] if adapter is None else [adapter[0], adapter[1]]
                scales.append(0.0 if adapter is None else adapter[2])
            tensors.append(layer.qk_norm)
        return cls(tensors, codes, scales)

    def run(
        self,
        w: Weights,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        scale: torch.Tensor | None,
        segments: Sequence[Segment],
        adapter_rows: torch.Tensor | None,
    ) -> torch.Tensor | None:
        """The layers' output for ``x``.

        ``None`` where the call needs the step's own loop (a compiled graph's cache slots).
        """
        starts, slots = [], []
        for _, _, _, slot, row_map in segments:
            if isinstance(slot, slice):
                starts.append(slot.start)
                slots.append(None)
            elif row_map is not None:  # a paged cache: the new rows' pool rows
                starts.append(0)
                slots.append(slot)
            else:
                return None
        return torch.ops.specframe_kernels.decode_layers(
            x,
            self.tensors,
            self.codes,
            self.scales,
            cos,
            sin,
            [segment[0] for segment in segments],
            [segment[1] for segment in segments],
            starts,
            slots,
            [segment[2] for segment in segments],
            [segment[4] for segment in segments],
            [w.heads, w.kv_heads, w.head_dim],
            w.eps,
            w.head_dim**-0.5,
            adapter_rows,
            scale,
        )


_FUSED = (
    ("self_attn", ("q_proj", "k_proj", "v_proj"), "qkv_weight"),
    ("mlp", ("gate_proj", "up_proj"), "gate_up_weight"),
)


def fuse(network: nn.Module) -> None:
    """Store each layer's q/k/v and gate/up weights in one matrix whose row blocks become the module weights.

    Called once at load. The fused matrices are reachable as ``self_attn.qkv_weight`` and
    ``mlp.gate_up_weight``; the modules keep their checkpoint names (for training and export). q/k/v biases,
    where the network has them, are fused the same way into ``self_attn.qkv_bias``.
    """
    for layer in network.body.layers:
        for module_name, names, fused_name in _FUSED:
            module = getattr(layer, module_name)
            setattr(module, fused_name, _fuse_parameters(module, names, "weight"))
            if getattr(module, names[0]).bias is not None:
                setattr(module, fused_name.replace("weight", "bias"), _fuse_parameters(module, names, "bias"))


def _fuse_parameters(module: nn.Module, names: tuple[str, ...], kind: str) -> torch.Tensor:
    """One tensor of the submodules' ``kind`` parameters stacked, which become views of its row blocks."""
    parts = [getattr(getattr(module, n), kind) for n in names]
    fused = torch.cat([p.detach() for p in parts], dim=0)
    start = 0
    for name, part in zip(names, parts, strict=True):
        rows = part.shape[0]
        view = nn.Parameter(fused[start : start + rows], requires_grad=part.requires_grad)
        setattr(getattr(module, name), kind, view)
        start += rows
    return fused


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
        return cos, torch.cat([-sin[..., : self.half], sin[..., self.half :]], dim=-1)

    def _scale(self, positions: torch.Tensor) -> torch.Tensor | None:
        return llama4_query_scale(positions, self.beta, self.scale_length, self.dtype) if self.beta else None

    def lookup(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """``(cos, signed sin, query scale or None)`` for ``[R]`` position ids."""
        if self.cos is None:
            cos, sin = self._compute(positions)
            return cos, sin, self._scale(positions)
        scale = None if self.scale is None else self.scale.index_select(0, positions)
        return self.cos.index_select(0, positions), self.sin.index_select(0, positions), scale


# -- the step ------------------------------------------------------------------------------------------------
Segment = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | slice, torch.Tensor | None]
"""One request's share of a step: its cache's ``keys`` and ``values`` buffers (``[layers, capacity, kv, dim]``),
its attention mask over the cache rows ``0 .. span`` and the cache rows its new rows' keys and values are
written to: eagerly a ``[rows, span]`` mask and a slice, in graphs a ``[group * rows, span]`` mask (query heads
of one kv head stacked, :func:`graph_mask`) and a ``[rows]`` tensor. With the invariant kernels
(``Weights.invariant``) the mask is a bool ``[rows, span]`` "visible" mask on every path. The last item is
``None``, or for a paged cache (:mod:`specframe.models.paged`) the pool row of each of the span's rows (its new
rows' are then a ``[rows]`` tensor of pool rows): attention reads them in place."""


def step(
    w: Weights,
    input_ids: torch.Tensor,
    position_ids: torch.Tensor,
    segments: Sequence[Segment],
    adapter_rows: torch.Tensor | None = None,
    output_rows: torch.Tensor | None = None,
) -> torch.Tensor:
    """Final normalised hidden states of a step's ``output_rows`` (all rows when ``None``).

    The rows are the segments' rows in order; each segment's rows write their keys and values into their
    cache and attend over it under their own mask (several eager segments through :class:`Padded`).
    Everything else runs once over all rows.

    Args:
        w: The model's weights.
        input_ids: ``[R]`` token ids.
        position_ids: ``[R]`` position ids.
        segments: One :data:`Segment` per request, their rows consecutive.
        adapter_rows: ``[R]`` rows that get the adapter (when the weights have one), or ``None``.
        output_rows: ``[K]`` rows to return, or ``None``.
    """
    cos, sin, scale = w.tables.lookup(position_ids)
    cos, sin = cos[:, None], sin[:, None]
    x = F.embedding(input_ids, w.embed)
    layered = None
    if w.program is not None and not torch.compiler.is_compiling():
        layered = w.program.run(w, x, cos, sin, scale, segments, adapter_rows)
    if layered is not None:  # the same operators as the loop below, in one call
        x = layered
    else:
        padded = Padded.of(w, segments)
        for index, layer in enumerate(w.layers):
            attention_input = _norm(w, x, layer.input_norm)
            x = x + _attention(w, layer, index, attention_input, cos, sin, scale, segments, adapter_rows, padded)
            inner = _silu_mul(w, layer.gate_up(_norm(w, x, layer.post_norm)))
            x = x + _adapt(w, layer.down(inner), inner, layer.down_lora, adapter_rows)
    if output_rows is not None:
        x = x.index_select(0, output_rows)
    return _norm(w, x, w.final_norm)


def _norm(w: Weights, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """RMSNorm over the last axis (in float32 for half precision; rows by the invariant kernel where it runs).

    ``x`` is ``[R, size]``, or ``[R, heads, size]`` with a ``[heads, size]`` weight (per-head q/k norms).
    """
    if w.invariant:
        if x.dim() == 2:
            return torch.ops.specframe_kernels.rms_norm(x, weight, w.eps)
        return torch.ops.specframe_kernels.rms_norm(x.reshape(-1, x.shape[-1]), weight, w.eps).view(x.shape)
    wide = x.float() if w.wide else x
    wide = wide * torch.rsqrt(wide.pow(2).mean(-1, keepdim=True) + w.eps)
    return weight * (wide.to(x.dtype) if w.wide else wide)


def _silu_mul(w: Weights, gate_up: torch.Tensor) -> torch.Tensor:
    """SiLU(gate) x up of ``[R, 2 inner]`` rows (rows by the invariant kernel where it runs)."""
    if w.invariant:
        return torch.ops.specframe_kernels.silu_mul(gate_up)
    inner = gate_up.shape[1] // 2
    return F.silu(gate_up[:, :inner]) * gate_up[:, inner:]


def _rope(w: Weights, qk: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding of ``[R, heads, dim]`` by cos and signed sin (rows by the invariant kernel where it runs)."""
    if w.invariant:
        return torch.ops.specframe_kernels.rope(qk, cos, sin)
    half = qk.shape[-1] // 2
    return torch.addcmul(qk * cos, torch.cat([qk[..., half:], qk[..., :half]], dim=-1), sin)


def _attention(
    w: Weights,
    layer: LayerWeights,
    index: int,
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    scale: torch.Tensor | None,
    segments: Sequence[Segment],
    adapter_rows: torch.Tensor | None,
    padded: Padded | None = None,
) -> torch.Tensor:
    h, kv, d = w.heads, w.kv_heads, w.head_dim
    rows = x.shape[0]
    qkv = layer.qkv(x)
    if layer.qkv_bias is not None:
        qkv = qkv + layer.qkv_bias
    qkv = qkv.view(rows, h + 2 * kv, d)
    qk = qkv[:, : h + kv]
    if layer.qk_norm is not None:
        qk = _norm(w, qk, layer.qk_norm)
    qk = _rope(w, qk, cos, sin)
    q, k, v = qk[:, :h], qk[:, h:], qkv[:, h + kv :]
    if scale is not None:
        q = q * scale[:, None, None]
    if padded is not None:
        out = padded.attend(w, index, q, k, v, segments)
    elif len(segments) == 1:  # one request (eager or in a graph)
        out = _attend(w, index, q, k, v, *segments[0])
    else:  # invariant kernels: each request's rows attend alone, as they would in a call of their own
        outs, start = [], 0
        for segment in segments:
            end = start + _count(segment[3])
            outs.append(_attend(w, index, q[start:end], k[start:end], v[start:end], *segment))
            start = end
        out = torch.cat(outs)
    return _adapt(w, layer.o(out), out, layer.lora, adapter_rows)


def _adapt(
    w: Weights, projected: torch.Tensor, x: torch.Tensor, adapter: Adapter | None, rows: torch.Tensor | None
) -> torch.Tensor:
    """A projection's output ``projected`` of ``[R, in]`` inputs ``x``, plus its adapter's update on ``rows``.

    The other rows are ``projected`` bit for bit (the base weights' output).
    """
    if adapter is None or rows is None:
        return projected
    a, b, scale = adapter
    if w.invariant and {a.dtype, x.dtype} <= {torch.float32, torch.bfloat16}:
        # one operator call (five small ones cost about 28 us a layer on a 2-core EPYC, a sixth of a Q4_1 call)
        return torch.ops.specframe_kernels.adapt(projected, x, a, b, scale, rows)
    update = F.linear(F.linear(x, a), b) * scale
    return torch.where(rows[:, None], projected + update, projected)


def _count(slots: torch.Tensor | slice) -> int:
    """Rows a segment's new rows take: a slice's length or a tensor's."""
    return slots.stop - slots.start if isinstance(slots, slice) else int(slots.shape[0])


def _attend(
    w: Weights,
    index: int,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    slots: torch.Tensor | slice,
    rows_map: torch.Tensor | None = None,
) -> torch.Tensor:
    """One request's rows: write their keys and values into its cache, attend over its first ``span`` rows.

    Eagerly (``slots`` a slice) one ``scaled_dot_product_attention`` under a ``[rows, span]`` mask; in graphs
    (``slots`` a tensor) the same product spelt out under a ``[group * rows, span]`` mask, whose explicit copies
    and ``bmm`` keep the graph from guarding on a row count of 1 (``reshape``, ``@`` and SDPA's checks would ask).
    A paged cache's rows (``rows_map``) are read in place by the invariant kernel, gathered for torch's.
    """
    kv, d = w.kv_heads, w.head_dim
    rows, group, span = q.shape[0], w.heads // kv, mask.shape[1]
    if isinstance(slots, slice):  # eager: consecutive rows, one copy each
        keys[index, slots] = k
        values[index, slots] = v
    elif rows_map is not None:  # a paged cache (eager): the new rows into their pool rows
        keys[index].index_copy_(0, slots, k)
        values[index].index_copy_(0, slots, v)
    else:  # indexed on the cache itself: through a view of it, a graph would copy the whole cache every layer
        at = (torch.full_like(slots, index), slots)
        keys.index_put_(at, k)
        values.index_put_(at, v)
    if mask.dtype == torch.bool:  # the invariant kernel: each (row, head) over its visible keys in key order
        return torch.ops.specframe_kernels.attention(q, keys[index], values[index], mask, d**-0.5, rows_map)
    if rows_map is not None:  # torch's attention on a paged cache: the span's rows gathered, then as eagerly
        out = F.scaled_dot_product_attention(
            q.transpose(0, 1)[None],
            keys[index].index_select(0, rows_map).transpose(0, 1)[None],
            values[index].index_select(0, rows_map).transpose(0, 1)[None],
            attn_mask=mask,
            enable_gqa=group > 1,
        )
        return out[0].transpose(0, 1).reshape(rows, w.heads * d)
    if isinstance(slots, slice):  # eager: one attention kernel
        out = F.scaled_dot_product_attention(
            q.transpose(0, 1)[None],
            keys[index, :span].transpose(0, 1)[None],
            values[index, :span].transpose(0, 1)[None],
            attn_mask=mask,
            enable_gqa=group > 1,
        )
        return out[0].transpose(0, 1).reshape(rows, w.heads * d)
    cached_k = keys[index].narrow(0, 0, span).transpose(0, 1)  # [kv, span, d]
    cached_v = values[index].narrow(0, 0, span).transpose(0, 1)
    grouped = _copy(q.transpose(0, 1)).view(kv, group * rows, d) * d**-0.5  # heads h = kv x group
    scores = torch.bmm(grouped, cached_k.transpose(1, 2))  # [kv, group * rows, span]
    weights = torch.softmax((scores + mask).to(torch.float32 if w.wide else w.dtype), dim=-1).to(w.dtype)
    out = torch.bmm(weights, cached_v)
    return _copy(out.view(kv, group, rows, d).permute(2, 0, 1, 3)).view(rows, kv * group * d)


class Padded:
    """Several requests' eager attention in a few kernels: requests of alike shapes padded to a common one.

    Requests are grouped by their new rows (1, 2, 3-4, 5-8, ...); a group whose padding would more than double
    its attention work (cache spans far apart, such as a long prompt's among short ones) is split into single
    requests. Each request's new keys and values are still written into its own cache; a group's cache spans
    are then padded into one ``[requests, span, kv, dim]`` block and its rows attend at once under a
    ``[requests, 1, rows, span]`` mask that hides the padding. A padding row sees one key, so that no softmax
    is empty; its output is dropped.

    Args:
        segments: The step's eager segments (cache slices), their rows consecutive.
        dtype: The activations' dtype.
    """

    def __init__(self, segments: Sequence[Segment], dtype: torch.dtype) -> None:
        rows = [slots.stop - slots.start for _, _, _, slots, _ in segments]
        spans = [mask.shape[1] for _, _, mask, _, _ in segments]
        starts = [sum(rows[:i]) for i in range(len(rows))]
        buckets: dict[int, list[int]] = {}
        for index, n in enumerate(rows):
            buckets.setdefault((n - 1).bit_length(), []).append(index)
        self.groups: list[tuple[list[int], torch.Tensor, torch.Tensor]] = []  # (requests, gather, mask)
        place = [0] * sum(rows)  # each row's place in the groups' padded outputs, concatenated
        done = 0
        for members in buckets.values():
            most, widest = max(rows[i] for i in members), max(spans[i] for i in members)
            if len(members) * most * widest > 2 * sum(rows[i] * spans[i] for i in members):
                groups = [[i] for i in members]
            else:
                groups = [members]
            for group in groups:
                most, widest = max(rows[i] for i in group), max(spans[i] for i in group)
                device = segments[group[0]][2].device
                mask = torch.full((len(group), 1, most, widest), float("-inf"), dtype=dtype, device=device)
                gather = []
                for slot, i in enumerate(group):
                    mask[slot, 0, : rows[i], : spans[i]] = segments[i][2]
                    mask[slot, 0, rows[i] :, 0] = 0.0
                    gather += [*range(starts[i], starts[i] + rows[i]), *[starts[i]] * (most - rows[i])]
                    for r in range(rows[i]):
                        place[starts[i] + r] = done + slot * most + r
                done += len(group) * most
                self.groups.append((group, torch.tensor(gather, device=device), mask))
        self.spans = spans
        self.scatter = torch.tensor(place, device=segments[0][2].device)

    @classmethod
    def of(cls, w: Weights, segments: Sequence[Segment]) -> Padded | None:
        """The grouped layout of eager ``segments``; ``None`` for one request, in graphs or with invariant kernels."""
        if w.invariant or len(segments) < 2 or not all(isinstance(slots, slice) for _, _, _, slots, _ in segments):
            return None
        return cls(segments, w.dtype)

    def attend(
        self,
        w: Weights,
        index: int,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        segments: Sequence[Segment],
    ) -> torch.Tensor:
        """Layer ``index``'s attention output of all rows, in the rows' order (``[rows, heads * dim]``)."""
        start = 0
        for keys, values, _, slots, _ in segments:
            end = start + slots.stop - slots.start
            keys[index, slots] = k[start:end]
            values[index, slots] = v[start:end]
            start = end
        outs = []
        for group, gather, mask in self.groups:
            cached = [(segments[i][0][index, : self.spans[i]], segments[i][1][index, : self.spans[i]]) for i in group]
            count, most = mask.shape[0], mask.shape[2]
            queries = q.index_select(0, gather).view(count, most, w.heads, w.head_dim).transpose(1, 2)
            if len(cached) == 1:  # a request alone: its cache span as it is, no padded copy
                keys, values = cached[0][0][None], cached[0][1][None]
            else:
                keys = pad_sequence([key for key, _ in cached], batch_first=True)
                values = pad_sequence([value for _, value in cached], batch_first=True)
            out = F.scaled_dot_product_attention(
                queries,
                keys.transpose(1, 2),
                values.transpose(1, 2),
                attn_mask=mask,
                enable_gqa=w.heads > w.kv_heads,
            )
            outs.append(out.transpose(1, 2).reshape(count * most, w.heads * w.head_dim))
        return torch.cat(outs).index_select(0, self.scatter)


def _copy(x: torch.Tensor) -> torch.Tensor:
    """A contiguous copy, made whatever ``x``'s layout (``contiguous()`` would ask whether one is needed)."""
    return x.clone(memory_format=torch.contiguous_format)


def eager_mask(attention: torch.Tensor, length: int, dtype: torch.dtype) -> torch.Tensor:
    """The additive ``[R, length + R]`` mask of a call: every cached row, the new rows as ``attention``.

    With ``dtype`` bool: the ``visible`` mask of the invariant kernels (True where a row may attend).
    """
    rows = attention.shape[0]
    if dtype == torch.bool:
        return torch.cat([attention.new_ones(rows, length), attention], dim=1)
    mask = torch.zeros(rows, length + rows, dtype=dtype, device=attention.device)
    mask[:, length:].masked_fill_(~attention, float("-inf"))
    return mask


def graph_mask(
    attention: torch.Tensor, length: torch.Tensor, span: torch.Tensor, group: int, dtype: torch.dtype
) -> torch.Tensor:
    """:func:`eager_mask` over the cache rows ``span`` (``0, 1, ...``) with ``length`` a 0-d tensor (in graphs).

    Rows below ``length`` are visible, the new rows at ``length ..`` as ``attention`` says, the rest not.
    """
    rows = attention.shape[0]
    if dtype == torch.bool:  # the invariant kernel's visible mask: rows are not stacked by kv head
        own = attention.index_select(1, (span - length).clamp(0, rows - 1))
        return (span < length) | (own & (span >= length) & (span < length + rows))
    offset = span - length  # the new row a column holds, where 0 <= offset < rows
    # own[r, c] = attention[r, offset[c]] as a product with a one-hot [rows, span] matrix: one kernel per call,
    # where a gather would be inlined into every layer's softmax
    holds = (offset[None, :] == torch.arange(rows, device=span.device)[:, None]).to(dtype)
    own = torch.mm(attention.to(dtype), holds) > 0.5
    zero = torch.zeros((), dtype=dtype, device=span.device)
    blocked = torch.tensor(float("-inf"), dtype=dtype, device=span.device)
    return torch.where((span < length) | own, zero, blocked).repeat(group, 1)


def graph_call(
    w: Weights,
    input_ids: torch.Tensor,
    position_ids: torch.Tensor,
    attention: torch.Tensor,
    length: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    span: torch.Tensor,
    adapter_rows: torch.Tensor | None,
) -> tuple[torch.Tensor]:
    """:func:`step` for one call as ``torch.compile`` traces it: ``length`` a 0-d tensor, attention over ``span``.

    Returns the normalised hidden states of all rows (as a 1-tuple).
    """
    rows = input_ids.shape[0]
    mask = graph_mask(attention, length, span, w.heads // w.kv_heads, torch.bool if w.invariant else w.dtype)
    slots = length + torch.arange(rows, device=input_ids.device)
    return (step(w, input_ids, position_ids, [(keys, values, mask, slots, None)], adapter_rows),)


# -- the eager runner ---------------------------------------------------------------------------------------
class Forward:
    """The inference forward of a loaded network: its :class:`Weights`, rebuilt when they go stale.

    Args:
        network: The loaded network (:func:`fuse` is applied here).
        rotary: The backend's rotary embedding.
        query_scale: ``(beta, length)`` of the Llama-4 query scaling (beta 0 disables it).
        kernel: Makes each projection (:class:`Linear`, or :func:`specframe.models.cpu.kernel`); one with an
            ``invariant`` attribute set also runs attention by specframe's row-invariant kernel.
    """

    def __init__(
        self, network: nn.Module, rotary: RotaryEmbedding, query_scale: tuple[float, int], kernel: Kernel = Linear
    ) -> None:
        self.network = network
        dims = network.config.dims
        dtype = rotary.dtype
        self.tables = RopeTables(rotary, dims.max_positions, query_scale[0], query_scale[1], dtype)
        self.kernel = kernel
        self._sizes = (dims.num_heads, dims.num_kv_heads, dims.head_dim, dims.rms_norm_eps)
        self.dtype = dtype
        if not hasattr(network.body.layers[0].self_attn, "qkv_weight"):
            fuse(network)
        self.refresh()

    def refresh(self) -> None:
        """Rebuild the weights (after an adapter is attached or a weight with a derived copy changed)."""
        body, kernel = self.network.body, self.kernel
        layers = []
        for index, layer in enumerate(body.layers):
            attn, mlp = layer.self_attn, layer.mlp
            stored = self._stored_blocks(f"body.layers.{index}")
            qk_norm = None
            if attn.q_norm is not None and attn.k_norm is not None:
                heads, kv_heads = self._sizes[:2]
                qk_norm = torch.cat([attn.q_norm.weight.expand(heads, -1), attn.k_norm.weight.expand(kv_heads, -1)])
            o = kernel(attn.o_proj.weight.detach(), stored("self_attn", "o_proj"))
            down = kernel(mlp.down_proj.weight.detach(), stored("mlp", "down_proj"))
            layers.append(
                LayerWeights(
                    input_norm=layer.input_layernorm.weight.detach(),
                    post_norm=layer.post_attention_layernorm.weight.detach(),
                    qkv=kernel(attn.qkv_weight, stored("self_attn", "q_proj", "k_proj", "v_proj")),
                    o=o,
                    gate_up=kernel(mlp.gate_up_weight, stored("mlp", "gate_proj", "up_proj")),
                    down=down,
                    qk_norm=qk_norm,
                    lora=_adapter(attn.o_lora, o),
                    qkv_bias=getattr(attn, "qkv_bias", None),
                    down_lora=_adapter(mlp.down_lora, down),
                )
            )
        head = body.embed_tokens.weight if self.network.head is None else self.network.head.weight
        head_name = "body.embed_tokens.weight" if self.network.head is None else "head.weight"
        head_blocks = getattr(self.network, "specframe_blocks", {}).get(head_name)
        heads, kv_heads, head_dim, eps = self._sizes
        self.weights = Weights(
            embed=body.embed_tokens.weight.detach(),
            layers=layers,
            final_norm=body.norm.weight.detach(),
            head=kernel(head.detach(), head_blocks),
            tables=self.tables,
            heads=heads,
            kv_heads=kv_heads,
            head_dim=head_dim,
            eps=eps,
            wide=self.dtype in (torch.float16, torch.bfloat16),
            dtype=self.dtype,
            invariant=bool(getattr(kernel, "invariant", False)),
        )
        self.weights.program = LayerProgram.of(layers, self.weights.invariant)
        # read before every call: the modules holding adapters and the tensors something was copied from
        # (qk-norm weights, matrices with a CPU copy); fused matrices and views are read in place
        self._attention = [layer.self_attn for layer in body.layers]
        self._adapted = [(layer.self_attn, "o_lora") for layer in body.layers]
        self._adapted += [(layer.mlp, "down_lora") for layer in body.layers]
        self._copied = [t for a in self._attention if a.q_norm is not None for t in (a.q_norm.weight, a.k_norm.weight)]
        self._copied += [p.weight for x in layers for p in (x.qkv, x.o, x.gate_up, x.down) if type(p) is not Linear]
        self._copied += [] if type(self.weights.head) is Linear else [self.weights.head.weight]
        self._state = self._fingerprint()
        self.has_lora = any(adapter is not None for layer in layers for adapter in layer.adapters())

    def _stored_blocks(self, prefix: str) -> Callable[..., Blocks | None]:
        """The stored blocks of a layer's projection made of the given parts (fused: the parts' blocks stacked).

        ``None`` unless every part is stored block-quantized in one format (the fused matrix then runs as a
        float matrix, as one of its parts would).
        """
        blocks = getattr(self.network, "specframe_blocks", {})

        def stored(module: str, *parts: str) -> Blocks | None:
            found = [blocks.get(f"{prefix}.{module}.{part}.weight") for part in parts]
            if any(b is None for b in found) or len({b[0] for b in found}) != 1:  # type: ignore[index]
                return None
            return found[0][0], torch.cat([b[1] for b in found]) if len(found) > 1 else found[0][1]  # type: ignore[index]

        return stored

    def _fingerprint(self) -> tuple[list, list[int]]:
        """What the weights were built from beyond shared storage: adapters, copied tensors' versions."""
        return self._adapters(), [t._version for t in self._copied]

    def _adapters(self) -> list[nn.Module | None]:
        """Every layer's adapter modules (``o_lora`` of each layer, then ``down_lora``), ``None`` where absent.

        Read before every call, so read as ``nn.Module`` would find them without its ``__getattr__`` (a plain
        attribute, else a submodule): a third of the check's time went there.
        """
        return [vars(module)[name] if name in vars(module) else module._modules[name] for module, name in self._adapted]

    def stale(self) -> bool:
        """Whether an adapter changed or a copied weight was edited in place since the weights were built."""
        adapters, versions = self._state
        return any(a is not b for a, b in zip(self._adapters(), adapters, strict=True)) or versions != [
            t._version for t in self._copied
        ]

    def run(self, batch: Sequence[tuple[KVCache, ModelCall]]) -> list[torch.Tensor]:
        """Logits of each ``(cache, call)``: one :func:`step` over all calls' rows, attention per request.

        Each call's rows are staged in its cache (see :meth:`KVCache.commit`).
        """
        if self.stale():
            self.refresh()
        w, calls = self.weights, [call for _, call in batch]
        segments, counts, offsets, start = [], [], [], 0
        for cache, call in batch:
            rows = call.input_ids.shape[0]
            cache.reserve(rows)
            mask = eager_mask(call.attention, cache.length, torch.bool if w.invariant else w.dtype)
            segments.append((cache.keys, cache.values, mask, *cache.staged_rows()))
            counts.append(rows if call.output_rows is None else call.output_rows.shape[0])
            offsets.append(start)
            start += rows
        adapter = output_rows = None
        if self.has_lora and any(call.adapter_rows is not None for call in calls):
            adapter = _cat([_or(call.adapter_rows, torch.zeros, call, dtype=torch.bool) for call in calls])
        if len(calls) == 1:
            output_rows = calls[0].output_rows
        elif any(call.output_rows is not None for call in calls):
            output_rows = torch.cat(
                [_or(call.output_rows, torch.arange, call) + at for call, at in zip(calls, offsets, strict=True)]
            )
        ids, positions = _cat([c.input_ids for c in calls]), _cat([c.position_ids for c in calls])
        logits = w.head(step(w, ids, positions, segments, adapter, output_rows))
        return [logits] if len(calls) == 1 else list(logits.split(counts))


def _adapter(update: nn.Module | None, projection: Linear) -> Adapter | None:
    """The step's form of a :class:`~specframe.models.layers.LowRankUpdate` on ``projection`` (``None`` for none).

    Beside block-quantized weights the adapter is kept in bfloat16: in float32 it would stream about a sixth of
    a 4-bit model's bytes in every drafting call (SmolLM2-135M, rank 64 on ``o`` and 32 on ``down``: 17 MB
    against 96), and it only shapes drafts, which verification checks; verified rows never run it.
    """
    if update is None:
        return None
    a, b = update.lora_A.detach(), update.lora_B.detach()
    if projection.quantized and a.dtype == torch.float32:
        a, b = a.to(torch.bfloat16), b.to(torch.bfloat16)
    return a, b, float(update.scale)


def _cat(tensors: list[torch.Tensor]) -> torch.Tensor:
    return tensors[0] if len(tensors) == 1 else torch.cat(tensors)


def _or(given: torch.Tensor | None, make: Callable, call: ModelCall, **options: object) -> torch.Tensor:
    """``given``, or ``make(rows)`` for the call's rows (the default of an optional row tensor)."""
    return given if given is not None else make(call.input_ids.shape[0], device=call.input_ids.device, **options)
