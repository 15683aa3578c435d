"""The compiled path: steady-state model calls as one ``torch.compile`` graph of the forward's own step.

The graph is :func:`specframe.models.forward.graph_call`, the eager :func:`~specframe.models.forward.step`
with its mask built inside the graph, over a fixed-capacity cache:

* the KV cache has a fixed capacity, rounded up to :data:`CAPACITY_STEP` rows so that buffers are reused
  across requests, and zero-filled so that rows not yet written hold no NaN;
* the graph writes the new rows' keys and values into the cache in place, and attention runs over the
  cache's first rows -- on the CPU up to the call's last row rounded up to :data:`SPAN_STEP`, on CUDA the whole
  capacity -- under a mask built from the cache length (a 0-d tensor, so that it changes without recompiling);
* one graph per model: the row count, the capacity and the span are symbolic, traced with size-oblivious
  shapes (:func:`_any_row_count`), so that every width and schedule shares it, 1 row as 34;
* projections are swapped for their graph forms (:meth:`~specframe.models.forward.Weights.for_graph`);
* the model knows no schedule: the graph is compiled once :data:`COMPILE_AFTER` calls over a non-empty
  cache have occurred; a prompt's call (an empty cache) runs eagerly until then, and afterwards on the CPU
  the graph too, up to :data:`PROMPT_ROWS` rows.

On the CPU, :mod:`specframe.models.cpu` adds its tuning (the compiled code called directly, a C++ wrapper).
Compilation uses inductor and its on-disk caches, so a second process reuses the generated code and only
re-traces. On CUDA the graph is also captured as CUDA graphs (``mode="reduce-overhead"``), with the weights
and the cache buffers marked as static addresses.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import shutil
import time
import types
import weakref
from collections.abc import Callable, Iterator

import torch

from specframe.errors import ConfigError
from specframe.models import cpu
from specframe.models.base import ModelCall
from specframe.models.cache import KVCache
from specframe.models.forward import Forward, Weights, graph_call

CAPACITY_STEP = 256
"""KV-cache capacities are rounded up to a multiple of this many rows."""

SPAN_STEP = 64
"""On the CPU, attention spans the cache's rows up to the call's last row rounded up to this many (see
:meth:`CompiledPath.span`), not its whole capacity."""

COMPILE_AFTER = 3
"""Calls over a non-empty cache before the graph is compiled."""

PROMPT_ROWS = 256
"""On the CPU, a request's first call (its prompt) of up to this many rows runs on the graph once it exists
(longer prompts run eagerly: the graph's mask product grows with the rows squared)."""

GRAPH = "calls"
"""The key of the model's one graph in :attr:`CompiledPath.graphs`."""


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
    """Compiled calls over a fixed-capacity cache, on the weights of a :class:`~specframe.models.forward.Forward`.

    See the module docstring.

    Args:
        forward: The eager forward whose weights the graph uses.
        device: The weights' device.
        backend: The ``torch.compile`` backend (``"inductor"``; tests of the graph logic alone may use
            ``"aot_eager"``, which traces the same graph but runs it without generating code).
        tuned: Whether the CPU tuning of :mod:`specframe.models.cpu` applies (direct calls, C++ wrapper).

    Raises:
        ConfigError: If ``torch.compile`` cannot run on the model's device.

    Attributes:
        graphs: The compiled graph under :data:`GRAPH` once it exists (empty before).
        compile_seconds: Time spent compiling (tracing plus code generation, or loading it from disk).
        graph_calls: Calls answered by the compiled graph.
        direct_calls: Those of them that called its compiled code directly (:class:`~specframe.models.cpu.DirectCall`).
        eager_calls: Calls that ran the eager path instead.
    """

    def __init__(self, forward: Forward, device: torch.device, backend: str = "inductor", tuned: bool = True) -> None:
        problem = compiler_problem(device) if backend == "inductor" else None
        if problem:
            raise ConfigError(problem)
        self.forward = forward
        self.device, self.dtype = device, forward.dtype
        self.backend = backend
        self.cuda = device.type == "cuda"
        self.tuned = tuned and not self.cuda
        self.seen = 0
        self.graphs: dict[str, Callable] = {}
        self.compile_seconds = 0.0
        self.graph_calls = 0
        self.direct_calls = 0
        self.eager_calls = 0
        self._pool: dict[int, tuple[torch.Tensor, torch.Tensor, weakref.ref | None]] = {}
        self._code: types.CodeType | None = None  # the code object the graph is compiled for
        self._warm = False  # whether the graph has been traced
        self._captured: tuple | None = None  # what the last compilation produced (see _capture)
        self.direct: cpu.DirectCall | None = None  # the graph's compiled code, called without dynamo
        self._length = torch.zeros((), dtype=torch.int64, device=device)  # the cache length, as graph input
        self._spans: dict[int, torch.Tensor] = {}  # span -> the indices of the rows it spans (see span)
        self._traced_weights = forward.weights  # what the graph is built on (rebuilt when the forward refreshes)

    # -- caches --------------------------------------------------------------------------------------------
    def new_cache(self, num_layers: int, num_kv_heads: int, head_dim: int, capacity: int) -> KVCache:
        """A zero-filled cache whose capacity is rounded up to :data:`CAPACITY_STEP` (buffers reused when free).

        Free buffers made under ``torch.inference_mode`` are reused only under it: torch refuses to write
        inference tensors outside that mode.
        """
        capacity = CAPACITY_STEP * math.ceil(max(capacity, 1) / CAPACITY_STEP)
        cache = KVCache(num_layers, num_kv_heads, head_dim, 1, self.dtype, self.device)
        pooled = self._pool.get(capacity)
        # Buffers made under torch.inference_mode (the cost calibration's) cannot be written outside it.
        writable = pooled is not None and (not pooled[0].is_inference() or torch.is_inference_mode_enabled())
        if pooled is not None and writable and (pooled[2] is None or pooled[2]() is None):
            keys, values = pooled[0], pooled[1]
            keys.zero_()
            values.zero_()
        else:
            shape = (num_layers, capacity, num_kv_heads, head_dim)
            keys = torch.zeros(shape, dtype=self.dtype, device=self.device)
            values = torch.zeros_like(keys)
            if self.cuda:
                torch._dynamo.mark_static_address(keys)
                torch._dynamo.mark_static_address(values)
        cache.keys, cache.values = keys, values
        self._pool[capacity] = (keys, values, weakref.ref(cache))
        return cache

    # -- calls ---------------------------------------------------------------------------------------------
    def compiled_graphs(self) -> int:
        """How many graphs torch has compiled for this model (1 once compiled: every row count shares it).

        Read from dynamo's cache of the graph's code object, so a recompilation (a guard on a shape that
        should have stayed symbolic) shows here.
        """
        if self._code is None:
            return 0
        return len(torch._dynamo.eval_frame._debug_get_cache_entry_list(self._code))

    def span(self, capacity: int, end: int) -> torch.Tensor:
        """The indices of the cache rows attention spans for a call ending at row ``end`` (``0, 1, ...``).

        On the CPU the rows up to ``end`` rounded up to :data:`SPAN_STEP` (at most ``capacity``): the rows
        past a call are masked anyway. A tensor, not a number, so that the graph reads its length as a
        symbolic size. On CUDA the whole capacity (every distinct shape would be a CUDA graph of its own).
        """
        rows = capacity if self.cuda else min(capacity, SPAN_STEP * math.ceil(end / SPAN_STEP))
        span = self._spans.get(rows)
        if span is None:
            span = self._spans[rows] = torch.arange(rows, device=self.device)
        return span

    def _graph(self) -> Callable | None:
        """The compiled graph, creating it once it is due (it compiles on its first call)."""
        graph = self.graphs.get(GRAPH)
        if graph is not None:
            return graph
        self.seen += 1
        if self.seen < COMPILE_AFTER:
            return None
        weights = self.forward.weights.for_graph()
        call = _fresh_call()
        self._code = call.__code__
        if self.cuda:
            _mark_static(weights)
            mode = "reduce-overhead" if self.backend == "inductor" else None
            compiled = torch.compile(call, backend=self.backend, dynamic=False, fullgraph=True, mode=mode)
        elif self.tuned:  # the backend is wrapped so that the compiled code can be called directly
            compiled = torch.compile(call, backend=self._capture, dynamic=False, fullgraph=True)
        else:
            compiled = torch.compile(call, backend=self.backend, dynamic=False, fullgraph=True)
        self.graphs[GRAPH] = functools.partial(compiled, weights)
        return self.graphs[GRAPH]

    def _capture(self, graph: torch.fx.GraphModule, example_inputs: list) -> Callable:
        """The compiler dynamo calls: compiles with :attr:`backend` and keeps the result for the direct call."""
        compiled = torch._dynamo.lookup_backend(self.backend)(graph, example_inputs)
        self._captured = (compiled, graph, example_inputs)
        return compiled

    def logits(self, cache: KVCache, call: ModelCall) -> torch.Tensor:
        """Logits of the call's output rows; the new rows' keys and values are staged in the cache."""
        forward = self.forward
        if forward.stale():
            forward.refresh()
        if forward.weights is not self._traced_weights:  # the graph holds the weights it was traced with
            self.graphs.clear()
            self._warm = False
            self.direct = None
            self._traced_weights = forward.weights
        rows = call.input_ids.shape[0]
        graph = None
        if cache.length + rows <= cache.capacity and not cache.paged:  # a paged cache's rows: eagerly, in place
            if cache.length > 0:
                graph = self._graph()
            elif not self.cuda and rows <= PROMPT_ROWS:  # a prompt, once the graph exists (it is not counted)
                graph = self.graphs.get(GRAPH)
        if graph is None:
            self.eager_calls += 1
            return forward.run([(cache, call)])[0]
        cache.reserve(rows)  # the new rows are staged before the graph writes them, as the eager path does
        adapter_rows = call.adapter_rows
        if adapter_rows is None and forward.has_lora:
            adapter_rows = torch.zeros(rows, dtype=torch.bool, device=self.device)
        length = self._length.fill_(cache.length)
        input_ids, position_ids, attention = _own(call.input_ids), _own(call.position_ids), _own(call.attention)
        adapter_rows = None if adapter_rows is None else _own(adapter_rows)
        span = self.span(cache.capacity, cache.length + rows)
        inputs = (input_ids, position_ids, attention, length, cache.keys, cache.values, span, adapter_rows)
        if not self._warm:  # trace and compile the graph (or load it from inductor's disk cache)
            started = time.perf_counter()
            traced = inputs if rows > 1 else _two_rows(inputs)
            self._captured = None
            with _any_row_count(traced), _compiling(self.backend, cpp_wrapper=self.tuned):
                graph(*traced)
            self.compile_seconds += time.perf_counter() - started
            self._warm = True
            self.direct = None if self._captured is None else cpu.DirectCall.build(*self._captured, traced)
            self._captured = None
        direct = self.direct
        if direct is not None and direct.accepts(inputs):
            outputs = direct(inputs)
            self.direct_calls += 1
        else:  # through dynamo, whose guards may compile a second graph (tests count them)
            outputs = graph(*inputs)
        self.graph_calls += 1
        hidden = outputs[0] if call.output_rows is None else outputs[0].index_select(0, call.output_rows)
        return forward.weights.head(hidden.clone() if self.cuda else hidden)  # CUDA graph outputs are reused


def _mark_static(weights: Weights) -> None:
    """Mark every weight and table as a static address, so that CUDA graphs read them in place."""
    for tensor in weights.tensors():
        torch._dynamo.mark_static_address(tensor)


@contextlib.contextmanager
def _any_row_count(inputs: tuple[torch.Tensor | None, ...]) -> Iterator[None]:
    """While the graph is traced: its row count and cache capacity symbolic, including a row count of 1.

    The inputs are ``(ids, positions, attention, length, keys, values, span, adapter rows)``. Their row,
    capacity and span dimensions are marked dynamic, and shapes are reasoned about size-obliviously (torch's
    ``backed_size_oblivious``): without it a dimension of size 1 is specialised, and one traced with more
    rows guards on not being 1, which would split the model's calls over two graphs. Sizes that happen to be
    equal when the graph is traced (a span equal to the capacity) are not taken to be the same size (no
    "duck" shapes).
    """
    ids, positions, attention, _, keys, values, span, adapter_rows = inputs
    marks = [(keys, 1), (values, 1), (ids, 0), (positions, 0), (attention, 0), (attention, 1), (span, 0)]
    if adapter_rows is not None:
        marks.append((adapter_rows, 0))
    for tensor, dim in marks:
        torch._dynamo.maybe_mark_dynamic(tensor, dim)
    with torch.fx.experimental._config.patch(backed_size_oblivious=True, use_duck_shape=False):
        yield


def _two_rows(inputs: tuple[torch.Tensor | None, ...]) -> tuple[torch.Tensor | None, ...]:
    """A 1-row call's inputs with a second row that sees only itself, to trace the graph from.

    Traced from a single row, torch would specialise the graph on that size even with size-oblivious
    shapes; a graph traced from two rows serves one row too. The traced call's results are dropped.
    """
    ids, positions, attention, length, keys, values, span, adapter_rows = inputs
    blocked = torch.zeros(1, 1, dtype=torch.bool, device=attention.device)
    seen = torch.cat([torch.cat([attention, blocked], 1), torch.cat([blocked, ~blocked], 1)])
    adapter = None if adapter_rows is None else adapter_rows.repeat(2)
    return ids.repeat(2), positions.repeat(2), seen, length, keys, values, span, adapter


def _compiling(backend: str, cpp_wrapper: bool = True) -> contextlib.AbstractContextManager:
    """Inductor's settings while it compiles the graph (on its first call).

    No shape, stride and alignment checks of every input on every call in the generated code: the inputs'
    layouts are fixed by construction. The CPU's base vector instruction sets are taken from what the CPU
    reports instead of being test-compiled first (``cpp.vec_isa_ok``, unless ``TORCHINDUCTOR_VEC_ISA_OK``
    says otherwise). With ``cpp_wrapper`` (CPU tuning), the code around the kernels is generated as C++.
    """
    if backend != "inductor":
        return contextlib.nullcontext()
    config = torch._inductor.config
    isa_ok = True if config.cpp.vec_isa_ok is None else config.cpp.vec_isa_ok
    settings = {"size_asserts": False, "alignment_asserts": False, "scalar_asserts": False, "cpp.vec_isa_ok": isa_ok}
    if cpp_wrapper:
        settings["cpp_wrapper"] = True
    return config.patch(settings)


def _call(weights: Weights, *inputs: torch.Tensor | None) -> tuple[torch.Tensor]:
    return graph_call(weights, *inputs)


def _fresh_call() -> Callable:
    """A copy of :func:`_call` with its own code object.

    Dynamo keeps compiled graphs per code object and checks their guards one after the other on every call;
    giving each graph its own code object keeps that lookup to one entry (and clear of dynamo's cap of 8
    recompilations per code object).
    """
    return types.FunctionType(_call.__code__.replace(), _call.__globals__, _call.__name__, _call.__defaults__)


def _own(x: torch.Tensor) -> torch.Tensor:
    """``x``, or a copy of it when it is a view into a larger buffer (as the decoder's layout templates are).

    The graph's inputs then always start at offset 0 in contiguous storage: an input with symbolic sizes has
    a symbolic storage offset too, which torch specialises on being 0, 1 or neither, and a view at another
    offset would recompile the graph.
    """
    if x.storage_offset() == 0 and x.is_contiguous():
        return x
    return x.clone(memory_format=torch.contiguous_format)
