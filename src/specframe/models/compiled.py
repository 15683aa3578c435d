"""The compiled path: steady-state model calls as ``torch.compile`` graphs with static shapes.

A schedule's steady-state calls all have the same row count (Packed-SS on Nemotron: ``2(W+1)``; AR: 1), so
one graph with fixed shapes serves all of them:

* the KV cache has a fixed capacity, rounded up to :data:`CAPACITY_STEP` rows so that prompts of different
  lengths share graphs, and zero-filled so that rows not yet written hold no NaN;
* attention runs over the whole capacity under a mask built inside the graph from the cache length (a 0-d
  tensor, not a Python int: it changes every call without recompiling): cached rows below the length, plus
  the call's own ``[R, R]`` mask. The new rows' keys and values are graph outputs, written into the cache
  after the call; the softmax spans the cached and the new scores, so nothing is sliced or concatenated
  at the capacity's size;
* the model knows no schedule: it learns the steady row counts by counting. A row count is compiled once
  it has occurred :data:`COMPILE_AFTER` times; a call with fewer rows than a compiled graph (the last calls
  of a request) is padded to it when the padding at most doubles the rows; at most :data:`MAX_GRAPHS`
  graphs are kept; everything else -- the prompt's first call above all -- runs the eager path.

Compilation uses inductor (a C++ compiler on the CPU) and its on-disk cache, so a second process reuses the
generated code and only re-traces. On CUDA the graphs are also captured as CUDA graphs
(``mode="reduce-overhead"``), with the cache buffers marked as static addresses and reused across requests.
"""

from __future__ import annotations

import functools
import math
import os
import shutil
import time
import types
import weakref
from collections import Counter
from collections.abc import Callable

import torch
import torch.nn.functional as F

from specframe.errors import ConfigError
from specframe.models.cache import KVCache
from specframe.models.fast import FastForward

CAPACITY_STEP = 256
"""KV-cache capacities are rounded up to a multiple of this many rows."""

COMPILE_AFTER = 3
"""Occurrences of a row count before a graph is compiled for it."""

MAX_GRAPHS = 4
"""Most compiled graphs kept per model (each costs a compilation)."""


def compiler_problem(device: torch.device) -> str | None:
    """Why ``torch.compile`` cannot run on ``device`` here, or ``None`` if it can."""
    if not hasattr(torch, "compile"):
        return "this torch build has no torch.compile"
    if device.type == "cpu":
        compiler = os.environ.get("CXX") or "g++"
        if shutil.which(compiler) is None and shutil.which("c++") is None and shutil.which("clang++") is None:
            return (
                f"torch.compile needs a C++ compiler on the CPU and none was found ({compiler}, c++, clang++); "
                "install g++ (e.g. apt-get install g++) or drop compile / --compile"
            )
    elif device.type != "cuda":
        return f"the compiled path supports CPU and CUDA devices, not {device.type}"
    return None


