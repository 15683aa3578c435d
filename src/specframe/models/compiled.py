"""The compiled path: steady-state model calls as one ``torch.compile`` graph over a fixed-capacity cache.

A schedule's steady-state calls repeat a few shapes (AR: 1 row; Packed-SS on Nemotron: ``2(W+1)`` rows), and
``width: auto`` switches widths from call to call, so one graph serves all of them:

* the KV cache has a fixed capacity, rounded up to :data:`CAPACITY_STEP` rows so that buffers are reused
  across requests, and zero-filled so that rows not yet written hold no NaN;
* the graph writes the new rows' keys and values into the cache in place, after the cached rows, and
  attention runs over the cache's first rows -- on the CPU up to the call's last row rounded up to
  :data:`SPAN_STEP`, on CUDA the whole capacity -- under a mask built inside the graph from the cache
  length (a 0-d tensor, not a Python int: it changes every call without recompiling): cached rows below
  the length, the new rows as the call's ``[R, R]`` mask says, nothing beyond. Nothing is concatenated at
  the cache's size, and nothing is copied after the call;
* one graph per model: the row count, the capacity and the span are symbolic, traced with size-oblivious shapes
  (:func:`_any_row_count`) so that the graph holds for 1 row as for 34 -- torch would otherwise specialise
  a graph on a size of 1. Every width and schedule therefore shares it, and a longer request does not
  compile again. Measured on the bundled model (2-core Xeon): the symbolic graph is as fast as a graph
  fixed to one row count at 1, 2, 5, 10 and 18 rows, and compiling it takes about half the time of the
  previous design's two graphs (one fixed to 1 row, one for the rest);
* matrix products use the eager path's kernels (:mod:`specframe.models.kernels`): inductor's own ``mm``
  where the eager path uses ``F.linear``, and the ``specframe::project`` operator, which picks the kernel
  by row count at run time, for matrices with a prepacked oneDNN copy. A graph cannot take the opaque
  prepacked tensor as an input, and inductor's freezing, which would prepack by itself, disables its
  disk cache;
* on the CPU the graph's compiled code is called directly (:class:`DirectCall`), without dynamo's guards
  and argument gathering, which cost about a sixth of a 1-row call of the bundled model;
* the model knows no schedule: the graph is compiled once :data:`COMPILE_AFTER` calls over a non-empty
  cache have occurred; a prompt's call (an empty cache) runs the eager path until then, and afterwards on
  the CPU the graph too, up to :data:`PROMPT_ROWS` rows.

Compilation uses inductor (a C++ compiler on the CPU) and its on-disk caches, so a second process reuses
the generated code and only re-traces. On CUDA the graph is also captured as CUDA graphs
(``mode="reduce-overhead"``, one per row count), with the weights and the cache buffers marked as static
addresses and reused across requests.
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
from collections.abc import Callable, Iterator, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from specframe.errors import ConfigError
from specframe.models.cache import KVCache
from specframe.models.calls import ModelCall
from specframe.models.fast import FastForward, _Layer

_PACKED_IN_GRAPHS = True  # False: inductor's mm everywhere (for comparisons)
_LEAN_CODE = True  # False: inductor's default run-time checks in the generated code (for comparisons)
_CPP_WRAPPER = True  # False: inductor's Python wrapper on the CPU too (for comparisons)

CAPACITY_STEP = 256
"""KV-cache capacities are rounded up to a multiple of this many rows."""

SPAN_STEP = 64
"""On the CPU, attention spans the cache's rows up to the call's last row rounded up to this many (see
:meth:`CompiledPath.span`), not its whole capacity."""

COMPILE_AFTER = 3
"""Calls over a non-empty cache before the graph is compiled."""

PROMPT_ROWS = 256
"""On the CPU, a request's first call (its prompt, over an empty cache) of up to this many rows runs on the
graph once the graph exists: bundled model, 2-core Xeon, fastest of 7: 2.0 / 3.1 / 4.8 / 9.6 / 22.4 ms for
16 / 32 / 64 / 128 / 256 rows against 3.4 / 4.8 / 6.8 / 11.7 / 26.1 ms eager. Longer prompts run eagerly:
the graph's mask product grows with the rows squared. (On CUDA every prompt length would be a CUDA graph
of its own.)"""

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
    """Compiled calls over a fixed-capacity cache on top of a :class:`~specframe.models.fast.FastForward`.

    See the module docstring.

    Args:
        fast: The eager forward whose weights and tables the graph uses.
        backend: The ``torch.compile`` backend (``"inductor"``; tests of the graph logic alone may use
            ``"aot_eager"``, which traces the same graph but runs it without generating code).

    Raises:
        ConfigError: If ``torch.compile`` cannot run on the model's device.

    Attributes:
        graphs: The compiled graph under :data:`GRAPH` once it exists (empty before).
        compile_seconds: Time spent compiling (tracing plus code generation, or loading it from disk).
        graph_calls: Calls answered by the compiled graph.
        direct_calls: Those of them that called its compiled code directly (see :class:`DirectCall`).
        eager_calls: Calls that ran the eager path instead.
    """

    def __init__(self, fast: FastForward, backend: str = "inductor") -> None:
        problem = compiler_problem(fast.device) if backend == "inductor" else None
        if problem:
            raise ConfigError(problem)
        self.fast = fast
        self.backend = backend
        self.cuda = fast.device.type == "cuda"
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
        self.direct: DirectCall | None = None  # the graph's compiled code, called without dynamo
        self._length = torch.zeros((), dtype=torch.int64, device=fast.device)  # the cache length, as graph input
        self._spans: dict[int, torch.Tensor] = {}  # span -> the indices of the rows it spans (see span)

    # -- caches --------------------------------------------------------------------------------------------
    def new_cache(self, num_layers: int, num_kv_heads: int, head_dim: int, capacity: int) -> KVCache:
        """A zero-filled cache whose capacity is rounded up to :data:`CAPACITY_STEP` (buffers reused when free).

        Free buffers made under ``torch.inference_mode`` are reused only under it: torch refuses to write
        inference tensors outside that mode.
        """
        capacity = CAPACITY_STEP * math.ceil(max(capacity, 1) / CAPACITY_STEP)
        cache = KVCache(num_layers, num_kv_heads, head_dim, 1, self.fast.dtype, self.fast.device)
        pooled = self._pool.get(capacity)
        # Buffers made under torch.inference_mode (the cost calibration's) cannot be written outside it.
        writable = pooled is not None and (not pooled[0].is_inference() or torch.is_inference_mode_enabled())
        if pooled is not None and writable and (pooled[2] is None or pooled[2]() is None):
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
        past a call are masked anyway, and scoring them is a third to two thirds of the attention of a
        256-row cache over a 128-token answer. The span is a tensor, not a number, so that the graph reads
        its length as a symbolic size and one graph serves every span. On CUDA the whole capacity (every
        distinct shape would be a CUDA graph of its own).
        """
        rows = capacity if self.cuda else min(capacity, SPAN_STEP * math.ceil(end / SPAN_STEP))
        span = self._spans.get(rows)
        if span is None:
            span = self._spans[rows] = torch.arange(rows, device=self.fast.device)
        return span

    def _graph(self) -> Callable | None:
        """The compiled graph, creating it once it is due (it compiles on its first call)."""
        graph = self.graphs.get(GRAPH)
        if graph is not None:
            return graph
        self.seen += 1
        if self.seen < COMPILE_AFTER:
            return None
        step = GraphStep(self.fast).eval()
        call = _fresh_call()
        self._code = call.__code__
        if self.cuda:
            _mark_static(step)
            mode = "reduce-overhead" if self.backend == "inductor" else None
            compiled = torch.compile(call, backend=self.backend, dynamic=False, fullgraph=True, mode=mode)
        else:  # the backend is wrapped so that the compiled code can be called directly (see DirectCall)
            compiled = torch.compile(call, backend=self._capture, dynamic=False, fullgraph=True)
        self.graphs[GRAPH] = functools.partial(compiled, step)
        return self.graphs[GRAPH]

    def _capture(self, graph: torch.fx.GraphModule, example_inputs: list) -> Callable:
        """The compiler dynamo calls: compiles with :attr:`backend` and keeps the result for :class:`DirectCall`."""
        compiled = torch._dynamo.lookup_backend(self.backend)(graph, example_inputs)
        self._captured = (compiled, graph, example_inputs)
        return compiled

    def hidden(self, call: ModelCall) -> torch.Tensor:
        """Final normalised hidden states of the call's output rows; the new rows' keys and values are staged."""
        fast, cache = self.fast, call.cache
        if fast.stale():
            fast.refresh()
            self.graphs.clear()  # the graph holds the weights it was traced with
            self._warm = False
            self.direct = None
        rows = call.input_ids.shape[0]
        graph = None
        if cache.length + rows <= cache.capacity:
            if cache.length > 0:
                graph = self._graph()
            elif not self.cuda and rows <= PROMPT_ROWS:  # a prompt, once the graph exists (it is not counted)
                graph = self.graphs.get(GRAPH)
        if graph is None:
            self.eager_calls += 1
            return fast.hidden(call)
        adapter_rows = call.adapter_rows
        if adapter_rows is None and fast.has_lora:
            adapter_rows = torch.zeros(rows, dtype=torch.bool, device=fast.device)
        length = self._length.fill_(cache.length)
        input_ids, position_ids, attention = _own(call.input_ids), _own(call.position_ids), _own(call.attention)
        adapter_rows = None if adapter_rows is None else _own(adapter_rows)
        span = self.span(cache.capacity, cache.length + rows)
        inputs = (input_ids, position_ids, attention, length, cache.keys, cache.values, span, adapter_rows)
        if not self._warm:  # trace and compile the graph (or load it from inductor's disk cache)
            started = time.perf_counter()
            traced = inputs if rows > 1 else _two_rows(inputs)
            self._captured = None
            with _any_row_count(traced), _compiling(self.backend, cpu=not self.cuda):
                graph(*traced)
            self.compile_seconds += time.perf_counter() - started
            self._warm = True
            self.direct = None if self._captured is None else DirectCall.build(*self._captured, traced)
            self._captured = None
        direct = self.direct
        if direct is not None and direct.accepts(inputs):
            outputs = direct(inputs)
            self.direct_calls += 1
        else:  # through dynamo, whose guards may compile a second graph (tests count them)
            outputs = graph(*inputs)
        cache.reserve(rows)  # the graph wrote the new rows' keys and values after the cached rows
        hidden = outputs[0]
        self.graph_calls += 1
        hidden = hidden if call.output_rows is None else hidden.index_select(0, call.output_rows)
        return hidden.clone() if self.cuda else hidden  # CUDA graph outputs are overwritten by the next replay


