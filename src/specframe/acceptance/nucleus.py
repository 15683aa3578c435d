"""Top-p (nucleus) truncation, exact and cheap on CPUs.

The reference semantics (:func:`nucleus_sorted`): sort each row's probabilities in descending order, ties by
ascending token index (a stable sort), keep each token whose mass before it is ``< top_p`` (so the token that
crosses ``top_p`` is kept), zero the others and renormalise. On a CPU the full-vocabulary sort dominates: about
1-2 ms for the 17 x 2048 rows of a Packed-SS W=8 call on the 2-core development machine, against ~50 µs for a
``topk`` of 32 and ~200 µs for one of 512.

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
"""

from __future__ import annotations

import torch

#: Candidates per row tried first when no smaller top-k bounds the kept tokens.
DEFAULT_CANDIDATES = 64

#: The candidate count grows to at most this fraction of the vocabulary: measured on the development machine
#: (17 x 2048 float32), 1024 candidates cost as much as the full sort, 512 about 0.7x of it. A larger top-k
#: than this bound (``top_k + 1`` candidates) takes the full sort directly.
MAX_CANDIDATE_SHARE = 0.25

#: The candidate count doubles for the next call when more than one row in this many took the full sort.
UNDECIDED_SHARE = 4


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
        kept.index_copy_(0, rows, _masked_sorted(probs.index_select(0, rows), top_p))
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
        if probs.device.type != "cpu" or self.candidates > vocab * MAX_CANDIDATE_SHARE:
            return nucleus_sorted(probs, self.top_p)
        flat = probs.reshape(-1, vocab)
        result, undecided = nucleus_candidates(flat, self.top_p, self.candidates)
        if undecided * UNDECIDED_SHARE > flat.shape[0]:
            # Wider nuclei than the candidates hold: take more next time, up to the cap (the result never
            # depends on the count). At the cap the undecided rows keep taking the full sort, those rows only.
            self.candidates = max(self.candidates, min(2 * self.candidates, int(vocab * MAX_CANDIDATE_SHARE)))
        return result.view(probs.shape)
