"""Top-p (nucleus) truncation, exact and cheap on CPUs.

The reference semantics (:func:`nucleus_sorted`): sort each row's probabilities in descending order, ties by
ascending token index (a stable sort), keep each token whose mass before it is ``< top_p`` (so the token that
crosses ``top_p`` is kept), zero the others and renormalise. On a CPU the full-vocabulary sort dominates: a
``topk`` of a few dozen or a few hundred entries per row costs a fraction of it (the figures:
``docs/performance.md#host-side-choices``).

:func:`nucleus` computes the same result from the ``m`` largest entries of each row only:

* ``topk`` returns the ``m`` largest values with multiplicity, so their values sorted descending are exactly the
  first ``m`` values of the full sort, and their cumulative sums (a sequential scan: a prefix depends only on
  the prefix) equal the full sort's first ``m`` cumulative sums, bit for bit. The keep decision of each of the
  first ``m`` ranks is therefore exact.
* Which *token* holds a rank is exact for every value strictly above the ``m``-th candidate's value: all tokens
  with such a value are candidates, and ordering the candidates by value, then index (indices sorted
  ascending, then a stable sort by value) reproduces the stable sort's order among them.
* The kept ranks form a prefix (the mass before a rank never decreases along the sort: it is a rounded sum of
  non-negative terms minus a non-increasing term). So a row is exact when its last kept candidate's value is
  strictly above the ``m``-th candidate's value (the cut lies inside the candidates, and no tied token outside
  them could precede it), or when the ``m``-th candidate's value is 0 (every token outside the candidates is
  0, and a kept 0 changes nothing).

The kept candidates are scattered into a zero tensor, which then holds exactly the values the reference's
``masked_fill`` leaves, so the renormalising sum and division are the reference's too. Rows that fail the
check take the full sort, those rows only, and the masked rows are renormalised together as the reference
does. The check costs one host read, free on a CPU; on other devices it would be a synchronisation per call,
so they keep the full sort.

On a CPU the sort is numpy's (:func:`host_nucleus`: a vectorised sort of integer keys, in place of the
``torch.sort`` that would dominate the call; see ``docs/performance.md#host-side-choices``). Each float32
probability and its token id are packed into one 64-bit key, ``(~bits) << 32 | id`` (the bits of a
non-negative float order as the float), so a vectorised sort of integers orders a row by decreasing
probability, ties by increasing id -- the stable sort's order. The row's 512 smallest keys are set apart by
a partition and sorted; the rest of a row is sorted only when its cut lies past them. The mass before each
rank is accumulated in float64 and rounded to the probabilities' dtype, as torch's CPU ``cumsum`` does, and
compared with ``top_p`` in that dtype, so the kept tokens are the reference's, bit for bit. It is
accumulated over the first 512 ranks, then over 4x longer prefixes for the rows whose cut lies beyond
(continuing from the previous prefix's float64 total, which is exactly the sequential sum). Other dtypes
take a stable ``argsort``. The dense warp's fallback rows (:func:`nucleus_candidates`) and its wide top-k
case take the same host sort.
"""

from __future__ import annotations

import sys

import torch

from specframe.acceptance.select import numpy, numpy_readable

#: Candidates per row tried first when no smaller top-k bounds the kept tokens.
DEFAULT_CANDIDATES = 64

#: The candidate count grows to at most this fraction of the vocabulary: a ``topk`` of many candidates costs
#: nearly what the full sort does, so past this share the candidates stop paying for themselves. A larger
#: top-k than this bound (``top_k + 1`` candidates) takes the full sort directly. Tuned on one machine:
#: ``docs/performance.md#host-side-choices``.
MAX_CANDIDATE_SHARE = 0.25

#: The candidate count doubles for the next call when more than one row in this many took the full sort.
UNDECIDED_SHARE = 4


#: Ranks whose mass before them is accumulated first; rows whose cut lies beyond take 4x longer prefixes. As
#: long as :data:`HOST_HEAD`: on a CPU after a forward, each numpy call costs more than its elements do.
HOST_PREFIX = 512

#: Ranks :func:`host_nucleus` sorts for every row (a partition sets them apart first); the rest of a row is
#: sorted only when its cut lies past them. It trades a partition per row for sorting a head that holds most
#: rows' nuclei (top-p 0.9 on the bundled model), so that few rows sort the rest. Tuned on one machine:
#: ``docs/performance.md#host-side-choices``.
HOST_HEAD = 512