class DirectCall:
    """The graph's compiled code called without dynamo: the arguments it takes, built from a call's inputs.

    Through ``torch.compile``, each call first runs dynamo's guards over every argument, the graph's 40-odd
    weights included, then the bytecode that gathers them from the module; on the bundled model that cost
    200-260 µs of a 1.1-1.4 ms 1-row call (2-core Xeon, fastest of 400 interleaved calls, three runs). The
    compiled code itself takes a flat list: the call's tensors, the weights (fixed: the graph is rebuilt
    when a weight changes) and the symbolic sizes (read from the inputs' shapes). What else may vary between
    calls is checked by :meth:`accepts` (the dtypes of the ids and positions, an adapter mask or none);
    anything else goes through dynamo as before.

    Args:
        compiled: What the backend compiled (a callable over the flat arguments).
        fixed: One entry per argument: a fixed tensor (a weight), or ``None`` where a call fills it in.
        fills: ``(argument, input, dimension or None)``: the input tensor, or its size along the dimension.
        dtypes: The dtype of each input traced (``None`` for an absent adapter mask).
    """

    __slots__ = ("compiled", "fixed", "fills", "dtypes")

    def __init__(
        self,
        compiled: Callable,
        fixed: list[torch.Tensor | None],
        fills: list[tuple[int, int, int | None]],
        dtypes: tuple[torch.dtype | None, ...],
    ) -> None:
        self.compiled, self.fixed, self.fills, self.dtypes = compiled, fixed, fills, dtypes

    @classmethod
    def build(
        cls, compiled: Callable, graph: torch.fx.GraphModule, example: list, traced: tuple[torch.Tensor | None, ...]
    ) -> DirectCall | None:
        """The direct call of ``compiled`` (the graph dynamo traced from the inputs ``traced``), or ``None``.

        ``None`` when an argument is neither one of the inputs, a tensor dynamo lifted from the module, nor a
        size of an input, or when the graph's output is not a tuple: such a graph runs through dynamo.
        """
        placeholders = graph.graph.find_nodes(op="placeholder")
        outputs = graph.graph.output_node().args[0]
        if len(placeholders) != len(example) or not isinstance(outputs, (tuple, list)):
            return None
        positions = {id(t): k for k, t in enumerate(traced) if t is not None}
        sizes: dict[str, tuple[int, int]] = {}
        for node, value in zip(placeholders, example, strict=True):  # symbolic sizes of the inputs' dimensions
            fake = node.meta.get("example_value")
            if isinstance(value, torch.Tensor) and id(value) in positions and isinstance(fake, torch.Tensor):
                for dim, size in enumerate(fake.shape):
                    if isinstance(size, torch.SymInt):
                        sizes.setdefault(str(size.node.expr), (positions[id(value)], dim))
        fixed: list[torch.Tensor | None] = []
        fills: list[tuple[int, int, int | None]] = []
        for index, (node, value) in enumerate(zip(placeholders, example, strict=True)):
            fixed.append(None)
            if isinstance(value, torch.Tensor) and id(value) in positions:
                fills.append((index, positions[id(value)], None))
            elif isinstance(value, torch.Tensor):
                fixed[index] = value
            elif isinstance(value, torch.SymInt) and _symbol(node) in sizes:
                fills.append((index, *sizes[_symbol(node)]))
            else:
                return None
        dtypes = tuple(None if t is None else t.dtype for t in traced)
        return cls(compiled, fixed, fills, dtypes)

    def accepts(self, inputs: tuple[torch.Tensor | None, ...]) -> bool:
        """Whether ``inputs`` have the dtypes the graph was traced with (shapes are checked by the caller).

        Also whether gradients are off, as when the graph was traced (model calls run without them).
        """
        return not torch.is_grad_enabled() and tuple(None if t is None else t.dtype for t in inputs) == self.dtypes

    def __call__(self, inputs: tuple[torch.Tensor | None, ...]) -> Sequence[torch.Tensor]:
        """The graph's outputs for ``inputs``: ids, positions, attention, length, keys, values, span, adapter rows."""
        args = self.fixed.copy()
        for index, source, dim in self.fills:
            args[index] = inputs[source] if dim is None else inputs[source].shape[dim]
        return self.compiled(*args)


