"""Rejection sampling of top-k and top-p truncated distributions on the host, for logits on the CPU.

A top-k distribution has ``k`` non-zero entries per row, a top-p one its nucleus. On a CPU, working on the
dense ``[rows, V]`` probabilities costs some fifty torch operations per Packed-SS call (each a few
microseconds of dispatch, most of them passes over the whole vocabulary): the warp, the gathers of ``p`` and
``q``, the residual, the cumulative sums of the draws. Here the warp keeps each row's candidates as
``[rows, k]`` token ids and probabilities (numpy arrays viewing the same memory as the tensors the proposals
store), and the rest of the step -- acceptance tests, residual, draws -- works on those small arrays.

It is the same procedure as the dense path (:mod:`specframe.acceptance.rejection`), entry for entry:

* the kept tokens are those whose scaled logit is >= the row's k-th largest (``numpy.argpartition`` finds
  the k + 1 largest); a row where the k-th and the (k + 1)-th are equal (tokens tied with the k-th are all kept, so
  the row has more than ``k`` entries) or where a candidate is not finite makes :func:`top_k_candidates`
  return ``None``, and the caller takes the dense path for that call;
* probabilities are the softmax over the kept logits (a dropped logit's weight is exactly 0 in the dense
  softmax too), and a top-p after the top-k is the nucleus of the candidates sorted by decreasing
  probability, ties by increasing token id, as :func:`~specframe.acceptance.nucleus.nucleus_sorted` sorts;
* a top-p without top-k takes the warp's dense softmax (torch's, as the dense path) and its nucleus by
  :func:`~specframe.acceptance.nucleus.host_nucleus`, which keeps exactly the reference's tokens: a row's
  candidates are its nucleus in that order, padded with its next tokens at probability 0 to the widest
  row's count (so each call's candidates have their own width; a chain of proposals of several widths is
  padded with id -1, probability 0); a row of NaN (NaN or infinite logits) takes the dense path;
* a draw is inverse-CDF sampling over a row's entries, as :func:`~specframe.acceptance.rejection.sample_rows`:
  a token of zero weight is never drawn.

The two paths differ only in rounding (sums taken in another order), so they define the same distributions
and the output is exact either way; which of them served a call does not matter to the next one (stored
proposals are read densely or sparsely by whichever path verifies them). The uniforms come from the request's
torch generator, one ``torch.rand`` per call.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch

from specframe.acceptance.base import DraftRef, Proposals, Verdict, chain_rows, draft_tokens
from specframe.acceptance.nucleus import host_nucleus
from specframe.acceptance.select import numpy, numpy_readable

#: Larger top-k values take the dense path: the residual compares every candidate of a row with every entry
#: of its proposal (``k x k``), and past a few hundred candidates the dense passes cost no more.
MAX_TOP_K = 256


class Candidates(NamedTuple):
    """Each row's kept tokens: ``[rows, k]`` token ids and their probabilities (numpy arrays)."""

    ids: object
    probs: object


def top_k_candidates(
    logits: torch.Tensor, top_k: int, temperature: float = 1.0, top_p: float | None = None
) -> Candidates | None:
    """The top-k (then top-p) warped distributions of ``[rows, V]`` CPU logits, as candidates.

    Returns:
        The candidates, or ``None`` where the dense path must serve the call: logits numpy cannot read in
        place, ``top_k >= V`` or above :data:`MAX_TOP_K`, a row with a tie at its k-th largest logit, or a
        non-finite candidate.
    """
    if not numpy_readable(logits) or logits.dim() != 2 or not 0 < top_k < min(logits.shape[1] - 1, MAX_TOP_K + 1):
        return None
    scaled = logits.numpy()
    if scaled.dtype == numpy.float16:  # as the dense path: float32, or float64 for float64 logits
        scaled = scaled.astype(numpy.float32)
    if temperature != 1.0:
        scaled = scaled / scaled.dtype.type(temperature)
    cut = scaled.shape[1] - top_k - 1
    # The k + 1 largest of each row, the (k + 1)-th in column 0 (argpartition puts it in place: one
    # introselect; asking for the k-th's place too costs a second one; docs/performance.md#host-side-choices)
    top = numpy.argpartition(scaled, cut, axis=1)[:, cut:]
    values = scaled[_rows(top.shape[0]), top]  # (not take_along_axis: it builds this index in Python)
    ids, beyond, values = numpy.ascontiguousarray(top[:, 1:]), values[:, 0], values[:, 1:]
    if (values.min(1) <= beyond).any() or not numpy.isfinite(values).all():
        return None  # a tie at the k-th largest (more than k kept tokens), or NaN
    weights = numpy.exp(values - values.max(1, keepdims=True))
    probs = weights / weights.sum(1, keepdims=True)
    if top_p is None:
        return Candidates(ids, probs)
    return _nucleus(*host_nucleus(probs, top_p, ids))