def host_nucleus(
    probs: numpy.ndarray, top_p: float, ids: numpy.ndarray | None = None
) -> tuple[numpy.ndarray, numpy.ndarray]:
    """Each row's nucleus by a sort on the host, as :func:`nucleus_sorted` sorts and keeps.

    Args:
        probs: Finite, non-negative ``[rows, n]`` numpy probabilities (float32 or float64).
        top_p: Nucleus mass, in ``(0, 1)``.
        ids: ``[rows, n]`` int64 token ids of the entries (distinct in a row, below ``2**32``); ``None``:
            the column numbers.

    Returns:
        ``(ids, kept)``: each row's ``K`` first token ids in decreasing probability, ties by increasing id
        (``[rows, K]`` int64, ``K`` the widest nucleus; the crossing token is kept), and their probabilities
        where the nucleus keeps them, 0 past a row's nucleus (not renormalised).
    """
    rows, width = probs.shape
    ranking = _KeyRanking if probs.dtype == numpy.float32 and sys.byteorder == "little" else _SortRanking
    ranked = ranking(probs, ids)
    todo = carry = counts = first = None  # todo: the rows whose cut may lie past the prefixes so far (None: all)
    begin, end = 0, min(HOST_PREFIX, width)
    while True:
        values = ranked.values(todo, begin, end)
        first = values if first is None else first
        # A float64 cumulative sum is sequential, so starting it from the previous prefix's total gives exactly
        # the full row's sums; they are rounded to the dtype as torch's CPU cumsum rounds them.
        if carry is None:
            mass = values.astype(numpy.float64).cumsum(1)
        else:
            mass = numpy.concatenate((carry[:, None], values), 1).cumsum(1)[:, 1:]
        before = mass.astype(values.dtype)
        before -= values
        kept = (before < top_p).sum(1)  # the kept ranks are a prefix: the mass before a rank never decreases
        if counts is None:
            counts = kept
        else:
            counts[todo] += kept
        more = kept == end - begin
        if end == width or not more.any():
            break
        todo = numpy.flatnonzero(more) if todo is None else todo[more]
        carry = mass[more, -1]
        begin, end = end, min(4 * end, width)
    top = int(counts.max())
    values = first[:, :top] if top <= first.shape[1] else ranked.values(None, 0, top)
    return ranked.ids(top), numpy.where(_columns(top) < counts[:, None], values, 0).astype(values.dtype, copy=False)


class _KeyRanking:
    """Rows ranked by sorting 64-bit keys: ``(~bits) << 32 | id``, float32 bits in the high half.

    The bits of a non-negative float order as the float, so ascending keys are decreasing probabilities,
    ties by increasing id. Written through a ``[rows, n, 2]`` uint32 view (little-endian: the id is the low
    half). The :data:`HOST_HEAD` smallest keys of each row are partitioned off and sorted; the rest of a row
    is sorted when its cut lies past them.
    """

    def __init__(self, probs, ids) -> None:
        rows, width = probs.shape
        self.keys = numpy.empty((rows, width), dtype=numpy.uint64)
        self.halves = self.keys.view(numpy.uint32).reshape(rows, width, 2)
        numpy.invert(probs.view(numpy.uint32), out=self.halves[..., 1])
        self.halves[..., 0] = _columns(width, numpy.uint32) if ids is None else ids
        self.sorted = HOST_HEAD if width > 2 * HOST_HEAD else width
        if self.sorted < width:
            self.keys.partition(self.sorted - 1, axis=1)
            self.keys[:, : self.sorted].sort(axis=1)
        else:
            self.keys.sort(axis=1)
        self.tails = False

    def values(self, rows, begin: int, end: int):
        """``[rows, begin:end]`` of the ranked probabilities (``rows`` ``None``: all; later rows are fewer)."""
        if end > self.sorted and not self.tails:
            self.keys[rows, self.sorted :] = numpy.sort(self.keys[rows, self.sorted :], axis=1)
            self.tails = True
        high = self.halves[:, begin:end, 1] if rows is None else self.halves[rows, begin:end, 1]
        return numpy.invert(high).view(numpy.float32)

    def ids(self, top: int):
        """The first ``top`` ranks' token ids (``[rows, top]`` int64)."""
        return self.halves[:, :top, 0].astype(numpy.int64)


class _SortRanking:
    """Rows ranked by a stable sort of the negated probabilities (ties by increasing id), any dtype."""

    def __init__(self, probs, ids) -> None:
        if ids is None:
            ids = _columns(probs.shape[1])
            order = numpy.argsort(-probs, axis=1, kind="stable")
        else:
            order = numpy.lexsort((ids, -probs), axis=1)
        self.ranked_ids = numpy.take_along_axis(numpy.broadcast_to(ids, probs.shape), order, 1)
        self.ranked = numpy.take_along_axis(probs, order, 1)

    def values(self, rows, begin: int, end: int):
        return self.ranked[:, begin:end] if rows is None else self.ranked[rows, begin:end]

    def ids(self, top: int):
        return self.ranked_ids[:, :top].astype(numpy.int64)


def _columns(width: int, dtype=None):
    """``[1, width]`` column numbers, int64 or ``dtype`` (kept per width and dtype: made once)."""
    columns = _COLUMNS.get((width, dtype))
    if columns is None:
        columns = _COLUMNS[width, dtype] = numpy.arange(width, dtype=dtype or numpy.int64)[None, :]
    return columns


_COLUMNS: dict[tuple, object] = {}