def _symbol(node: torch.fx.Node) -> str | None:
    """The symbol of a graph input that is a symbolic size (``None`` when dynamo recorded none)."""
    value = node.meta.get("example_value")
    return str(value.node.expr) if isinstance(value, torch.SymInt) else None


def _mark_static(weights: nn.Module) -> None:
    """Mark every weight and table as a static address, so that CUDA graphs read them in place.

    Without the mark, a CUDA graph would copy every weight it receives as an input into its own buffers on
    every replay.
    """
    for tensor in weights.buffers():
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


def _compiling(backend: str, cpu: bool = True) -> contextlib.AbstractContextManager:
    """Inductor's settings while it compiles the graph (on its first call).

    On the CPU, inductor's C++ wrapper: the code that allocates the graph's buffers and calls its kernels
    and library products runs as compiled C++ instead of Python. Bundled model, interleaved with the
    Python wrapper in one process (fastest of 200-300 calls, load average 5): 1-row calls 7-11 % faster,
    2-row 6-9 %, 10-18 rows 0-5 %, the same bits; a cold compile took no more CPU time (24-36 s against
    37-41 s) and a second process loads it from the disk cache as before.

    No shape, stride and alignment checks of every input on every call in the generated code (35 checks
    per call of the bundled model's graph; 1-row calls 7-9 % faster without them): the inputs' layouts are
    fixed by construction (the cache buffers, the call's ids, positions and mask).

    The CPU's base vector instruction sets (AVX2, AVX-512) are taken from what the CPU reports instead of
    being test-compiled and test-loaded first (``cpp.vec_isa_ok``, unless ``TORCHINDUCTOR_VEC_ISA_OK`` says
    otherwise): each test is a ``g++`` run over ATen's vector headers plus a Python subprocess, 15-20 s of a
    cold compile on the 2-core development machine. The finer checks (bfloat16, VNNI, AMX) still run.
    """
    if backend != "inductor" or not _LEAN_CODE:
        return contextlib.nullcontext()
    config = torch._inductor.config
    isa_ok = True if config.cpp.vec_isa_ok is None else config.cpp.vec_isa_ok
    settings = {"size_asserts": False, "alignment_asserts": False, "scalar_asserts": False, "cpp.vec_isa_ok": isa_ok}
    if cpu and _CPP_WRAPPER:
        settings["cpp_wrapper"] = True
    return config.patch(settings)