def top_p_candidates(probs: torch.Tensor, top_p: float) -> Candidates | None:
    """The nuclei of ``[rows, V]`` CPU probabilities (the warp's softmax), as candidates.

    Each row's candidates are its nucleus in decreasing probability, ties by increasing id (a row narrower
    than the widest one is padded with its next tokens, of probability 0).

    Returns:
        The candidates, or ``None`` where the dense path must serve the call: probabilities numpy cannot
        read in place, or a row of NaN (a softmax over NaN or infinite logits is NaN throughout).
    """
    if not numpy_readable(probs) or probs.dim() != 2 or not probs.shape[0]:
        return None
    values = probs.numpy()
    if not numpy.isfinite(values[:, 0]).all():
        return None
    return _nucleus(*host_nucleus(values, top_p))


def _nucleus(ids, kept) -> Candidates:
    """:func:`~specframe.acceptance.nucleus.host_nucleus`'s ranks as candidates, renormalised."""
    return Candidates(ids, kept / kept.sum(1, keepdims=True))


def _rows(count: int):
    """``[count, 1]`` row numbers, to index one entry per row (kept per count: made once)."""
    rows = _ROWS.get(count)
    if rows is None:
        rows = _ROWS[count] = numpy.arange(count)[:, None]
    return rows


_ROWS: dict[int, object] = {}


def draw(ids: numpy.ndarray, probs: numpy.ndarray, uniforms: numpy.ndarray) -> tuple[numpy.ndarray, numpy.ndarray]:
    """One token per row of candidate ``probs`` (each row with positive mass), inverse-CDF from ``uniforms``.

    Returns:
        ``(tokens, probabilities)``: the drawn token ids and the probability their row gave them.
    """
    cumulative = probs.cumsum(1)
    thresholds = (1.0 - uniforms) * cumulative[:, -1]  # in (0, total]: 1 - u with u in [0, 1)
    index = (cumulative < thresholds[:, None]).sum(1)
    rows = _rows(len(index))[:, 0]
    return ids[rows, index], probs[rows, index]


def draw_one(ids, probs, uniform: float) -> int:
    """:func:`draw` of one row (1-D ``ids`` and ``probs``)."""
    cumulative = probs.cumsum()
    return int(ids[numpy.searchsorted(cumulative, (1.0 - uniform) * cumulative[-1])])


def _residual(p, q):
    """The normalisable residual ``max(p - q, 0)``, or ``p`` where rounding leaves it no mass."""
    residual = numpy.maximum(p - q, 0)
    return residual if residual.sum() > 0 else p


def _lookup(ids, probs, tokens):
    """The probability a candidate row (``ids``, ``probs``; id -1 pads) gives each of ``tokens`` (0 if none).

    Through a dense scratch row (a [K, K] comparison grows with the square of the widest nucleus, which top-p
    makes hundreds of tokens wide); the pads write their 0 to a spare last slot.
    """
    scratch = numpy.zeros(int(max(ids.max(), tokens.max())) + 2, dtype=probs.dtype)
    scratch[ids] = probs
    return scratch[tokens]


