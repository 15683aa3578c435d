"""CPU kernels, in one place and behind one switch: what makes calls of few rows fast and row-invariant on a CPU.

* **specframe's own kernels** (:mod:`specframe.kernels`, the default for float32, bfloat16 and GGUF block
  formats): :class:`InvariantLinear` projections and the invariant attention of
  :mod:`specframe.models.forward`. Each output reduces in an order fixed by the weights alone, so every row of
  every call (a Packed-SS verification, a batch) gets bitwise the logits a one-row AR call gives it; each
  weight block is read once per call for all its rows. ``SPECFRAME_KERNELS=0`` (or no C++ compiler) falls
  back to torch's kernels below, which are faster per row on some CPUs but round by row count.
* **torch's kernels tuned by row count** (the fallback): matrices of at least :data:`PACK_MIN_ELEMENTS`
  float32 elements (bfloat16 ones on CPUs with AVX-512) keep a prepacked oneDNN copy, used from
  :data:`PACKED_MIN_ROWS` rows (:class:`Prepacked`); smaller float32 matrices keep a transposed contiguous
  copy, used except at :data:`TRANSPOSED_SKIP_ROWS` rows (:class:`Transposed`). float64, float16 and
  accelerators use ``F.linear``. The copies are skipped when they would take over a quarter of physical memory.
* **Compiled graphs on the CPU** (:mod:`specframe.models.compiled`): prepacked matrices are multiplied by the
  ``specframe::project`` operator (a graph cannot take an opaque oneDNN tensor as an input), the graph's
  compiled code is called without dynamo (:class:`DirectCall`), and inductor generates a C++ wrapper.

Why each choice, with the measurements: ``docs/performance.md``. ``SPECFRAME_CPU_TUNING=0`` (or
``load_model(..., cpu_tuning=False)``) turns all of it off: plain ``F.linear``, ``scaled_dot_product_attention``
and ``torch.compile`` as is.
"""

from __future__ import annotations

import itertools
import os
import weakref
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F

from specframe import kernels
from specframe.envflags import env_flag
from specframe.errors import ConfigError
from specframe.models.forward import Blocks, Kernel, Linear

SWITCH = "SPECFRAME_CPU_TUNING"
"""The environment variable that turns CPU tuning off (``0``) for every model loaded afterwards."""

PACKED_MIN_ROWS = 3
"""Rows from which the float32 prepacked oneDNN kernel is used instead of ``F.linear``.

It trades a fixed cost per call for cheaper rows, so it pays from a few rows on; the value was tuned on one
machine (``docs/performance.md#cpu-tuning-one-room-one-switch``)."""

PACK_MIN_ELEMENTS = 1 << 20
"""Smallest float32 matrix worth prepacking (below it the oneDNN call's fixed cost dominates)."""

TRANSPOSED_SKIP_ROWS = (2, 3)
"""Row counts at which a small float32 matrix's transposed copy is skipped for ``F.linear``, which was faster
there on the machine it was tuned on (``docs/performance.md#cpu-tuning-one-room-one-switch``)."""

# oneDNN's batch-size hint: the input row count it picks the packed layout for; chosen per dtype from 1/4/16/64 on
# one machine (docs/performance.md#cpu-tuning-one-room-one-switch).
_PACK_HINT = {torch.float32: 16, torch.bfloat16: 4}
_MEMORY_SHARE = 0.25  # prepacked copies may take at most this share of physical memory


def enabled(requested: bool | None = None) -> bool:
    """Whether CPU tuning is on: ``requested`` when given, else the :data:`SWITCH` environment variable (on)."""
    return env_flag(SWITCH, default=True) if requested is None else bool(requested)


