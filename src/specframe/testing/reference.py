"""The plain AR distribution of short outputs, computed exactly, for testing that a plugin samples it.

A schedule or acceptance rule is lossless under sampling when its outputs are distributed as plain AR
sampling's. For a model with a small vocabulary and a short output, :func:`ar_distribution` enumerates that
distribution exactly, with one cache-free forward pass per prefix laid out by the model family's own mask
builder (so it works for every family), and :func:`goodness_of_fit` compares sampled outputs with it::

    exact = ar_distribution(model, [0, 1, 2], 3, SamplingWarp(temperature=1.0))
    counts = Counter(tuple(decoder.generate(prompt_ids=[0, 1, 2], seed=s).output_ids) for s in range(2000))
    assert goodness_of_fit(counts, exact) > 1e-4

Keep the vocabulary tiny (:func:`specframe.testing.models.small_vocabulary`): the outcomes grow as V**length.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import torch

from specframe.acceptance.rejection import SamplingWarp
from specframe.models.base import ModelBackend
from specframe.plan import CallPlan
from specframe.plugins import get_registry


def ar_distribution(
    model: ModelBackend,
    prompt_ids: Sequence[int],
    length: int,
    warp: SamplingWarp | None = None,
    next_logits: Callable[[list[int]], torch.Tensor] | None = None,
) -> dict[tuple[int, ...], float]:
    """Probability of every output of up to ``length`` tokens (ending early at an EOS) under plain AR sampling.

    Args:
        model: A loaded model (float64 makes the probabilities exact to rounding).
        prompt_ids: The prompt's token ids.
        length: The output length limit (``max_new_tokens``).
        warp: The warp the sampler applies (``decoder.rule.warp`` for ``rejection`` and its subclasses);
            ``None``: temperature 1, no truncation.
        next_logits: ``next_logits(ids)``, the ``[V]`` verifier logits after ``ids`` (the prompt followed by an
            output prefix), for a stand-in model; by default one cache-free forward pass laid out by the family's
            mask builder.

    Returns:
        Each possible output (a tuple of ids, EOS included) and its probability; they sum to 1.
    """
    warp = warp or SamplingWarp()
    next_logits = next_logits or _verifier(model)
    eos = set(model.eos_token_ids)
    out: dict[tuple[int, ...], float] = {}

    def expand(prefix: tuple[int, ...], mass: float) -> None:
        if len(prefix) == length or (prefix and prefix[-1] in eos):
            out[prefix] = out.get(prefix, 0.0) + mass
            return
        probs = warp.probs(next_logits([*prompt_ids, *prefix])[None])[0].tolist()
        for token, p in enumerate(probs):
            if p > 0:
                expand((*prefix, token), mass * p)

    expand((), 1.0)
    return out


def _verifier(model: ModelBackend) -> Callable[[list[int]], torch.Tensor]:
    """The verifier's next-token logits after ``ids``: an AR step from an empty cache, in the family's layout."""

    def next_logits(ids: list[int]) -> torch.Tensor:
        return conditional_logits(model, list(enumerate(ids)), len(ids))

    return next_logits


def conditional_logits(model: ModelBackend, context: Sequence[tuple[int, int]], target: int) -> torch.Tensor:
    """The verifier's ``[V]`` logits at position ``target`` given clean ``(position, token)`` pairs.

    One cache-free forward laid out by the family's own mask builder: the pairs are the call's pending tokens
    in the given (generation) order and ``target`` is its only verified rank, exactly as a decoding call
    scores a position. A left-to-right family (Nemotron) needs ``context`` to be positions ``0 .. n-1`` and
    ``target == n``; an any-order family (SetDLM) takes any positions, in any order, and any open ``target``.

    Args:
        model: A loaded model (float64 keeps ties between logits from flipping the argmax).
        context: The clean ``(position, token)`` pairs the target is conditioned on, in generation order.
        target: The position to score.
    """
    builder = get_registry().get("mask_builder", model.family).factory(model)
    plan = CallPlan(pending=tuple(context), order=(target,), chain=(), num_verify=1, drafts=(), width=1)
    call = builder.build(plan)
    with torch.inference_mode():
        logits = model.forward(model.new_cache(call.num_rows), call)
        return builder.read(call, logits).verify_logits[0]


def goodness_of_fit(counts: Mapping[tuple[int, ...], int], exact: Mapping[tuple[int, ...], float]) -> float:
    """The p-value of a chi-square test of sampled outputs against :func:`ar_distribution`'s.

    Outputs expected at least 5 times are cells of their own and the rest are pooled into one cell; an output
    the exact distribution rules out gives 0. Fix the seeds of the samples, so that the test is deterministic,
    and require a small p-value (1e-4 or so): a sampler that is not exact gives far smaller ones.

    Raises:
        ValueError: When fewer than two cells remain (one likely output): the test would say nothing.
        ImportError: Without scipy (``pip install scipy``).
    """
    from scipy import stats

    if set(counts) - set(exact):
        return 0.0
    total = sum(counts.values())
    big = [output for output, p in exact.items() if p * total >= 5]
    observed = [counts.get(output, 0) for output in big]
    expected = [exact[output] * total for output in big]
    rest = total - sum(expected)
    if rest > 1e-9:
        observed.append(total - sum(observed))
        expected.append(rest)
    if len(expected) < 2:
        raise ValueError(
            f"the exact distribution leaves {len(exact)} likely output(s) for {total} samples, so a fit test can "
            "tell nothing; flatten the model (write_random_checkpoint(..., logit_scale=0.3)), relax the warp or "
            "take more samples"
        )
    scale = total / sum(expected)  # rounding: the expected counts must sum to the observed ones
    return float(stats.chisquare(observed, [e * scale for e in expected]).pvalue)
