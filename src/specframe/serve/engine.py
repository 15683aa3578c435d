"""The engine: one background thread that owns the model's decoders and steps every active request.

The event loop (the HTTP side) never touches a decoder. It hands the engine a validated
:class:`~specframe.serve.protocol.Job` through :meth:`Engine.submit`, which returns a :class:`Submission`;
the engine sends that submission's events back through the loop's ``call_soon_threadsafe`` into an
``asyncio.Queue``. Between steps the engine admits waiting requests (up to ``max_active``) and retires
finished or cancelled ones: continuous batching.

One step advances every active request by one model call, through the engine core every path shares: a
:class:`specframe.batching.Batch` packs the step's calls of all active requests into one
``model.forward_many`` and reports each request's new tokens, its result, or the error that ended it alone.

Requests with the same options decode with one decoder (composed once, kept in :class:`Decoders`): each
request plans with its own copy of the decoder's schedule, and what those copies share (width ``auto``'s
learning) follows :class:`specframe.auto.policy.Learning`'s rule, exactly as in ``generate_many`` and bench.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from specframe.batching import Batch
from specframe.decoder import Decoder, Generation, Stepper
from specframe.errors import SpecframeError
from specframe.plan import PhysicalCall
from specframe.serve.metrics import ServerMetrics
from specframe.serve.protocol import APIError, DecodeOptions, Job

log = logging.getLogger("specframe.serve")


@dataclass
class Event:
    """What the engine tells the HTTP side about a request.

    Attributes:
        kind: ``"started"`` (admitted; ``info`` describes the decoder), ``"tokens"`` (``ids`` were generated),
            ``"done"`` (``generation`` is the result) or ``"error"`` (``error`` says why it ended).
    """

    kind: str
    ids: list[int] = field(default_factory=list)
    generation: Generation | None = None
    error: APIError | None = None
    info: dict[str, Any] = field(default_factory=dict)


class Submission:
    """The HTTP side's handle on a submitted job: its events, and a way to cancel it.

    Args:
        job: The job.
        loop: The event loop that awaits the events.
        engine: The engine it was submitted to.
    """

    def __init__(self, job: Job, loop: asyncio.AbstractEventLoop, engine: Engine) -> None:
        self.job = job
        self.loop = loop
        self.events: asyncio.Queue[Event] = asyncio.Queue()
        self.cancelled = False
        self.ended = False  # the engine is done with it (set by the engine thread)
        self._engine = engine

    def post(self, event: Event) -> None:
        """Deliver ``event`` to the event loop (from any thread; dropped if the loop is gone)."""
        with contextlib.suppress(RuntimeError):  # the loop was closed: nobody is waiting
            self.loop.call_soon_threadsafe(self.events.put_nowait, event)

    async def next(self) -> Event:
        """The next event."""
        return await self.events.get()

    def cancel(self) -> None:
        """Stop decoding this job (the client went away); harmless once it has ended."""
        if not self.cancelled and not self.ended:
            self.cancelled = True
            self._engine.cancel(self)


class Decoders:
    """One decoder per option set, composed at first use and kept for the ``max_sets`` used most recently.

    Every request with those options decodes with it at once (each with its own schedule copy).

    Args:
        compose: Builds a decoder for an option set (the server's model and settings already applied).
        max_sets: Option sets whose decoders are kept.
    """

    def __init__(self, compose: Callable[[DecodeOptions], Decoder], *, max_sets: int = 16) -> None:
        self._compose = compose
        self._kept: OrderedDict[DecodeOptions, Decoder] = OrderedDict()
        self.max_sets = max_sets
        #: Decoders composed so far.
        self.composed = 0

    def get(self, options: DecodeOptions) -> Decoder:
        """The decoder for ``options`` (composition errors propagate)."""
        decoder = self._kept.get(options)
        if decoder is None:
            decoder = self._compose(options)
            self.composed += 1
        self.put(options, decoder)
        return decoder

    def put(self, options: DecodeOptions, decoder: Decoder) -> None:
        """Keep ``decoder`` for ``options`` (one composed elsewhere, such as the server's first)."""
        self._kept[options] = decoder
        self._kept.move_to_end(options)
        while len(self._kept) > self.max_sets:
            self._kept.popitem(last=False)


@dataclass
class _Active:
    submission: Submission
    decoder: Decoder
    admitted: float
    first_token: float | None = None


class Engine:
    """Owns the decoders; admits, steps and retires requests on a background thread.

    Args:
        compose: Builds a decoder for an option set (see :class:`Decoders`).
        max_active: Requests decoded at once (the batch).
        max_queue: Requests that may wait for a slot; one more is refused with 429.
        metrics: Where to record what happens.
        batch: The batch to step (a :class:`specframe.batching.Batch`, or a subclass of it; a new one by default).
        max_decoder_sets: Option sets whose decoders are kept for reuse.
        max_rows: The most rows one call of a request that gave a width may have (its prompt call aside): a
            request whose call would have more ends with a 400 before that call (``None``: no limit). Requests
            of width ``"auto"`` are not held to it: their choice already weighs the batch's rows.
    """

    def __init__(
        self,
        compose: Callable[[DecodeOptions], Decoder],
        *,
        max_active: int = 16,
        max_queue: int = 64,
        metrics: ServerMetrics | None = None,
        batch: Batch | None = None,
        max_decoder_sets: int = 16,
        max_rows: int | None = None,
    ) -> None:
        self.decoders = Decoders(compose, max_sets=max_decoder_sets)
        self.max_active = max_active
        self.max_queue = max_queue
        self.metrics = metrics or ServerMetrics()
        self.metrics.gauges = self.gauges
        self.batch = batch if batch is not None else Batch()
        self.max_rows = max_rows
        self._cond = threading.Condition()
        self._waiting: deque[Submission] = deque()
        self._active: dict[int, _Active] = {}
        self._cancelled: set[int] = set()
        self._held = 0
        self._admitting = True
        self._closing = False
        self._thread: threading.Thread | None = None
        self._next_key = 0
        self.steps = 0
        #: Cancellations asked for so far (clients that went away), counted when asked, before they take effect.
        self.cancels_requested = 0

    # -- the HTTP side ------------------------------------------------------------------------------------
    def start(self) -> None:
        """Start the engine thread (once; later calls do nothing)."""
        with self._cond:
            if self._thread is not None or self._closing:
                return
            self._thread = threading.Thread(target=self._run, name="specframe-engine", daemon=True)
            self._thread.start()

    def submit(self, job: Job, loop: asyncio.AbstractEventLoop) -> Submission:
        """Queue ``job``; its events arrive on the returned submission.

        Raises:
            APIError: 429 when the queue is full, 503 while shutting down.
        """
        submission = Submission(job, loop, self)
        self.start()  # where the host ran no lifespan (the app's lifespan starts it otherwise)
        with self._cond:
            if not self._admitting or self._closing:
                raise APIError(503, "the server is shutting down; retry on another replica", code="shutting_down")
            if len(self._waiting) >= self.max_queue:
                raise APIError(
                    429,
                    f"the server is busy: {len(self._active)} requests are being decoded and {len(self._waiting)} "
                    "are waiting (the queue's limit, specframe serve --max-queue); retry later",
                    code="rate_limit_exceeded",
                )
            self._waiting.append(submission)
            self._cond.notify_all()
        return submission

    def cancel(self, submission: Submission) -> None:
        """Drop a waiting or active request (its client went away)."""
        with self._cond:
            self.cancels_requested += 1
            if submission in self._waiting:
                self._waiting.remove(submission)
                submission.ended = True
                self.metrics.finished("cancelled")
                return
            key = next((k for k, a in self._active.items() if a.submission is submission), None)
            if key is not None:
                self._cancelled.add(key)
                self._cond.notify_all()

    def stop_admitting(self) -> None:
        """Refuse new requests (503) from now on; queued and active ones still finish."""
        with self._cond:
            self._admitting = False

    def close(self, timeout: float | None = None) -> None:
        """Stop: end every waiting and active request with a 503 error and join the thread."""
        with self._cond:
            self._admitting = False
            self._closing = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)

    @contextlib.contextmanager
    def hold(self) -> Iterator[None]:
        """Pause admissions and steps while inside (maintenance, and tests that need a request to stay put)."""
        with self._cond:
            self._held += 1
        try:
            yield
        finally:
            with self._cond:
                self._held -= 1
                self._cond.notify_all()

    @property
    def queue_length(self) -> int:
        """Requests waiting for a slot."""
        return len(self._waiting)

    @property
    def active_count(self) -> int:
        """Requests being decoded."""
        return len(self._active)

    @property
    def alive(self) -> bool:
        """Whether the engine thread is running."""
        return self._thread is not None and self._thread.is_alive()

    def gauges(self) -> dict[str, float]:
        """The current queue length and active requests (for /metrics)."""
        return {"specframe_queue_length": self.queue_length, "specframe_active_requests": self.active_count}

    # -- the engine thread --------------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while True:
                with self._cond:
                    while not self._closing and (self._held or (not self._waiting and not self._active)):
                        self._cond.wait()
                    if self._closing:
                        break
                    admits = []
                    while self._waiting and len(self._active) + len(admits) < self.max_active:
                        admits.append(self._waiting.popleft())
                    cancelled, self._cancelled = self._cancelled, set()
                for key in cancelled:
                    self._retire(key, "cancelled")
                for index, submission in enumerate(admits):
                    if not self._admit(submission):  # its KV blocks are not free yet: it and those after it wait
                        with self._cond:
                            self._waiting.extendleft(reversed(admits[index:]))
                        break
                if len(self.batch):
                    self._step()
        except BaseException:  # a bug in the engine itself: say so, and fail every request rather than hang
            log.exception("the specframe engine stopped")
            raise
        finally:
            self._shutdown()

    def _admit(self, submission: Submission) -> bool:
        """Start decoding a waiting request (or end it with its error); False when its KV blocks are not free yet."""
        job = submission.job
        try:
            decoder = self.decoders.get(job.options)
        except SpecframeError as exc:
            self._fail(submission, APIError(400, str(exc), param=_param_of(str(exc)), code="invalid_value"))
            return True
        except Exception as exc:
            log.exception("composing a decoder failed")
            self._fail(submission, APIError(500, f"composing the decoder failed: {type(exc).__name__}: {exc}"))
            return True
        try:
            stepper = decoder.stepper(prompt_ids=job.prompt_ids, max_new_tokens=job.max_tokens, seed=job.seed)
        except SpecframeError as exc:
            self._fail(submission, APIError(400, str(exc), code="invalid_value"))
            return True
        if len(self.batch) and not self.batch.fits(stepper):
            return False
        key, self._next_key = self._next_key, self._next_key + 1
        now = time.perf_counter()
        self.metrics.observe("specframe_queue_wait_seconds", now - job.arrived)
        capped = self.max_rows is not None and job.options.width != "auto"
        try:
            self.batch.add(key, stepper, check=_rows_limit(self.max_rows, stepper, decoder.width) if capped else None)
        except SpecframeError as exc:  # a request no KV block pool of this server could hold
            self._fail(submission, APIError(400, f"{exc} (specframe serve --kv-blocks)", code="invalid_value"))
            return True
        with self._cond:
            self._active[key] = _Active(submission, decoder, now)
            if submission.cancelled:  # its client went away while it was being admitted (then it was neither
                self._cancelled.add(key)  # waiting nor active): retired before its first step
        info = {"schedule": decoder.schedule.name, "width": decoder.width, "exact": decoder.exact}
        submission.post(Event("started", info=info))
        return True

    def _fail(self, submission: Submission, error: APIError) -> None:
        submission.ended = True
        self.metrics.failed(error.status)
        submission.post(Event("error", error=error))

    def _step(self) -> None:
        progress = self.batch.step()
        self.steps += 1
        now = time.perf_counter()
        for item in progress:
            active = self._active.get(item.key)
            if active is None:
                continue
            submission = active.submission
            if item.error is not None:
                error = item.error
                if isinstance(error, APIError):  # the batch's own refusal (a limit of the server)
                    api = error
                elif isinstance(error, SpecframeError):
                    api = APIError(400, str(error), code="invalid_value")
                else:
                    log.error("decoding a request failed", exc_info=error)
                    api = APIError(500, f"decoding failed: {type(error).__name__}: {error}")
                self._end(item.key)
                self.metrics.failed(api.status)
                submission.post(Event("error", error=api))
                continue
            if item.ids:
                if active.first_token is None:
                    active.first_token = now
                    self.metrics.observe("specframe_time_to_first_token_seconds", now - submission.job.arrived)
                if submission.job.stream:  # a whole response needs only the result
                    submission.post(Event("tokens", ids=item.ids))
            if item.generation is not None:
                self._end(item.key)
                generation = item.generation
                reason = "length" if generation.stop_reason == "length" else "stop"
                self.metrics.finished(reason, generation, len(submission.job.prompt_ids))
                self.metrics.observe("specframe_request_latency_seconds", now - submission.job.arrived)
                submission.post(Event("done", generation=generation))

    def _end(self, key: int) -> _Active | None:
        with self._cond:
            active = self._active.pop(key, None)
            self._cancelled.discard(key)
        if active is not None:
            active.submission.ended = True
        return active

    def _retire(self, key: int, reason: str) -> None:
        self.batch.remove(key)
        if self._end(key) is not None:
            self.metrics.finished(reason)

    def _shutdown(self) -> None:
        """End every request still here with a 503 (the server is stopping)."""
        error = APIError(503, "the server shut down before this request finished", code="shutting_down")
        with self._cond:
            waiting, self._waiting = list(self._waiting), deque()
            self._admitting = False
        for submission in waiting:
            self._fail(submission, error)
        for key in list(self._active):
            active = self._active[key]
            self.batch.remove(key)
            self._end(key)
            self.metrics.finished("cancelled")
            active.submission.post(Event("error", error=error))


def _rows_limit(max_rows: int, stepper: Stepper, width: int) -> Callable[[PhysicalCall], None]:
    """The check of each call of a request held to ``max_rows`` rows (its prompt call aside)."""

    def check(call: PhysicalCall) -> None:
        if stepper.metrics.nfe and isinstance(call, PhysicalCall) and call.num_rows > max_rows:  # not a prompt's
            raise APIError(
                400,
                f"this request's schedule makes calls of {call.num_rows} rows at width {width}, over this server's "
                f"limit of {max_rows} rows per call (specframe serve --max-rows); ask for a smaller width, width "
                '"auto", or a schedule with fewer rows per call (packed or linear)',
                param="width",
                code="rows_limit_exceeded",
            )

    return check


def _param_of(message: str) -> str | None:
    """The request field a composition error is about, when its message names one."""
    words = message.replace("'", " ").replace(":", " ").split()
    for name in ("schedule", "order", "width", "top_k", "top_p", "temperature", "stop"):
        if name in words:
            return name
    return "temperature" if "acceptance" in words else None
