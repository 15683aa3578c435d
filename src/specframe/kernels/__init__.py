"""specframe's own CPU kernels for verification calls: row-invariant and weight-stationary.

* **Row-invariant:** every output element is reduced in one order fixed by the weights' (or keys') shape alone,
  never by the number of rows in the call, their place in it, or the batch. A position verified in a 10-row
  Packed-SS call therefore gets bitwise the logits a 1-row AR call gives it, in every dtype.
* **Weight-stationary:** each weight block is read (and, for GGUF's block formats, decoded) once per call and
  applied to all the call's rows while it sits in registers or L1, so extra rows cost compute, not bandwidth.

Operators (``torch.ops.specframe_kernels``): ``linear(x, weight, format, out_features)`` over float32,
bfloat16, Q8_0, Q4_0 and Q4_1 weights (:mod:`specframe.kernels.quant`), and ``attention(q, keys, values,
visible, scale, rows=None)``, where each (row, head) reduces over its visible keys in key order (key ``j`` at
row ``rows[j]`` of a paged cache's blocks when a row map is given, read in place), and
``rms_norm(x, weight, eps)``, ``silu_mul(gate_up)`` and ``rope(x, cos, sin)``, each row alone, and
``decode_layers(...)``, which runs a model's decoder layers by those operators in one call
(:class:`specframe.models.forward.LayerProgram` builds its arguments). All are
``torch.library``
operators, so compiled graphs call them too. They are built on first use (:mod:`specframe.kernels.build`);
where they cannot be, :func:`unavailable_reason` says why and models run torch's kernels.
"""

from __future__ import annotations

import functools

import torch

from specframe.kernels.build import SWITCH, build_id, load, one_thread_reason, unavailable_reason
from specframe.kernels.quant import FORMATS, PACKED_OFFSET, QUANTIZED, Format, dequantize, format_of, quantize, repack

__all__ = [
    "FORMATS",
    "PACKED_OFFSET",
    "QUANTIZED",
    "SWITCH",
    "Format",
    "available",
    "build_id",
    "dequantize",
    "format_of",
    "quantize",
    "repack",
    "group_rows",
    "one_thread_reason",
    "unavailable_reason",
    "variant",
    "variants",
    "select_variant",
]


@functools.cache
def available() -> bool:
    """Whether the kernels are built and loaded (their operators registered, with shapes for compiled graphs)."""
    module = load()
    if module is None:
        return False
    torch.library.register_fake("specframe_kernels::linear")(_linear_shape)
    torch.library.register_fake("specframe_kernels::attention")(_attention_shape)
    torch.library.register_fake("specframe_kernels::rms_norm")(_norm_shape)
    torch.library.register_fake("specframe_kernels::silu_mul")(_silu_mul_shape)
    torch.library.register_fake("specframe_kernels::rope")(_rope_shape)
    torch.library.register_fake("specframe_kernels::adapt")(_adapt_shape)
    return True


def _linear_shape(x: torch.Tensor, weight: torch.Tensor, format: int, out_features: int) -> torch.Tensor:
    return x.new_empty(x.shape[0], out_features)


def _attention_shape(
    q: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    visible: torch.Tensor,
    scale: float,
    rows: torch.Tensor | None = None,
) -> torch.Tensor:
    return q.new_empty(q.shape[0], q.shape[1] * q.shape[2])


def _norm_shape(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return torch.empty_like(x)


def _silu_mul_shape(gate_up: torch.Tensor) -> torch.Tensor:
    return gate_up.new_empty(gate_up.shape[0], gate_up.shape[1] // 2)


def _rope_shape(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


def _adapt_shape(
    projected: torch.Tensor, x: torch.Tensor, a: torch.Tensor, b: torch.Tensor, scale: float, rows: torch.Tensor
) -> torch.Tensor:
    return torch.empty_like(projected)


def variant() -> str | None:
    """The instruction-set variant the kernels run (``"avx512+vnni"``, ``"avx2"``, ``"portable"``, ...), or ``None``."""
    module = load()
    return None if module is None else module.variant()


def variants() -> list[str]:
    """The variants this CPU can run, best last (empty without the kernels)."""
    module = load()
    return [] if module is None else list(module.variants())


def group_rows() -> int:
    """Weight rows per group of the block formats the variant in use interleaves (0: it runs GGUF's layout).

    Models loaded while it is nonzero keep their quantized matrices interleaved in groups of that many rows
    (:func:`~specframe.kernels.quant.repack`: 16 with AVX-512, 8 with AVX2), so that one integer dot-product
    step serves that many outputs; the portable path runs GGUF's layout.
    """
    module = load()
    return 0 if module is None else int(module.group_rows())


def select_variant(name: str) -> None:
    """Run the ``name`` variant from now on (tests compare variants on one machine; results differ by variant).

    Raises:
        RuntimeError: If the kernels are unavailable or this CPU cannot run ``name``.
    """
    module = load()
    if module is None:
        raise RuntimeError(f"specframe's kernels are unavailable: {unavailable_reason()}")
    module.select_variant(name)
