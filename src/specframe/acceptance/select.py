"""Row-wise selections over logits, exact and cheap on CPUs: the first argmax and the k-th largest value.

On a CPU, reductions that track an index (``max`` with indices, ``argmax``, ``topk``) run a scalar loop per
element, where a plain ``amax`` is vectorised, so they cost many times more per element. Both selections
here therefore first reduce each row to a few candidates with vectorised ``amax`` over chunks and run the
indexed reduction on those only. The results are exactly those of the plain reductions, ties included; rows
too small to pay for the extra ops take the plain path. On a CPU the first argmax is numpy's (vectorised,
unlike torch's), read straight into a host list by :func:`host_first_argmax` when the caller needs the
values on the host anyway. Past timings of these choices: ``docs/performance.md#host-side-choices``.
"""

from __future__ import annotations

import math

import torch

try:  # numpy's argmax is vectorised on CPUs (torch's runs a scalar loop); without numpy, torch's is used
    import numpy
except ImportError:  # pragma: no cover - numpy comes with nearly every torch install
    numpy = None

#: Rows shorter than this take the plain ``max`` for their argmax. The chunked one trades 4 ops more per call
#: for a vectorised pass over the row, so it pays on long rows only; short rows (the bundled models' 2048
#: entries) stay in the cache and gain nothing. Tuned on one machine: ``docs/performance.md#host-side-choices``.
CHUNKED_ARGMAX_MIN_VOCAB = 8_192

#: Below this many values the k-th largest value is a plain ``topk``.
CHUNKED_TOPK_MIN = 8_192


def _power_of_two_divisor(size: int, target: float) -> int | None:
    """The power of two nearest ``target`` (within 4x) that divides ``size``, or ``None``."""
    best = None
    for exponent in range(1, 21):
        chunk = 1 << exponent
        if size % chunk or not target / 4 <= chunk <= target * 4:
            continue
        if best is None or abs(math.log(chunk / target)) < abs(math.log(best / target)):
            best = chunk
    return best


def host_first_argmax(logits: torch.Tensor) -> list[int] | None:
    """:func:`first_argmax` of CPU logits as a host list, by numpy; ``None`` where numpy cannot read them.

    numpy's ``argmax`` returns the first maximum of each row as ``max`` does (the first NaN of a row with
    NaN, as torch's NaN-propagating ``max`` does too), so the indices are the same.
    """
    return logits.numpy().argmax(-1).tolist() if numpy_readable(logits) else None


_NUMPY_FLOATS = (torch.float32, torch.float64, torch.float16)


def numpy_readable(tensor: torch.Tensor) -> bool:
    """Whether numpy can work on ``tensor`` in place: numpy is installed and it is a float CPU tensor."""
    return numpy is not None and tensor.is_cpu and tensor.dtype in _NUMPY_FLOATS and not tensor.requires_grad


def first_argmax(logits: torch.Tensor) -> torch.Tensor:
    """``[k]`` index of each row's largest entry, the lowest one among ties (``torch.argmax``'s indices).

    numpy's on a CPU (see :func:`host_first_argmax`), else :func:`chunked_first_argmax`.
    """
    if numpy_readable(logits):
        return torch.from_numpy(logits.numpy().argmax(-1))
    return chunked_first_argmax(logits)


def chunked_first_argmax(logits: torch.Tensor) -> torch.Tensor:
    """:func:`first_argmax` in torch ops, for any device.

    Large inputs are cut into chunks of consecutive entries: a vectorised ``amax`` per chunk, the first
    chunk holding the row's maximum (``max`` over the chunk maxima), then the first maximum inside it. The
    first chunk that holds the maximum holds its first occurrence, so the index is exactly ``max``'s.
    """
    rows, vocab = logits.shape
    length = _power_of_two_divisor(vocab, math.sqrt(vocab)) if vocab >= CHUNKED_ARGMAX_MIN_VOCAB else None
    if length is None or not logits.is_contiguous():
        return logits.max(dim=-1).indices
    chunks = logits.view(rows, vocab // length, length)
    chunk = chunks.amax(-1).max(-1).indices  # [rows]
    inside = chunks.gather(1, chunk.view(rows, 1, 1).expand(rows, 1, length)).view(rows, length)
    return inside.max(-1).indices.add_(chunk, alpha=length)


def kth_largest(values: torch.Tensor, k: int) -> torch.Tensor:
    """``[rows, 1]``: the ``k``-th largest entry of each row of ``[rows, V]`` values (``1 <= k <= V``).

    Counted with multiplicity, so it equals ``torch.topk(values, k).values[:, -1:]``. For a large ``V`` the
    row is split into ``C`` interleaved chunks (entries ``c, c + C, c + 2C, ...``): the ``k`` chunks with the
    largest maxima hold at least ``k`` entries >= the row's ``k``-th largest (if an entry that large lies in
    another chunk, each of the ``k`` chunks' maxima is at least as large; otherwise all of them lie in these
    chunks), so the ``k``-th largest of their union is the row's. Two small ``topk`` then replace one over
    ``V``.
    """
    rows, vocab = values.shape
    count = None
    if rows * vocab >= CHUNKED_TOPK_MIN and values.is_contiguous():
        count = _power_of_two_divisor(vocab, math.sqrt(k * vocab))
    if count is None or count <= k or k * (vocab // count) * 2 > vocab:
        return torch.topk(values, k, dim=-1, sorted=False).values.amin(-1, keepdim=True)
    length = vocab // count
    interleaved = values.view(rows, length, count)  # column c holds chunk c
    best = interleaved.amax(1).topk(k, dim=-1, sorted=False).indices  # [rows, k]
    union = interleaved.gather(2, best.unsqueeze(1).expand(rows, length, k))
    return union.view(rows, length * k).topk(k, dim=-1, sorted=False).values.amin(-1, keepdim=True)
