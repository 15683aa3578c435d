"""The engine core: one :class:`Batch` of requests, stepped one model forward at a time, for every path.

:meth:`Decoder.generate <specframe.decoder.Decoder.generate>`, ``stream``, ``generate_many``, ``stream_many``
(which bench's closed loop consumes) and the server's engine all decode through a :class:`Batch`: requests
join (:meth:`Batch.add`) and leave (:meth:`Batch.remove`) between steps, and each :meth:`Batch.step` lets
every request's :class:`~specframe.decoder.Stepper` prepare its next call, evaluates the calls of requests
on the same model in one :meth:`~specframe.models.base.ModelBackend.forward_many` (each against its own
request's cache, so attention never crosses requests), and lets each request finish its call. A request's
tokens depend only on its own calls, so its output is what it gets decoded alone. A request that fails
ends alone; the others go on. Each step reports, per request, the output tokens it added since the last
report (:class:`Progress`): the one progress tracker of every path.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Hashable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import torch

if TYPE_CHECKING:
    from specframe.models.base import ModelBackend
    from specframe.models.cache import KVCache
    from specframe.models.paged import BlockPool
    from specframe.plan import PhysicalCall


class Result(Protocol):
    """A request's result (:class:`specframe.decoder.Generation` is the implementation)."""

    output_ids: list[int]


class Stepper(Protocol):
    """One request decoded a call at a time (:class:`specframe.decoder.Stepper` is the implementation)."""

    cache: KVCache | None
    #: The model its calls run on.
    model: ModelBackend
    #: Makes its cache (of ``capacity`` rows) at its first call; a batch with a block pool replaces it.
    new_cache: Callable[[int], KVCache]
    #: Most prompt tokens per call (chunked prefill), ``None`` for whole prompts; a batch may set it.
    prefill_chunk: int | None

    @property
    def capacity(self) -> int:
        """KV cache rows the request needs."""

    @property
    def done(self) -> bool:
        """Whether the request is complete."""

    def prepare(self) -> PhysicalCall | None:
        """The request's next call (``None`` once it is done)."""

    def finish(self, logits: torch.Tensor, seconds: float, batch_rows: int | None = None) -> None:
        """Apply the logits of the prepared call."""

    def output_ids(self) -> list[int]:
        """The output token ids accepted so far, in textual order."""

    def result(self) -> Result:
        """The request's result (its whole result once it is done)."""

    def sync(self) -> None:
        """Wait for the model's device to finish queued work (so that a forward's time is its own)."""


@dataclass
class Progress:
    """What one step did for one request.

    Attributes:
        key: The request's key (as given to :meth:`Batch.add`).
        ids: Output token ids added since the request's previous progress, in textual order.
        generation: The whole result (the stepper's :class:`~specframe.decoder.Generation`), once the request is
            done (``None`` before).
        error: What the request raised, which ended it (``None`` when it did not fail).
    """

    key: Hashable
    ids: list[int] = field(default_factory=list)
    generation: Result | None = None
    error: BaseException | None = None

    @property
    def ended(self) -> bool:
        """Whether the request left the batch (done or failed)."""
        return self.generation is not None or self.error is not None


