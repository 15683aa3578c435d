"""GGUF's block quantizations as specframe keeps them: Q8_0, Q4_0 and Q4_1, byte for byte llama.cpp's layout.

A quantized ``[out, in]`` matrix is a ``uint8`` tensor ``[out, in / 32 * block_bytes]``: each row is its
blocks of 32 weights in order, each block as GGUF stores it (little-endian float16 scale ``d``, Q4_1 a float16
minimum ``m``, then the codes; a 4-bit block holds weight ``i`` in the low nibble of byte ``i`` and weight
``16 + i`` in its high nibble). A GGUF's tensors can therefore be used as they are (``convert --quant keep``),
and :func:`quantize` rounds float weights the way llama.cpp's reference quantizer does.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

BLOCK = 32
"""Weights per block (every format here)."""


@dataclass(frozen=True)
class Format:
    """One weight format of the kernels.

    Attributes:
        name: ``"f32"``, ``"bf16"``, ``"q8_0"``, ``"q4_0"`` or ``"q4_1"``.
        code: The number the C++ operator takes.
        block_bytes: Bytes per block of 32 weights (0: a dense format).
    """

    name: str
    code: int
    block_bytes: int

    @property
    def quantized(self) -> bool:
        """Whether weights are stored as blocks (activations are then quantized per row in the kernel)."""
        return self.block_bytes > 0


FORMATS = {
    f.name: f
    for f in (
        Format("f32", 0, 0),
        Format("bf16", 1, 0),
        Format("q8_0", 2, 34),
        Format("q4_0", 3, 18),
        Format("q4_1", 4, 20),
    )
}
QUANTIZED = tuple(name for name, f in FORMATS.items() if f.quantized)
"""The block formats a model's projections can be quantized to (``--quant``)."""


def format_of(name: str) -> Format:
    """The :class:`Format` called ``name``.

    Raises:
        ValueError: For an unknown name, listing the known ones.
    """
    try:
        return FORMATS[name]
    except KeyError:
        raise ValueError(f"unknown weight format {name!r}; use one of {', '.join(FORMATS)}") from None


def _halves(values: torch.Tensor) -> torch.Tensor:
    """float32 values rounded to float16, as ``[..., 2]`` little-endian bytes."""
    return values.to(torch.float16).contiguous().view(torch.uint8).view(*values.shape, 2)


def _from_halves(data: torch.Tensor) -> torch.Tensor:
    return data.contiguous().view(torch.float16).squeeze(-1).float()


