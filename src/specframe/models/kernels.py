"""Matrix-product kernels for few-row calls, chosen per dtype, matrix size and row count from measurements.

A speculative call multiplies 1 to a few dozen rows by every weight matrix, so its cost is the cost of
streaming the weights once -- if the kernel keeps up. Measured on a 2-core Intel Xeon (Sapphire Rapids,
AVX-512 + AMX, 300 MiB L3), one thread, thread CPU time, torch 2.13, other jobs running on the machine:

* one 32000 x 1024 float32 matrix: ``F.linear`` 7.2 / 15.4 / 25.6 ms for 1 / 4 / 18 rows; the same matrix
  prepacked for oneDNN (``torch.ops.mkldnn._reorder_linear_weight`` + ``_linear_pointwise``) 7.0 / 12.3 /
  18.2 ms; pre-transposed (``x @ weight_t``) 6.9 / 16.2 / 33.6 ms -- transposing never wins past 2 rows.
  ``weight.to_mkldnn()`` with ``torch._C._nn.mkldnn_linear`` needs the input converted to and from the
  oneDNN layout on every call and lost to ``_linear_pointwise`` at every row count (54 against 41 ms for
  18 rows, wall time), and to ``F.linear`` on small matrices;
* in bfloat16 the prepacked kernel (AMX) costs 5.1 ms for 1 row and 6.1 ms for 18 rows, ``F.linear``
  6.5 / 13.9 ms;
* whole calls of a 156M-parameter model over 256 cached rows, float32: prepacked 31 / 61 / 73 ms for
  1 / 10 / 18 rows against 32 / 104 / 91 ms plain; bfloat16: prepacked 22 / 26 / 32 ms, plain 30 / 33 / 38;
* on the 4M-parameter bundled model (matrices of at most 0.5M elements) a oneDNN call's fixed cost (about
  12 us more than ``F.linear``) outweighs its gain in float32: whole calls are 5-15 % slower prepacked at
  every row count, while in bfloat16 they are 10-15 % faster;
* for such small float32 matrices a transposed contiguous copy (``torch.mm(x, weight_t)``) is the fastest
  kernel at 1 row and from 4 rows: for a 2048 x 256 matrix 95 / 116 / 157 / 187 us for 1 / 5 / 10 / 18 rows
  against ``F.linear``'s 104 / 169 / 291 / 264 and oneDNN's 152 / 154 / 204 / 231, and for the bundled
  model's 17 matrices together 0.59 / 0.76 / 1.03 / 1.47 ms for 1 / 5 / 10 / 18 rows against 0.59 / 0.94 /
  1.40 / 1.83 ms; at 2-3 rows it loses by 5-15 %. From 1M elements it stops paying against oneDNN.

Hence the policy of :class:`Projection`:

* float32 on the CPU: matrices of at least :data:`PACK_MIN_ELEMENTS` elements are prepacked and use the
  oneDNN kernel from :data:`PACKED_MIN_ROWS` rows, ``F.linear`` below; smaller matrices keep a transposed
  copy, used except at :data:`TRANSPOSED_SKIP_ROWS` rows (``F.linear`` there), and by compiled graphs at
  every row count;
* bfloat16 on the CPU: every matrix prepacked, the oneDNN kernel at every row count;
* float64 (the exactness tests), float16 and every accelerator: ``F.linear`` (oneDNN has no float64 kernel;
  cuBLAS needs no help).

A prepacked matrix (or transposed copy) is a second copy (the plain weight stays, for ``F.linear`` and for
training), so prepacking is skipped when the copies would not fit comfortably in memory
(:func:`prepack_allowed`) or when ``SPECFRAME_PREPACK=0`` is set.
"""

from __future__ import annotations

import itertools
import os
import weakref

import torch
import torch.nn.functional as F

from specframe.envflags import env_flag

PACKED_MIN_ROWS = 3
"""Rows from which the float32 prepacked oneDNN kernel beats ``F.linear`` (measured: 2 rows tie, 4 win)."""