class Batch:
    """The requests being decoded together, advanced one model forward per :meth:`step`.

    Args:
        pool: A :class:`~specframe.models.paged.BlockPool` the requests' KV caches are paged from (their blocks
            taken when a request's first call runs, given back when it leaves); ``None``: each request has a
            contiguous cache of its own. With a pool, admit a request only when :meth:`fits` says so.
        prefill_chunk: Most prompt tokens one of a request's calls evaluates: a longer prompt is cached in
            chunks first (chunked prefill), so that one long prompt does not stall every request's step; the
            chunks' keys and values are bitwise one call's with specframe's kernels. ``None``: whole prompts.
    """

    def __init__(self, pool: BlockPool | None = None, *, prefill_chunk: int | None = None) -> None:
        if prefill_chunk is not None and (isinstance(prefill_chunk, bool) or not isinstance(prefill_chunk, int)
                                          or prefill_chunk < 1):  # fmt: skip
            raise ValueError(f"prefill_chunk must be an integer >= 1 or None, got {prefill_chunk!r}")
        self.pool, self.prefill_chunk = pool, prefill_chunk
        self._requests: dict[Hashable, tuple[Stepper, list[int]]] = {}  # key -> (stepper, [output tokens reported])
        self._checks: dict[Hashable, Callable[[PhysicalCall], None]] = {}

    def add(self, key: Hashable, stepper: Stepper, *, check: Callable[[PhysicalCall], None] | None = None) -> None:
        """Start decoding ``stepper``'s request under ``key`` (unique among the requests in the batch).

        Args:
            key: The request's key.
            stepper: The request.
            check: Called with each call the request prepares, before it runs; what it raises ends the request
                alone (a server's per-request limits).

        Raises:
            ValueError: If a request with that key is in the batch.
        """
        if key in self._requests:
            raise ValueError(f"request {key!r} is already in the batch")
        if self.pool is not None:
            pending = self._pending_blocks()
            self.pool.require(stepper.capacity, taken=pending)  # raises what is wrong: never fits, or not now
            stepper.new_cache = self.pool.new_cache
        if self.prefill_chunk is not None:
            stepper.prefill_chunk = self.prefill_chunk
        self._requests[key] = (stepper, [0])
        if check is not None:
            self._checks[key] = check

    def fits(self, stepper: Stepper) -> bool:
        """Whether ``stepper``'s request can join now: its KV blocks are free (always, without a pool).

        The blocks of the requests already in the batch that have not made their first call yet count as taken.
        """
        if self.pool is None:
            return True
        return self.pool.blocks_for(stepper.capacity) + self._pending_blocks() <= self.pool.free_blocks

    def _pending_blocks(self) -> int:
        """Blocks the requests in the batch that have not made their first call yet will take."""
        pool = self.pool
        return sum(pool.blocks_for(s.capacity) for s, _ in self._requests.values() if s.cache is None)

    def remove(self, key: Hashable) -> None:
        """Drop a request (cancelled; its cache goes with it). Unknown keys are ignored: it may have ended."""
        request = self._requests.pop(key, None)
        self._checks.pop(key, None)
        cache = None if request is None else request[0].cache
        if self.pool is not None and cache is not None and cache.paged:
            self.pool.release(cache)  # its blocks go back to the free list

    def __len__(self) -> int:
        return len(self._requests)

    def __contains__(self, key: object) -> bool:
        return key in self._requests

    def step(self) -> list[Progress]:
        """One call of every request; a request that ended (done or failed) leaves the batch.

        Returns:
            One :class:`Progress` per request in the batch, in the order they were added.
        """
        requests, out = list(self._requests.items()), {}
        groups: dict[int, list[tuple[Hashable, Stepper, PhysicalCall]]] = {}
        for key, (stepper, _) in requests:
            try:
                call = stepper.prepare()
                if call is not None and key in self._checks:
                    self._checks[key](call)
            except Exception as exc:
                out[key] = self._failed(key, exc)
                continue
            if call is None:  # done before its first call here (nothing left to decode)
                out[key] = self._progress(key)
                continue
            groups.setdefault(id(stepper.model), []).append((key, stepper, call))
        for items in groups.values():
            first = items[0][1]
            try:
                outputs, seconds, rows = forward(first.model, [(s, call) for _, s, call in items], first.sync)
            except Exception as exc:  # the shared forward failed: every request in it fails
                out.update((key, self._failed(key, exc)) for key, _, _ in items)
                continue
            for (key, stepper, _), logits in zip(items, outputs, strict=True):
                try:
                    stepper.finish(logits, seconds, rows)
                except Exception as exc:
                    out[key] = self._failed(key, exc)
                    continue
                out[key] = self._progress(key)
        return [out[key] for key, _ in requests]

    def _progress(self, key: Hashable) -> Progress:
        stepper, reported = self._requests[key]
        if stepper.done:
            self.remove(key)
            generation = stepper.result()
            return Progress(key, generation.output_ids[reported[0] :], generation)
        ids = stepper.output_ids()
        new, reported[0] = ids[reported[0] :], len(ids)
        return Progress(key, new)

    def _failed(self, key: Hashable, exc: BaseException) -> Progress:
        self.remove(key)
        return Progress(key, error=exc)


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


def run(steppers: Sequence[Stepper], max_batch: int, pool: BlockPool | None = None) -> Iterator[Progress]:
    """Decode ``steppers`` through one :class:`Batch`, up to ``max_batch`` in flight, admitted in order.

    Yields each request's :class:`Progress` after each of its calls (keys are indices into ``steppers``).
    One stepper with ``max_batch=1`` is plain one-request decoding. With a block ``pool``, a request also
    waits until its KV blocks are free.

    Raises:
        Exception: The first error a request raised (the library's calls fail as a whole; a server isolates
            failures by stepping a :class:`Batch` itself).
    """
    batch, waiting = Batch(pool), deque(range(len(steppers)))
    while waiting or len(batch):
        while waiting and len(batch) < max_batch and (not len(batch) or batch.fits(steppers[waiting[0]])):
            index = waiting.popleft()
            batch.add(index, steppers[index])  # alone in the batch, a request that can never fit says why
        for progress in batch.step():
            if progress.error is not None:
                raise progress.error
            yield progress