def _call(step: GraphStep, *inputs: torch.Tensor | None) -> tuple[torch.Tensor]:
    return step(*inputs)


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


def _copy(x: torch.Tensor) -> torch.Tensor:
    """A contiguous copy, made whatever ``x``'s layout (``contiguous()`` would ask whether one is needed)."""
    return x.clone(memory_format=torch.contiguous_format)


class _LayerWeights(nn.Module):
    """One decoder layer's tensors as (non-persistent) buffers: views of the network's, nothing copied."""

    def __init__(self, layer: _Layer) -> None:
        super().__init__()
        lora = layer.lora
        projections = {"qkv": layer.qkv, "o": layer.o, "gate_up": layer.gate_up, "down": layer.down}
        # matrices with a prepacked copy are multiplied by their Projection, which picks the kernel by row
        # count at run time as on the eager path
        self.packed = {
            name: (p.key, p.weight.shape[0])
            for name, p in projections.items()
            if p.key is not None and _PACKED_IN_GRAPHS
        }
        tensors = {
            "input_norm": layer.input_norm,
            "post_norm": layer.post_norm,
            **{name: p.weight for name, p in projections.items()},
            # small float32 matrices: the transposed copy, which graphs use at every row count
            **{f"{name}_t": p.transposed for name, p in projections.items() if p.transposed is not None},
            "qk_norm": layer.qk_norm,
            "lora_a": None if lora is None else lora.lora_A,
            "lora_b": None if lora is None else lora.lora_B,
        }
        for name, tensor in tensors.items():
            self.register_buffer(name, None if tensor is None else tensor.detach(), persistent=False)
        self.lora_scale = 1.0 if lora is None else float(lora.scale)

    def project(self, x: torch.Tensor, name: str) -> torch.Tensor:
        """``x`` times the named matrix (transposed), with the prepacked kernel or transposed copy where chosen."""
        packed = self.packed.get(name)
        if packed is not None:
            return torch.ops.specframe.project(x, packed[0], packed[1])
        transposed = getattr(self, f"{name}_t", None)
        if transposed is not None:
            return torch.mm(x, transposed)
        return F.linear(x, getattr(self, name))