def host_chain(drafts: Sequence[DraftRef]):
    """The chain's draft tokens and their proposals' candidates ``(tokens, ids, probs)``, or ``None``.

    ``None`` when a draft's proposals are not sparse CPU candidates (drawn by the dense path): the dense
    path then verifies.
    """
    ids, probs = [], []
    for batch, rows in chain_rows(drafts):
        if batch.ids is None or batch.ids.device.type != "cpu":
            return None
        if isinstance(rows, torch.Tensor):
            rows = rows.numpy()
        ids.append(batch.ids.numpy()[rows])
        probs.append(batch.probs.numpy()[rows])
    widths = {a.shape[1] for a in ids}
    if len(widths) > 1:  # batches of other widths (top-p nuclei): padded with id -1, probability 0
        width = max(widths)
        ids = [numpy.pad(a, ((0, 0), (0, width - a.shape[1])), constant_values=-1) for a in ids]
        probs = [numpy.pad(a, ((0, 0), (0, width - a.shape[1]))) for a in probs]
    tokens = numpy.array(draft_tokens(drafts), dtype=numpy.int64)
    if len(ids) == 1:
        return tokens, ids[0], probs[0]
    return tokens, numpy.concatenate(ids), numpy.concatenate(probs)


def step(
    drafts: Sequence[DraftRef],
    chain: tuple | None,
    candidates: Candidates,
    num_verify: int,
    generator: torch.Generator | None,
) -> tuple[Proposals | None, Verdict]:
    """Verify ``drafts`` against the first ``num_verify`` candidate rows and draw the rest as new proposals.

    As the dense path: draft ``d`` is accepted with probability ``min(1, p(d)/q(d))`` (``u q < p``); after the
    first rejection the verifier's token is drawn from ``max(p - q, 0)`` (from ``p`` should rounding leave
    it no mass), after a full accept from the next rank's ``p`` when there is one. One uniform per draft, one
    for the verifier's token (drawn even when discarded) and one per new proposal, in one ``torch.rand``.

    Args:
        drafts: The chain, as the rule's ``verify`` takes it.
        chain: :func:`host_chain` of ``drafts``.
        candidates: The warped rows: ``num_verify`` verifier rows, then the drafter rows.
        num_verify: How many leading rows are verifier rows.
        generator: The request's random generator.
    """
    ids, probs = candidates
    kappa = len(drafts)
    fresh = ids.shape[0] - num_verify
    uniforms = torch.rand(kappa + 1 + fresh, generator=generator, dtype=torch.float64).numpy()
    accepted = 0
    if kappa:
        tokens, proposal_ids, proposal_probs = chain
        p = (probs[:kappa] * (ids[:kappa] == tokens[:, None])).sum(1)
        q = (proposal_probs * (proposal_ids == tokens[:, None])).sum(1)
        passed = uniforms[:kappa] * q < p
        accepted = kappa if passed.all() else int(passed.argmin())
    token = None
    if accepted < num_verify:
        verifier = probs[accepted]
        if accepted < kappa:  # a rejection: the residual max(p - q, 0) over the verifier's candidates
            verifier = _residual(verifier, _lookup(chain[1][accepted], chain[2][accepted], ids[accepted]))
        token = draw_one(ids[accepted], verifier, uniforms[kappa])
    verify_probs = probs[:num_verify]
    verdict = Verdict(accepted, token, lambda: torch.from_numpy(verify_probs.max(1)))
    if not fresh:
        return None, verdict
    new_tokens, new_probs = draw(ids[num_verify:], probs[num_verify:], uniforms[kappa + 1 :])
    proposals = Proposals(
        new_tokens.tolist(),
        lambda: torch.from_numpy(new_probs),
        probs=torch.from_numpy(probs[num_verify:]),
        ids=torch.from_numpy(ids[num_verify:]),
    )
    return proposals, verdict