def onednn_available() -> bool:
    """Whether this torch build has the oneDNN linear kernel with prepacked weights."""
    return bool(torch.backends.mkldnn.is_available()) and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def physical_memory_bytes() -> int | None:
    """Physical memory of this machine, or ``None`` where the OS does not say."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return None


def prepack_allowed(weight_bytes: int, device: torch.device, dtype: torch.dtype) -> bool:
    """Whether to keep prepacked oneDNN copies of matrices totalling ``weight_bytes``.

    Only on the CPU, for float32 and bfloat16 (on CPUs with AVX-512: oneDNN refuses to pack it elsewhere), with
    oneDNN available, when the copies take at most a quarter of physical memory.
    """
    if device.type != "cpu" or dtype not in _PACK_HINT or not onednn_available():
        return False
    if dtype == torch.bfloat16 and not torch.backends.cpu.get_cpu_capability().startswith("AVX512"):
        return False  # oneDNN packs bfloat16 only with AVX-512 (it raises on AVX2-only CPUs)
    memory = physical_memory_bytes()
    return memory is None or weight_bytes <= _MEMORY_SHARE * memory


def kernel(
    network: torch.nn.Module,
    device: torch.device,
    dtype: torch.dtype,
    tuned: bool = True,
    quant: str | None = None,
) -> Kernel:
    """The projection maker of a network's matrices.

    specframe's invariant kernels (:class:`InvariantLinear`) where they apply; else torch's, tuned by row count
    (:class:`Prepacked` / :class:`Transposed`) where they pay; else plain :class:`~specframe.models.forward.Linear`.

    Args:
        network: The loaded network (its size decides whether copies fit in memory).
        device: The weights' device.
        dtype: The weights' dtype.
        tuned: ``False``: plain :class:`~specframe.models.forward.Linear` everywhere.
        quant: A block format (``"q8_0"``, ``"q4_0"``, ``"q4_1"``) to quantize float matrices to, or ``None``.
            Matrices stored block-quantized in the checkpoint keep their blocks either way.

    Raises:
        ConfigError: If quantized weights are asked for (or the checkpoint holds them) but the kernels cannot
            run here (the reason and what to install are named).
    """
    if quant is not None and quant not in kernels.QUANTIZED:
        raise ConfigError(f"unknown quantization {quant!r}; use one of {', '.join(kernels.QUANTIZED)}, or none")
    stored = bool(getattr(network, "specframe_blocks", None))
    if invariant_applies(device, dtype, tuned):
        return _Invariant(quant)
    if quant is not None or stored:
        if not tuned:
            why = "CPU tuning is off (SPECFRAME_CPU_TUNING=0 or cpu_tuning=False)"
        elif device.type != "cpu" or dtype not in (torch.float32, torch.bfloat16):
            why = "they run on the CPU in float32 or bfloat16 only"
        elif not env_flag(kernels.SWITCH, default=True):
            why = f"specframe's kernels are turned off ({kernels.SWITCH}=0)"
        else:
            why = f"specframe's CPU kernels are unavailable: {kernels.unavailable_reason()}"
        raise ConfigError(
            f"quantized weights ({quant or 'stored in the checkpoint'}) cannot run on {device} in {dtype}: {why}"
        )
    nbytes = sum(p.numel() * p.element_size() for p in network.parameters())
    if not tuned or not prepack_allowed(nbytes, device, dtype):
        return Linear
    return _tuned


def invariant_applies(device: torch.device, dtype: torch.dtype, tuned: bool = True) -> bool:
    """Whether specframe's invariant kernels run a model on ``device`` in ``dtype``.

    On the CPU, in float32 or bfloat16, unless ``SPECFRAME_KERNELS=0`` or the kernels cannot be built here.
    """
    if not tuned or device.type != "cpu" or dtype not in (torch.float32, torch.bfloat16):
        return False
    return env_flag(kernels.SWITCH, default=True) and kernels.available()


class InvariantLinear(Linear):
    """A projection by specframe's row-invariant, weight-stationary kernel (:mod:`specframe.kernels`).

    Block formats run interleaved for the CPU's SIMD kernels (:func:`specframe.kernels.repack`, the same
    codes and scales rearranged once here), else (the portable path) in GGUF's layout.

    Args:
        weight: The float ``[out, in]`` matrix (what training, export and the reference path read).
        fmt: The kernel's weight format (``"f32"``, ``"bf16"``, ``"q8_0"``, ``"q4_0"``, ``"q4_1"``).
        data: What the kernel reads: ``weight`` itself for dense formats, its uint8 blocks otherwise.
    """

    __slots__ = ("data", "code", "format", "out_features")

    def __init__(self, weight: torch.Tensor, fmt: str, data: torch.Tensor) -> None:
        super().__init__(weight)
        self.format = fmt
        self.code = kernels.format_of(fmt).code
        self.out_features = weight.shape[0]
        group = kernels.group_rows() if kernels.format_of(fmt).quantized else 0
        if group:
            data, self.code = kernels.repack(data, fmt, group), self.code + kernels.PACKED_OFFSET
        self.data = data.contiguous()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """``x @ weight.T`` for ``x`` shaped ``[R, in]``, each row alone in its rounding."""
        return torch.ops.specframe_kernels.linear(x, self.data, self.code, self.out_features)

    @property
    def quantized(self) -> bool:
        """Whether the kernel runs block-quantized weights (``q8_0``, ``q4_0``, ``q4_1``)."""
        return kernels.format_of(self.format).quantized

    @property
    def operator(self) -> tuple[torch.Tensor, int, int]:
        """``(data, format code, out_features)``: the arguments of ``specframe_kernels::linear``."""
        return self.data, self.code, self.out_features


class _Invariant:
    """The projection maker of :class:`InvariantLinear` (quantizing float matrices when asked, once per matrix)."""

    invariant = True

    def __init__(self, quant: str | None) -> None:
        self.quant = quant
        self._made: dict[int, tuple[int, torch.Tensor]] = {}  # data pointer -> (version quantized, blocks)

    def __call__(self, weight: torch.Tensor, blocks: Blocks | None = None) -> Linear:
        if blocks is not None:
            return InvariantLinear(weight, blocks[0], blocks[1])
        if self.quant is not None and weight.shape[1] % kernels.quant.BLOCK == 0:
            made = self._made.get(weight.data_ptr())
            if made is None or made[0] != weight._version:  # new, or edited in place since: quantize again
                made = self._made[weight.data_ptr()] = (weight._version, kernels.quantize(weight, self.quant))
            return InvariantLinear(weight, self.quant, made[1])
        fmt = "f32" if weight.dtype == torch.float32 else "bf16"
        return InvariantLinear(weight, fmt, weight.detach())


def _tuned(weight: torch.Tensor, blocks: Blocks | None = None) -> Linear:
    if weight.dtype == torch.float32 and weight.numel() < PACK_MIN_ELEMENTS:
        return Transposed(weight)
    return Prepacked(weight)


class Transposed(Linear):
    """A small float32 matrix with a contiguous ``[in, out]`` copy: ``torch.mm`` except at 2-3 rows."""

    __slots__ = ("transposed",)

    def __init__(self, weight: torch.Tensor) -> None:
        super().__init__(weight)
        self.transposed = weight.detach().t().contiguous()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """``x @ weight.T`` for ``x`` shaped ``[R, in]``."""
        if x.shape[0] in TRANSPOSED_SKIP_ROWS:
            return F.linear(x, self.weight)
        return torch.mm(x, self.transposed)

    def for_graph(self) -> Linear:
        """In graphs: the transposed copy at every row count (a graph cannot branch on its symbolic rows)."""
        return _GraphTransposed(self.weight, self.transposed)


class _GraphTransposed(Linear):
    __slots__ = ("transposed",)

    def __init__(self, weight: torch.Tensor, transposed: torch.Tensor) -> None:
        super().__init__(weight)
        self.transposed = transposed

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return torch.mm(x, self.transposed)


_REGISTRY: dict[int, weakref.ref] = {}  # key -> Prepacked, for graphs (see project)
_KEYS = itertools.count()


class Prepacked(Linear):
    """A matrix with a prepacked oneDNN copy, used from :data:`PACKED_MIN_ROWS` rows (float32; bfloat16: always)."""

    __slots__ = ("packed", "min_rows", "key", "__weakref__")

    def __init__(self, weight: torch.Tensor) -> None:
        super().__init__(weight)
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), _PACK_HINT[weight.dtype])
        self.min_rows = PACKED_MIN_ROWS if weight.dtype == torch.float32 else 1
        self.key = next(_KEYS)  # the key graphs call it by (see project)
        _REGISTRY[self.key] = weakref.ref(self)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """``x @ weight.T`` for ``x`` shaped ``[R, in]``."""
        if x.shape[0] >= self.min_rows:
            return torch.ops.mkldnn._linear_pointwise(x, self.packed, None, "none", [], "")
        return F.linear(x, self.weight)

    def for_graph(self) -> Linear:
        """In graphs: the ``specframe::project`` operator, which picks the kernel by row count at run time."""
        return _GraphPrepacked(self.weight, self.key)


class _GraphPrepacked(Linear):
    __slots__ = ("key",)

    def __init__(self, weight: torch.Tensor, key: int) -> None:
        super().__init__(weight)
        self.key = key

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.specframe.project(x, self.key, self.weight.shape[0])


@torch.library.custom_op("specframe::project", mutates_args=())
def project(x: torch.Tensor, key: int, out_features: int) -> torch.Tensor:
    """``x @ weight.T`` by the :class:`Prepacked` registered under ``key``, with its kernel for ``x``'s rows."""
    projection = _REGISTRY[key]()
    if projection is None:
        raise RuntimeError(f"projection {key} was freed while a compiled graph still uses it")
    return projection(x.contiguous())


@project.register_fake
def _project_shape(x: torch.Tensor, key: int, out_features: int) -> torch.Tensor:
    return x.new_empty(x.shape[0], out_features)


class DirectCall:
    """The graph's compiled code called without dynamo: the arguments it takes, built from a call's inputs.

    Through ``torch.compile``, each call first runs dynamo's guards over every argument, the weights
    included, then the bytecode that gathers them (a sixth of a 1-row call of the bundled model; see
    docs/performance.md). The compiled code itself takes a flat list: the call's tensors, the weights
    (fixed: the graph is rebuilt when a weight changes) and the symbolic sizes (read from the inputs'
    shapes). What else may vary between calls is checked by :meth:`accepts` (the dtypes of the ids and
    positions, an adapter mask or none); anything else goes through dynamo as before.

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