def _masked(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """:func:`_masked_sorted`, by :func:`host_nucleus` on a CPU: the same kept tokens, so the same result."""
    if not (numpy_readable(probs) and probs.shape[0] and bool(torch.isfinite(probs).all())):
        return _masked_sorted(probs, top_p)
    ids, kept = host_nucleus(probs.numpy(), top_p)
    masked = numpy.zeros(probs.shape, dtype=kept.dtype)
    numpy.put_along_axis(masked, ids, kept, 1)
    return torch.from_numpy(masked)


def _masked_sorted(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """``probs`` with the tokens outside each row's nucleus zeroed (not renormalised), by a full stable sort."""
    sorted_probs, order = torch.sort(probs, dim=-1, descending=True, stable=True)
    mass_before = sorted_probs.cumsum(-1) - sorted_probs
    keep_sorted = mass_before < top_p  # the token that crosses top_p is kept
    keep = torch.zeros_like(keep_sorted).scatter_(-1, order, keep_sorted)
    return probs.masked_fill(~keep, 0.0)


def nucleus_sorted(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """The reference: ``probs`` truncated to each row's nucleus by a full stable sort, then renormalised.

    Args:
        probs: Non-negative ``[..., V]`` probabilities (rows summing to about 1).
        top_p: Nucleus mass, in ``(0, 1)``.

    Returns:
        A tensor like ``probs`` with the tokens outside each nucleus zeroed and rows renormalised.
    """
    kept = _masked_sorted(probs, top_p)
    return kept / kept.sum(-1, keepdim=True)


def nucleus_candidates(probs: torch.Tensor, top_p: float, candidates: int) -> tuple[torch.Tensor, int]:
    """:func:`nucleus_sorted`'s result computed from ``candidates`` entries per row where they decide it.

    The rows the candidates do not decide (the module docstring says when) are masked by the full sort,
    those rows only. Reads one flag on the host (and, if some rows fail, their indices).

    Args:
        probs: Non-negative ``[rows, V]`` probabilities.
        top_p: Nucleus mass, in ``(0, 1)``.
        candidates: Entries per row to examine, ``1 <= candidates <= V``.

    Returns:
        The truncated, renormalised ``[rows, V]`` probabilities and how many rows took the full sort.
    """
    values, index = probs.topk(candidates, dim=-1, sorted=False)
    index, by_index = index.sort(dim=-1)
    values = values.gather(-1, by_index)
    values, by_value = values.sort(dim=-1, descending=True, stable=True)
    index = index.gather(-1, by_value)
    keep = (values.cumsum(-1) - values) < top_p
    last = values[:, -1:]
    cut = values.gather(-1, keep.sum(-1, keepdim=True) - 1)  # the last kept value (keep[:, 0] always holds)
    decided = (cut > last) | (last == 0)
    kept = torch.zeros_like(probs).scatter_(-1, index, values * keep)
    undecided = 0
    if not bool(decided.all()):
        rows = (~decided).view(-1).nonzero().view(-1)
        undecided = rows.numel()
        kept.index_copy_(0, rows, _masked(probs.index_select(0, rows), top_p))
    return kept / kept.sum(-1, keepdim=True), undecided


class Nucleus:
    """Top-p truncation that takes :func:`nucleus_candidates` where it can, adapting the candidate count.

    Args:
        top_p: Nucleus mass, in ``(0, 1)``.
        top_k: The top-k applied before, if any: with it at most ``top_k`` tokens (plus ties) are non-zero,
            so ``top_k + 1`` candidates usually decide every row.

    Without a top-k the count starts at :data:`DEFAULT_CANDIDATES` and doubles after a call where more than
    one row in :data:`UNDECIDED_SHARE` took the full sort, up to :data:`MAX_CANDIDATE_SHARE` of the vocabulary.
    """

    def __init__(self, top_p: float, top_k: int | None = None) -> None:
        self.top_p = top_p
        self.candidates = top_k + 1 if top_k is not None else DEFAULT_CANDIDATES

    def __call__(self, probs: torch.Tensor) -> torch.Tensor:
        """``probs`` (``[..., V]``) truncated to each row's nucleus and renormalised, as :func:`nucleus_sorted`."""
        vocab = probs.shape[-1]
        if probs.device.type != "cpu":
            return nucleus_sorted(probs, self.top_p)
        flat = probs.reshape(-1, vocab)
        if self.candidates > vocab * MAX_CANDIDATE_SHARE:
            kept = _masked(flat, self.top_p)
            return (kept / kept.sum(-1, keepdim=True)).view(probs.shape)
        result, undecided = nucleus_candidates(flat, self.top_p, self.candidates)
        if undecided * UNDECIDED_SHARE > flat.shape[0]:
            # Wider nuclei than the candidates hold: take more next time, up to the cap (the result never
            # depends on the count). At the cap the undecided rows keep taking the full sort, those rows only.
            self.candidates = max(self.candidates, min(2 * self.candidates, int(vocab * MAX_CANDIDATE_SHARE)))
        return result.view(probs.shape)
