"""Continuous batching: many requests' calls packed into one model forward per step.

Each step, every active request's :class:`~specframe.decoder.Stepper` prepares its next call; the calls run
in one :meth:`~specframe.models.base.ModelBackend.forward_many` (each against its own request's cache, so
attention never crosses requests); each request then finishes its call. Finished requests leave between
steps and waiting ones join, up to ``max_batch`` in flight. A request's tokens depend only on its own calls,
so its output is what it gets decoded alone.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Protocol

import torch

if TYPE_CHECKING:
    from specframe.models.base import ModelBackend
    from specframe.models.cache import KVCache
    from specframe.plan import PhysicalCall


class Stepper(Protocol):
    """One request decoded a call at a time (:class:`specframe.decoder.Stepper` is the implementation)."""

    cache: KVCache | None

    @property
    def done(self) -> bool:
        """Whether the request is complete."""

    def prepare(self) -> PhysicalCall | None:
        """The request's next call (``None`` once it is done)."""

    def finish(self, logits: torch.Tensor, seconds: float, batch_rows: int | None = None) -> None:
        """Apply the logits of the prepared call."""


def forward(
    model: ModelBackend, calls: Sequence[tuple[Stepper, PhysicalCall]], sync: Callable[[], None]
) -> tuple[list[torch.Tensor], float, int | None]:
    """One forward over prepared calls: the decoder's one way of calling a model.

    One call runs the model's plain ``forward``; several run its ``forward_many`` (one pass where the backend
    batches, one forward per item otherwise).

    Returns:
        The logits of each call, the forward's wall seconds, and its total rows (``None`` for a call alone),
        as each stepper's ``finish`` takes them.
    """
    started = time.perf_counter()
    if len(calls) == 1:
        stepper, call = calls[0]
        outputs = [model.forward(stepper.cache, call)]
    else:
        outputs = model.forward_many([(stepper.cache, call) for stepper, call in calls])
    sync()
    rows = sum(call.num_rows for _, call in calls) if len(calls) > 1 else None
    return outputs, time.perf_counter() - started, rows


def run(
    model: ModelBackend, steppers: Sequence[Stepper], max_batch: int, sync: Callable[[], None]
) -> Iterator[tuple[int, Stepper]]:
    """Decode ``steppers`` with up to ``max_batch`` in flight, admitting them in order.

    Yields ``(index, stepper)`` after each of a request's calls (``stepper.done`` after its last). One
    stepper with ``max_batch=1`` is plain one-request decoding.

    Args:
        model: The model every request runs on.
        steppers: The requests, not started.
        max_batch: Most requests per forward.
        sync: Waits for the device (so a forward's time is its own).
    """
    waiting, active = deque(range(len(steppers))), []
    while waiting or active:
        while waiting and len(active) < max_batch:
            active.append(waiting.popleft())
        calls = [(index, steppers[index].prepare()) for index in active]
        outputs, seconds, rows = forward(model, [(steppers[index], call) for index, call in calls], sync)
        for (index, _), logits in zip(calls, outputs, strict=True):
            steppers[index].finish(logits, seconds, rows)
            yield index, steppers[index]
        active = [index for index in active if not steppers[index].done]