class CompiledPath:
    """Static-shape compiled calls on top of a :class:`~specframe.models.fast.FastForward` (see module docstring).

    Args:
        fast: The eager forward whose weights and tables the graphs use.
        backend: The ``torch.compile`` backend (``"inductor"``; tests of the graph logic alone may use
            ``"aot_eager"``, which traces the same graphs but runs them without generating code).

    Raises:
        ConfigError: If ``torch.compile`` cannot run on the model's device.

    Attributes:
        compile_seconds: Time spent compiling (tracing plus code generation, or loading it from disk).
        graph_calls: Calls answered by a compiled graph.
        eager_calls: Calls that ran the eager path instead.
    """

    def __init__(self, fast: FastForward, backend: str = "inductor") -> None:
        problem = compiler_problem(fast.device) if backend == "inductor" else None
        if problem:
            raise ConfigError(problem)
        self.fast = fast
        self.backend = backend
        self.cuda = fast.device.type == "cuda"
        self.seen: Counter[tuple[int, int]] = Counter()
        self.graphs: dict[tuple[int, int], Callable] = {}
        self.compile_seconds = 0.0
        self.graph_calls = 0
        self.eager_calls = 0
        self._pool: dict[int, tuple[torch.Tensor, torch.Tensor, weakref.ref | None]] = {}
        self._warm: set[tuple[int, int]] = set()
        if self.cuda:
            _mark_static(fast)

    # -- caches --------------------------------------------------------------------------------------------
    def new_cache(self, num_layers: int, num_kv_heads: int, head_dim: int, capacity: int) -> KVCache:
        """A zero-filled cache whose capacity is rounded up to :data:`CAPACITY_STEP` (buffers reused when free)."""
        capacity = CAPACITY_STEP * math.ceil(max(capacity, 1) / CAPACITY_STEP)
        cache = KVCache(num_layers, num_kv_heads, head_dim, 1, self.fast.dtype, self.fast.device)
        pooled = self._pool.get(capacity)
        if pooled is not None and (pooled[2] is None or pooled[2]() is None):
            keys, values = pooled[0], pooled[1]
            keys.zero_()
            values.zero_()
        else:
            shape = (num_layers, capacity, num_kv_heads, head_dim)
            keys = torch.zeros(shape, dtype=self.fast.dtype, device=self.fast.device)
            values = torch.zeros_like(keys)
            if self.cuda:
                torch._dynamo.mark_static_address(keys)
                torch._dynamo.mark_static_address(values)
        cache.keys, cache.values = keys, values
        self._pool[capacity] = (keys, values, weakref.ref(cache))
        return cache

    # -- calls ---------------------------------------------------------------------------------------------
    def _graph_for(self, rows: int, capacity: int) -> tuple[int, Callable] | None:
        """The compiled graph (and its row count) to run ``rows`` rows with, compiling one if due."""
        fits = [r for r, c in self.graphs if c == capacity and rows <= r <= 2 * rows]
        if fits:
            size = min(fits)
            return size, self.graphs[(size, capacity)]
        key = (rows, capacity)
        self.seen[key] += 1
        if self.seen[key] < COMPILE_AFTER or len(self.graphs) >= MAX_GRAPHS:
            return None
        mode = "reduce-overhead" if self.cuda and self.backend == "inductor" else None
        self.graphs[key] = functools.partial(
            torch.compile(_fresh_step(), backend=self.backend, dynamic=False, fullgraph=True, mode=mode), self.fast
        )
        return rows, self.graphs[key]

    def hidden(
        self,
        cache: KVCache,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        attention: torch.Tensor,
        output_rows: torch.Tensor | None,
        adapter_rows: torch.Tensor | None,
    ) -> torch.Tensor:
        """Final normalised hidden states of ``output_rows``; the new rows' keys and values are staged."""
        fast = self.fast
        if fast.stale():
            fast.refresh()
            self.graphs.clear()  # graphs hold the weights they were traced with
            self._warm.clear()
            if self.cuda:
                _mark_static(fast)
        rows = input_ids.shape[0]
        found = None
        if cache.length > 0 and cache.length + rows <= cache.capacity:
            found = self._graph_for(rows, cache.capacity)
            if found is not None and cache.length + found[0] > cache.capacity:
                found = None
        if found is None:
            self.eager_calls += 1
            return fast.hidden(cache, input_ids, position_ids, attention, output_rows, adapter_rows)
        size, graph = found
        if size > rows:
            input_ids, position_ids, attention, adapter_rows = _pad(
                size, input_ids, position_ids, attention, adapter_rows
            )
        if adapter_rows is None and fast.has_lora:
            adapter_rows = torch.zeros(size, dtype=torch.bool, device=fast.device)
        length = torch.tensor(cache.length, device=fast.device)
        first = (size, cache.capacity) not in self._warm
        started = time.perf_counter()
        hidden, keys, values = graph(input_ids, position_ids, attention, length, cache.keys, cache.values, adapter_rows)
        if first:  # the first call of a graph compiles it (or loads it from inductor's cache)
            self.compile_seconds += time.perf_counter() - started
            self._warm.add((size, cache.capacity))
        cache.reserve(rows)
        cache.keys[:, cache.length : cache.length + size] = keys
        cache.values[:, cache.length : cache.length + size] = values
        self.graph_calls += 1
        hidden = hidden[:rows] if output_rows is None else hidden.index_select(0, output_rows)
        return hidden.clone() if self.cuda else hidden  # CUDA graph outputs are overwritten by the next replay


def _mark_static(fast: FastForward) -> None:
    """Mark every weight and table as a static address, so that CUDA graphs read them in place.

    The graphs receive the weights as inputs (attributes of ``fast``, not of an ``nn.Module``); without the
    mark, a CUDA graph would copy every weight into its own buffers on every replay.
    """
    tensors = [fast.embed, fast.final_norm, fast.head.weight, fast.tables.cos, fast.tables.sin, fast.tables.scale]
    for layer in fast.layers:
        tensors += [layer.input_norm, layer.post_norm, layer.qk_norm]
        tensors += [p.weight for p in (layer.qkv, layer.o, layer.gate_up, layer.down)]
        if layer.lora is not None:
            tensors += list(layer.lora.parameters())
    for tensor in tensors:
        if tensor is not None:
            torch._dynamo.mark_static_address(tensor)