PACK_MIN_ELEMENTS = 1 << 20
"""Smallest float32 matrix worth prepacking (below it the oneDNN call's fixed cost dominates)."""

TRANSPOSED_SKIP_ROWS = (2, 3)
"""Row counts at which a small float32 matrix's transposed copy loses to ``F.linear`` (measured)."""

_PACK_HINT = {torch.float32: 16, torch.bfloat16: 4}  # oneDNN's batch-size hint (measured best of 1/4/16/64)
_MEMORY_SHARE = 0.25  # prepacked copies may take at most this share of physical memory


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

    Only on the CPU, for float32 and bfloat16, with oneDNN available, when the copies take at most a
    quarter of physical memory, and unless ``SPECFRAME_PREPACK=0`` is set.
    """
    if not env_flag("SPECFRAME_PREPACK", default=True):
        return False
    if device.type != "cpu" or dtype not in _PACK_HINT or not onednn_available():
        return False
    memory = physical_memory_bytes()
    return memory is None or weight_bytes <= _MEMORY_SHARE * memory


_REGISTRY: dict[int, weakref.ref] = {}  # key -> Projection with a prepacked copy, for graphs (see project)
_KEYS = itertools.count()


@torch.library.custom_op("specframe::project", mutates_args=())
def project(x: torch.Tensor, key: int, out_features: int) -> torch.Tensor:
    """``x @ weight.T`` by the :class:`Projection` registered under ``key``, with its kernel for ``x``'s rows.

    An operator of its own so that compiled graphs (:mod:`specframe.models.compiled`) multiply with the
    same kernels as the eager path, chosen at run time by row count: the prepacked copy is an opaque oneDNN
    tensor, which a graph cannot take as an input, so a graph names the projection by its key instead.
    """
    projection = _REGISTRY[key]()
    if projection is None:
        raise RuntimeError(f"projection {key} was freed while a compiled graph still uses it")
    return projection(x.contiguous())


@project.register_fake
def _project_shape(x: torch.Tensor, key: int, out_features: int) -> torch.Tensor:
    return x.new_empty(x.shape[0], out_features)


class Projection:
    """A bias-free linear map ``x @ weight.T`` for ``[R, in]`` rows, with the kernel picked by row count.

    Args:
        weight: ``[out, in]`` weight (kept as is and used by ``F.linear``).
        prepack: Also keep a prepacked oneDNN copy, or for a small float32 matrix a transposed one (see
            :func:`prepack_allowed`).

    Attributes:
        packed: The prepacked oneDNN copy, or ``None``.
        transposed: The contiguous ``[in, out]`` copy of a small float32 matrix, or ``None``.
    """

    __slots__ = ("weight", "packed", "transposed", "min_rows", "key", "__weakref__")

    def __init__(self, weight: torch.Tensor, *, prepack: bool) -> None:
        self.weight = weight
        self.packed: torch.Tensor | None = None
        self.transposed: torch.Tensor | None = None
        self.min_rows = 0
        self.key: int | None = None  # with a prepacked copy: the key graphs call it by (see project)
        small = weight.dtype == torch.float32 and weight.numel() < PACK_MIN_ELEMENTS
        if prepack and small:
            self.transposed = weight.detach().t().contiguous()
        if prepack and weight.dtype in _PACK_HINT and not small:
            self.packed = torch.ops.mkldnn._reorder_linear_weight(weight, _PACK_HINT[weight.dtype])
            self.min_rows = PACKED_MIN_ROWS if weight.dtype == torch.float32 else 1
            self.key = next(_KEYS)
            _REGISTRY[self.key] = weakref.ref(self)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """``x @ weight.T`` for ``x`` shaped ``[R, in]``."""
        if self.packed is not None and x.shape[0] >= self.min_rows:
            return torch.ops.mkldnn._linear_pointwise(x, self.packed, None, "none", [], "")
        if self.transposed is not None and x.shape[0] not in TRANSPOSED_SKIP_ROWS:
            return torch.mm(x, self.transposed)
        return F.linear(x, self.weight)