def quantize(weight: torch.Tensor, name: str) -> torch.Tensor:
    """``weight`` (``[out, in]``, ``in`` a multiple of 32) as blocks of format ``name`` (llama.cpp's rounding).

    Raises:
        ValueError: For an unknown or dense format, or an input size that is not a multiple of 32.
    """
    fmt = format_of(name)
    if not fmt.quantized:
        raise ValueError(f"{name} is not a block format; quantize to one of {', '.join(QUANTIZED)}")
    rows, columns = weight.shape
    if columns % BLOCK:
        raise ValueError(f"a {rows}x{columns} matrix cannot be quantized: its input size must be a multiple of 32")
    x = weight.detach().float().reshape(rows, columns // BLOCK, BLOCK)
    if name == "q8_0":
        d = x.abs().amax(-1) / 127
        inverse = torch.where(d > 0, 1 / d, torch.zeros_like(d))
        codes = torch.round(x * inverse[..., None]).to(torch.int8).view(torch.uint8)
        blocks = torch.cat([_halves(d), codes], dim=-1)
    elif name == "q4_0":
        where = x.abs().argmax(-1, keepdim=True)  # the first value of largest magnitude, with its sign
        d = x.gather(-1, where).squeeze(-1) / -8
        inverse = torch.where(d != 0, 1 / d, torch.zeros_like(d))
        codes = torch.trunc(x * inverse[..., None] + 8.5).clamp(0, 15).to(torch.uint8)
        blocks = torch.cat([_halves(d), codes[..., :16] | (codes[..., 16:] << 4)], dim=-1)
    else:  # q4_1
        low, high = x.amin(-1), x.amax(-1)
        d = (high - low) / 15
        inverse = torch.where(d != 0, 1 / d, torch.zeros_like(d))
        codes = torch.trunc((x - low[..., None]) * inverse[..., None] + 0.5).clamp(0, 15).to(torch.uint8)
        blocks = torch.cat([_halves(d), _halves(low), codes[..., :16] | (codes[..., 16:] << 4)], dim=-1)
    return blocks.reshape(rows, -1).contiguous()


def dequantize(blocks: torch.Tensor, name: str) -> torch.Tensor:
    """The float32 ``[out, in]`` weights that blocks of format ``name`` hold (as llama.cpp decodes them).

    Raises:
        ValueError: For an unknown or dense format, or rows whose length is not a whole number of blocks.
    """
    fmt = format_of(name)
    if not fmt.quantized:
        raise ValueError(f"{name} is not a block format")
    rows, length = blocks.shape
    if length % fmt.block_bytes:
        raise ValueError(f"rows of {length} bytes are not whole {name} blocks of {fmt.block_bytes} bytes")
    b = blocks.reshape(rows, length // fmt.block_bytes, fmt.block_bytes)
    d = _from_halves(b[..., 0:2])[..., None]
    if name == "q8_0":
        return (d * b[..., 2:].contiguous().view(torch.int8).float()).reshape(rows, -1)
    packed = b[..., 4:] if name == "q4_1" else b[..., 2:]
    codes = torch.cat([packed & 0x0F, packed >> 4], dim=-1).float()
    if name == "q4_0":
        return (d * (codes - 8)).reshape(rows, -1)
    return (d * codes + _from_halves(b[..., 2:4])[..., None]).reshape(rows, -1)


PACKED_OFFSET = 8
"""An interleaved block format's operator code is its block format's code plus this (see :func:`repack`)."""


def repack(blocks: torch.Tensor, name: str, group: int) -> torch.Tensor:
    """GGUF-layout blocks of format ``name`` interleaved for the SIMD kernels (the same bytes, moved).

    Rows go in groups of ``group`` (the kernel's vector lanes: 16 with AVX-512, 8 with AVX2). Each group is one
    run of memory holding, block after block: the group's codes in chunks of ``4 * group`` bytes (bytes
    ``4r .. 4r + 3`` of a chunk are row ``r``'s code bytes ``4c .. 4c + 3``: 4 chunks for the 4-bit formats,
    whose bytes keep both nibbles, 8 for Q8_0), then the ``group`` float16 scales and, for Q4_1, the ``group``
    float16 minima. Missing rows are zeros. Nothing is rounded: :func:`dequantize` of the input and the
    kernel's use of the output see the same codes and scales.

    Returns:
        ``uint8 [ceil(out / group), blocks * group * block bytes]``.

    Raises:
        ValueError: For a dense format or a group size that is not a positive multiple of 4.
    """
    fmt = format_of(name)
    if not fmt.quantized:
        raise ValueError(f"{name} is not a block format")
    if group < 4 or group % 4:
        raise ValueError(f"rows are interleaved in groups of a positive multiple of 4, got {group}")
    rows, length = blocks.shape
    count = length // fmt.block_bytes
    groups = -(-rows // group)
    padded = torch.zeros(groups * group, count, fmt.block_bytes, dtype=torch.uint8)
    padded[:rows] = blocks.reshape(rows, count, fmt.block_bytes)
    b = padded.view(groups, group, count, fmt.block_bytes).permute(0, 2, 1, 3)  # [group, block, row, byte]
    start = 4 if name == "q4_1" else 2
    codes = b[..., start:]
    chunks = codes.reshape(groups, count, group, codes.shape[-1] // 4, 4).permute(0, 1, 3, 2, 4)
    parts = [chunks.reshape(groups, count, -1), b[..., 0:2].reshape(groups, count, 2 * group)]
    if name == "q4_1":
        parts.append(b[..., 2:4].reshape(groups, count, 2 * group))
    return torch.cat(parts, dim=-1).reshape(groups, -1).contiguous()
