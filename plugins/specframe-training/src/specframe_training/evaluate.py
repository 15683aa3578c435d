"""Evaluating a loaded model (any :class:`~specframe.models.ModelBackend` of either family) on held-out code.

* :func:`heldout_windows`: held-out token windows, tokenized with the model's own tokenizer;
* :func:`heldout_perplexity`: AR perplexity through the inference forward (the loaded backend, its KV cache
  and the family's AR layout: causal next-token rows for Nemotron, left-to-right verifier masks for SetDLM);
* :func:`heldout_prompts`: prompts cut from held-out files, each ending just after a ``def`` line;
* :func:`acceptance`: greedy speculative decoding of those prompts, with pooled acceptance statistics.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from specframe.metrics import Metrics
from specframe.models import nemotron
from specframe.models.base import ModelBackend, ModelCall
from specframe_training.corpus import SourceFile, corpus_files, split_files, spread_windows

_DEF_LINE = re.compile(r"^[ \t]*(async[ \t]+)?def [^\n]*:(?=[ \t]*\n)", re.MULTILINE)


@functools.lru_cache(maxsize=1)
def heldout_sources() -> tuple[SourceFile, ...]:
    """The held-out corpus files present on this machine (read once per process)."""
    return tuple(split_files(corpus_files())[1])


def _document_ids(model: ModelBackend, text: str) -> list[int]:
    """``text`` as the training saw a document: ``[bos?] + tokens + [end]``."""
    if model.tokenizer is None:
        raise ValueError(f"model {model.name!r} has no tokenizer")
    ids = model.tokenizer.encode(text)
    if model.family == nemotron.FAMILY:
        return [model.bos_token_id or nemotron.SPECIAL_IDS["bos_token_id"], *ids, model.eos_token_ids[0]]
    pad = getattr(model, "pad_token_id", None)
    return [*ids, pad if pad is not None else model.eos_token_ids[-1]]


def heldout_windows(
    model: ModelBackend, length: int, count: int | None = None, sources: Sequence[SourceFile] | None = None
) -> torch.Tensor:
    """``[N, length]`` non-overlapping windows of the concatenated held-out documents.

    Args:
        model: The model whose tokenizer encodes the text.
        length: Tokens per window.
        count: Take this many windows spread evenly over the held-out text (default: all).
        sources: Held-out files (default: :func:`heldout_sources`).
    """
    sources = heldout_sources() if sources is None else sources
    stream = [t for source in sources for t in _document_ids(model, source.text)]
    return spread_windows(torch.tensor(stream, dtype=torch.long), length, count)


@torch.no_grad()
def window_loss(model: ModelBackend, window: torch.Tensor) -> tuple[float, int]:
    """Summed next-token cross-entropy (nats) of one window through the inference forward, and its count.

    Nemotron: one causal call, row ``i`` predicts token ``i + 1``. SetDLM: clean rows causal, plus a mask row
    at every position ``i >= 1`` that sees the clean rows before ``i`` (its left-to-right verifier query).
    """
    device = model.device
    window = window.to(device)
    length = window.numel()
    positions = torch.arange(length, device=device)
    causal = torch.ones(length, length, dtype=torch.bool, device=device).tril()
    cache = model.new_cache(2 * length)
    if model.family == nemotron.FAMILY:
        logits = model.forward(cache, ModelCall(window, positions, causal))[:-1]
    else:
        queries = length - 1
        ids = torch.cat([window, torch.full((queries,), model.mask_token_id, device=device)])
        rows = torch.zeros(length + queries, length + queries, dtype=torch.bool, device=device)
        rows[:length, :length] = causal
        rows[length:, :length] = torch.ones(queries, length, dtype=torch.bool, device=device).tril()
        rows[length:, length:] = torch.eye(queries, dtype=torch.bool, device=device)
        mask_positions = positions[1:]
        logits = model.forward(cache, ModelCall(ids, torch.cat([positions, mask_positions]), rows))[length:]
    loss = torch.nn.functional.cross_entropy(logits.double(), window[1:], reduction="sum")
    return float(loss), length - 1


def heldout_perplexity(model: ModelBackend, windows: torch.Tensor) -> float:
    """AR perplexity of ``model`` over ``[N, T]`` held-out windows (see :func:`window_loss`)."""
    total, count = 0.0, 0
    for window in windows:
        loss, n = window_loss(model, window)
        total, count = total + loss, count + n
    return math.exp(total / count)


@dataclass(frozen=True)
class Prompt:
    """A held-out prompt.

    Attributes:
        source: File it was cut from (relative to the standard library).
        text: Prompt text: the lines before a function definition and the ``def`` line itself, up to its colon
            (no newline: the tokenizer merges a newline with the indentation after it).
    """

    source: str
    text: str


def heldout_prompts(
    count: int, *, context_chars: int = 400, sources: Sequence[SourceFile] | None = None
) -> list[Prompt]:
    """``count`` prompts ending with the colon of a ``def ...:`` line of a held-out file, spread over the files.

    Each prompt holds the ``def`` line and whole lines before it, up to ``context_chars`` characters. Files are
    visited in turn, starting from the middle definition of each, so that no file dominates.
    """
    sources = heldout_sources() if sources is None else sources
    per_file = []
    for source in sources:
        ends = [m.end() for m in _DEF_LINE.finditer(source.text) if m.start() > 0]
        prompts = []
        for end in ends:
            start = source.text.rfind("\n", 0, max(end - context_chars, 0)) + 1 if end > context_chars else 0
            prompts.append(Prompt(source.relative, source.text[start:end]))
        if prompts:
            per_file.append(prompts)
    chosen: list[Prompt] = []
    for depth in range(max((len(p) for p in per_file), default=0)):
        for prompts in per_file:
            if depth < len(prompts) and len(chosen) < count:
                # the k-th pass over the files takes each file's definition k places after its middle one
                chosen.append(prompts[(len(prompts) // 2 + depth) % len(prompts)])
    return chosen


@dataclass
class Acceptance:
    """Pooled greedy-decoding statistics of one schedule and width over a set of prompts.

    Attributes:
        schedule: Schedule name.
        width: Speculative width W.
        prompts: Number of prompts.
        metrics: The prompts' metrics, pooled with :meth:`Metrics.merge`.
    """

    schedule: str
    width: int
    prompts: int = 0
    metrics: Metrics = field(default_factory=Metrics)

    def to_dict(self) -> dict[str, float | int | str]:
        """JSON-friendly statistics (``tokens_per_verification`` and ``mean_acceptance_length`` are pooled)."""
        return {
            "schedule": self.schedule,
            "width": self.width,
            "prompts": self.prompts,
            "generated": self.metrics.generated_tokens,
            "nfe": self.metrics.nfe,
            "tokens_per_nfe": self.metrics.tokens_per_nfe,
            "tokens_per_verification": self.metrics.tokens_per_verification,
            "mean_acceptance_length": self.metrics.mean_acceptance_length,
        }


def acceptance(
    model: ModelBackend, schedule: str, width: int, prompts: Sequence[Prompt], max_new_tokens: int
) -> Acceptance:
    """Decode every prompt greedily with ``schedule`` at ``width`` and pool the statistics."""
    from specframe import compose

    decoder = compose({"model": model, "schedule": schedule, "width": width, "max_new_tokens": max_new_tokens})
    pooled = Metrics.merge(decoder.generate(prompt.text).metrics for prompt in prompts)
    return Acceptance(schedule, width, len(prompts), pooled)