class GraphStep(nn.Module):
    """One model call as a module of fixed-layout tensors: what ``torch.compile`` traces for the compiled path.

    The weights are buffers of this module, so that inductor's freezing (on the CPU) may treat them as
    constants and lay them out for its matrix kernels (oneDNN / MKL prepacking); they are views of the
    network's tensors, rebuilt with the graphs when a weight changes.

    Args:
        fast: The eager forward whose weights and tables to use.
    """

    def __init__(self, fast: FastForward) -> None:
        super().__init__()
        self.tables = fast.tables
        self.heads, self.kv_heads, self.head_dim = fast.heads, fast.kv_heads, fast.head_dim
        self.eps, self.wide, self.dtype = fast.eps, fast.wide, fast.dtype
        self.register_buffer("embed", fast.embed.detach(), persistent=False)
        self.register_buffer("final_norm", fast.final_norm.detach(), persistent=False)
        for name in ("cos", "sin", "scale"):
            table = getattr(fast.tables, name)
            self.register_buffer(name, None if table is None else table, persistent=False)
        self.layers = nn.ModuleList(_LayerWeights(layer) for layer in fast.layers)

    def uses_operators(self) -> bool:
        """Whether the graph calls specframe's ``project`` operator (matrices with a prepacked copy)."""
        return any(layer.packed for layer in self.layers)

    def forward(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        attention: torch.Tensor,
        length: torch.Tensor,
        cache_keys: torch.Tensor,
        cache_values: torch.Tensor,
        span: torch.Tensor,
        adapter_rows: torch.Tensor | None,
    ) -> tuple[torch.Tensor]:
        """Normalised hidden states ``[R, hidden]`` (as a 1-tuple); the rows' keys and values go into the cache.

        ``cache_keys`` / ``cache_values`` (``[layers, capacity, kv, dim]``) receive the new rows' keys and
        values at rows ``length`` (a 0-d tensor) to ``length + R``, in place, and attention spans the cache's
        rows ``span`` (``0, 1, ...``, at least up to ``length + R``): rows below ``length`` are visible, the
        new rows as ``attention`` says, the rest not.
        """
        rows = input_ids.shape[0]
        device = input_ids.device
        if self.cos is None:  # no tables ahead (very long contexts): computed as the eager path does
            cos, sin, scale = self.tables.lookup(position_ids)
        else:
            cos, sin = self.cos.index_select(0, position_ids), self.sin.index_select(0, position_ids)
            scale = None if self.scale is None else self.scale.index_select(0, position_ids)
        blocked = torch.tensor(float("-inf"), dtype=self.dtype, device=device)
        zero = torch.zeros((), dtype=self.dtype, device=device)
        columns = span
        offset = columns - length  # the new row a column holds, where 0 <= offset < rows
        # own[r, c] = attention[r, offset[c]], as a product with a one-hot [rows, span] matrix: a matrix
        # product is a kernel of its own, so the mask is built once per call. A gather (index_select) is
        # inlined into each layer's softmax and its three passes instead, 12 times per call on the bundled
        # model; the product made 10-18 row calls 8-12 % faster there (2-core Xeon, fastest of 30).
        holds = (offset[None, :] == torch.arange(rows, device=device)[:, None]).to(self.dtype)
        own = torch.mm(attention.to(self.dtype), holds) > 0.5
        mask = torch.where((columns < length) | own, zero, blocked)  # [rows, span]
        mask = mask.repeat(self.heads // self.kv_heads, 1)  # [group * rows, span]: query heads by kv head
        slots = length + torch.arange(rows, device=device)
        x = F.embedding(input_ids, self.embed)
        for index, layer in enumerate(self.layers):
            x = self._layer(
                layer, x, (cache_keys, cache_values), index, slots, cos[:, None], sin[:, None], scale, mask,
                adapter_rows,
            )  # fmt: skip
        return (self._norm(x, self.final_norm),)

    def _norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        wide = x.float() if self.wide else x
        wide = wide * torch.rsqrt(wide.pow(2).mean(-1, keepdim=True) + self.eps)
        return weight * (wide.to(x.dtype) if self.wide else wide)

    def _layer(
        self,
        layer: _LayerWeights,
        x: torch.Tensor,
        cache: tuple[torch.Tensor, torch.Tensor],
        index: int,
        slots: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        scale: torch.Tensor | None,
        mask: torch.Tensor,
        adapter_rows: torch.Tensor | None,
    ) -> torch.Tensor:
        h, kv, d = self.heads, self.kv_heads, self.head_dim
        rows = x.shape[0]
        group, half = h // kv, d // 2
        qkv = layer.project(self._norm(x, layer.input_norm), "qkv").view(rows, h + 2 * kv, d)
        qk = qkv[:, : h + kv]
        if layer.qk_norm is not None:
            qk = self._norm(qk, layer.qk_norm)
        qk = qk * cos + torch.cat([qk[..., half:], qk[..., :half]], dim=-1) * sin
        q, k = qk[:, :h], qk[:, h:]
        if scale is not None:
            q = q * scale[:, None, None]
        # the new rows into the cache, indexed on the cache itself ((layer, row) pairs): written through a
        # view of it, the functional graph would copy the whole cache for every layer
        keys, values = cache
        at = (torch.full_like(slots, index), slots)
        keys.index_put_(at, k)
        values.index_put_(at, qkv[:, h + kv :])
        visible = mask.shape[1]
        cached_k = keys[index].narrow(0, 0, visible).transpose(0, 1)  # [kv, span, d]
        cached_v = values[index].narrow(0, 0, visible).transpose(0, 1)
        # explicit copies and bmm rather than reshape and @: their view / broadcast decisions would guard on
        # the row count being 1 and split the graph in two (see _any_row_count)
        grouped = _copy(q.transpose(0, 1)).view(kv, group * rows, d) * d**-0.5  # heads h = kv x group
        scores = torch.bmm(grouped, cached_k.transpose(1, 2))  # [kv, group * rows, capacity]
        weights = torch.softmax((scores + mask).to(torch.float32 if self.wide else self.dtype), dim=-1).to(self.dtype)
        out = torch.bmm(weights, cached_v)
        out = _copy(out.view(kv, group, rows, d).permute(2, 0, 1, 3)).view(rows, h * d)
        projected = layer.project(out, "o")
        if layer.lora_a is not None and adapter_rows is not None:
            update = F.linear(F.linear(out, layer.lora_a), layer.lora_b) * layer.lora_scale
            projected = torch.where(adapter_rows[:, None], projected + update, projected)
        x = x + projected
        gate_up = layer.project(self._norm(x, layer.post_norm), "gate_up")
        inner = gate_up.shape[1] // 2
        return x + layer.project(F.silu(gate_up[:, :inner]) * gate_up[:, inner:], "down")