def _fresh_step() -> Callable:
    """A copy of :func:`_static_step` with its own code object.

    Dynamo keeps compiled graphs per code object and checks their guards one after the other on every call;
    giving each graph its own code object keeps that lookup to one entry (and clear of dynamo's cap of 8
    recompilations per code object).
    """
    code = _static_step.__code__.replace()
    return types.FunctionType(code, _static_step.__globals__, _static_step.__name__, _static_step.__defaults__)


def _pad(
    size: int,
    input_ids: torch.Tensor,
    position_ids: torch.Tensor,
    attention: torch.Tensor,
    adapter_rows: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Pad a call to ``size`` rows: extra rows see only themselves, and no real row sees them."""
    rows = input_ids.shape[0]
    ids = F.pad(input_ids, (0, size - rows))
    positions = F.pad(position_ids, (0, size - rows))
    padded = torch.eye(size, dtype=torch.bool, device=attention.device)
    padded[:rows, :rows] = attention
    if adapter_rows is not None:
        adapter_rows = F.pad(adapter_rows, (0, size - rows))
    return ids, positions, padded, adapter_rows


def _static_step(
    fast: FastForward,
    input_ids: torch.Tensor,
    position_ids: torch.Tensor,
    attention: torch.Tensor,
    length: torch.Tensor,
    cache_keys: torch.Tensor,
    cache_values: torch.Tensor,
    adapter_rows: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One call as a pure function of fixed-shape tensors (what ``torch.compile`` traces).

    Returns:
        Normalised hidden states ``[R, hidden]`` and the rows' keys and values ``[layers, R, kv, dim]``.
    """
    rows, capacity = input_ids.shape[0], cache_keys.shape[1]
    h, kv, d = fast.heads, fast.kv_heads, fast.head_dim
    group, half = h // kv, d // 2
    cos, sin, scale = fast.tables.lookup(position_ids)
    cos, sin = cos[:, None], sin[:, None]
    blocked = torch.tensor(float("-inf"), dtype=fast.dtype, device=input_ids.device)
    zero = torch.zeros((), dtype=fast.dtype, device=input_ids.device)
    visible = torch.arange(capacity, device=input_ids.device) < length
    mask = torch.cat(
        [torch.where(visible, zero, blocked).expand(rows, capacity), torch.where(attention, zero, blocked)], dim=1
    ).repeat(group, 1)  # [group * rows, capacity + rows], query heads grouped by their kv head
    softmax_dtype = torch.float32 if fast.wide else fast.dtype
    x = F.embedding(input_ids, fast.embed)
    new_keys, new_values = [], []
    for index, layer in enumerate(fast.layers):
        qkv = F.linear(fast._norm(x, layer.input_norm), layer.qkv.weight)
        qk = qkv[:, : (h + kv) * d].view(rows, h + kv, d)
        if layer.qk_norm is not None:
            qk = fast._norm(qk, layer.qk_norm)
        rotated = torch.cat([qk[..., half:], qk[..., :half]], dim=-1)
        qk = qk * cos + rotated * sin
        q, k = qk[:, :h], qk[:, h:]
        if scale is not None:
            q = q * scale[:, None, None]
        v = qkv[:, (h + kv) * d :].view(rows, kv, d)
        new_keys.append(k)
        new_values.append(v)
        grouped = q.reshape(rows, kv, group, d).permute(1, 2, 0, 3).reshape(kv, group * rows, d) * d**-0.5
        cached_k = cache_keys[index].transpose(0, 1)  # [kv, capacity, d]
        cached_v = cache_values[index].transpose(0, 1)
        scores = torch.cat(
            [grouped @ cached_k.transpose(1, 2), grouped @ k.permute(1, 2, 0)], dim=-1
        )  # [kv, group * rows, capacity + rows]
        weights = torch.softmax((scores + mask).to(softmax_dtype), dim=-1).to(fast.dtype)
        out = weights[..., :capacity] @ cached_v + weights[..., capacity:] @ v.transpose(0, 1)
        out = out.reshape(kv, group, rows, d).permute(2, 0, 1, 3).reshape(rows, h * d)
        projected = F.linear(out, layer.o.weight)
        if layer.lora is not None and adapter_rows is not None:
            projected = torch.where(adapter_rows[:, None], projected + layer.lora(out), projected)
        x = x + projected
        gate_up = F.linear(fast._norm(x, layer.post_norm), layer.gate_up.weight)
        inner = gate_up.shape[1] // 2
        x = x + F.linear(F.silu(gate_up[:, :inner]) * gate_up[:, inner:], layer.down.weight)
    return fast._norm(x, fast.final_norm), torch.stack(new_keys), torch.stack(new_values)
