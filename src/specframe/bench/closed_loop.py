"""A closed-loop run: N requests in flight, a finished request's slot refilled at once, timed as a user sees it.

The requests are decoded by ``decoder.stream_many(prompts, seeds=..., max_batch=N)``; this module only
consumes its pieces and times them with a monotonic clock, in the consumer (so the times include whatever
the batched decoder does between pieces, the other requests' work included). Per request:

* **admission**: when the request got a slot. The first ``N`` requests are admitted when the run starts;
  request ``N + j`` when the ``j``-th request (counting from 0, in order of finishing) delivered its last
  piece: the decoder refills a freed slot at once with the next request in input order.
* **time to first token** (``ttft_s``): from admission to the first piece that carries tokens (the prompt's
  call included).
* **inter-token latency** (``itl_s``): for each later piece with tokens, the time since the previous such
  piece divided by the piece's tokens, once per token (a piece of 3 tokens after 30 ms gives 10, 10, 10 ms).
  The first piece's tokens have none.
* **latency** (``latency_s``): from admission to the request's last piece.

The run's ``wall_s`` runs from just before ``stream_many`` is called to the last piece of the last request;
total throughput is all output tokens over it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from specframe.decoder import Generation, StreamPiece
from specframe.errors import SpecframeError

#: ``stream_many(prompts, *, seeds, max_batch) -> Iterator[(index, piece)]`` (contract item 7).
StreamMany = Callable[..., Iterator[tuple[int, StreamPiece]]]


@dataclass
class RequestTiming:
    """What the consumer saw of one request.

    Attributes:
        admitted: Clock reading when the request got its slot.
        first: Clock reading of its first piece with tokens (``None`` before it).
        last: Clock reading of its latest piece with tokens.
        finished: Clock reading of its last piece (``None`` before it).
        itl_s: Inter-token latencies, one per token after the first piece's.
    """

    admitted: float
    first: float | None = None
    last: float | None = None
    finished: float | None = None
    itl_s: list[float] = field(default_factory=list)

    @property
    def ttft_s(self) -> float | None:
        """Time to first token (``None`` when no piece carried tokens)."""
        return None if self.first is None else self.first - self.admitted

    @property
    def latency_s(self) -> float | None:
        """Admission to last piece."""
        return None if self.finished is None else self.finished - self.admitted


@dataclass
class LoopResult:
    """A finished closed-loop run.

    Attributes:
        generations: Each request's result, in input order.
        timings: Each request's timing, in input order.
        wall_s: Start of the run to the last piece of the last request.
        concurrency: Requests in flight at once.
    """

    generations: list[Generation]
    timings: list[RequestTiming]
    wall_s: float
    concurrency: int

    @property
    def output_tokens(self) -> int:
        """Generated tokens of all requests."""
        return sum(len(g.output_ids) for g in self.generations)


def run_closed_loop(
    stream_many: StreamMany,
    prompts: Sequence[str | Sequence[int]],
    seeds: Sequence[int | None],
    concurrency: int,
    *,
    clock: Callable[[], float] = time.perf_counter,
) -> LoopResult:
    """Decode ``prompts`` with ``concurrency`` requests in flight and time each as its user would see it.

    Args:
        stream_many: The decoder's ``stream_many``.
        prompts: The requests' prompts.
        seeds: One seed per prompt.
        concurrency: Requests in flight at once (``max_batch``).
        clock: Monotonic clock in seconds (a test can pass a fake one).

    Raises:
        SpecframeError: If the decoder ended without a request's last piece.
    """
    n = len(prompts)
    start = clock()
    timings: list[RequestTiming | None] = [RequestTiming(start) for _ in range(min(concurrency, n))]
    timings += [None] * (n - len(timings))
    generations: list[Generation | None] = [None] * n
    admitted, finished_at = len(timings) - timings.count(None), start
    for index, piece in stream_many(list(prompts), seeds=list(seeds), max_batch=concurrency):
        now = clock()
        timing = timings[index]
        if timing is None:  # a decoder that admitted it before this model expects: count from the last refill
            timing = timings[index] = RequestTiming(finished_at)
        if piece.token_ids:
            if timing.first is None:
                timing.first = now
            else:
                gap = (now - timing.last) / len(piece.token_ids)  # type: ignore[operator]
                timing.itl_s.extend([gap] * len(piece.token_ids))
            timing.last = now
        if piece.generation is not None:
            timing.finished, generations[index], finished_at = now, piece.generation, now
            while admitted < n and timings[admitted] is not None:  # already started (see above)
                admitted += 1
            if admitted < n:
                timings[admitted] = RequestTiming(now)
                admitted += 1
    wall = clock() - start
    missing = [i for i, g in enumerate(generations) if g is None]
    if missing:
        raise SpecframeError(
            f"the decoder's stream_many ended without finishing request(s) {missing[:5]} of {n}; this is a bug in "
            "the decoder, please report it"
        )
    return LoopResult(generations, timings, wall, concurrency)  # type: ignore[arg-type]
