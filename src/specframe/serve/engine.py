"""The engine: one background thread that owns the model's decoders and steps every active request.

The event loop (the HTTP side) never touches a decoder. It hands the engine a validated
:class:`~specframe.serve.protocol.Job` through :meth:`Engine.submit`, which returns a :class:`Submission`;
the engine sends that submission's events back through the loop's ``call_soon_threadsafe`` into an
``asyncio.Queue``. Between steps the engine admits waiting requests (up to ``max_active``) and retires
finished or cancelled ones: continuous batching.

One step advances every active request by one model call. How is the job of a :class:`Batch`:

* :class:`StepperBatch` keeps one :class:`~specframe.decoder.Stepper` per request and packs the step's
  calls of all active requests into one ``model.forward_many`` (``prepare()``, one forward, ``finish()``).
* Another implementation of the same four methods can be passed as ``Engine(batch=...)``.

Each request decodes with a decoder of its own, checked out of a :class:`DecoderPool` for its options and
returned when it ends: schedules may keep per-request state on themselves (``width: "auto"`` does), so two
requests in flight never share one.
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
from typing import Any, Protocol

from specframe import batching
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


@dataclass
class Progress:
    """What one step did for one request: new token ids, the result once it ended, or the error it raised."""

    key: int
    ids: list[int]
    generation: Generation | None = None
    error: BaseException | None = None


class Batch(Protocol):
    """The requests being decoded, advanced together one step at a time (the engine's batching interface)."""

    def add(self, key: int, decoder: Decoder, job: Job) -> None:
        """Start decoding ``job`` with ``decoder`` (raises ``InputError`` for a request it cannot decode)."""

    def remove(self, key: int) -> None:
        """Drop a request (cancelled), freeing what it holds."""

    def step(self) -> list[Progress]:
        """Advance every request by one model call; a request that ended is removed."""

    def __len__(self) -> int:
        """Requests being decoded."""


class StepperBatch:
    """:class:`Batch` of per-request :class:`~specframe.decoder.Stepper` objects, one forward per step.

    Each step prepares one call of every request, evaluates the calls of requests on the same model in one
    :meth:`~specframe.models.base.ModelBackend.forward_many` (each against its own cache: attention never
    crosses requests), and lets each request finish its call. A request's tokens depend only on its own
    calls, so its output is what decoding it alone gives.

    Args:
        max_rows: The most rows one call of a request that gave a width may have (its prompt call aside): a
            request whose call would have more ends with a 400 before that call (``None``: no limit). Requests
            of width ``"auto"`` are not held to it: their choice already weighs the batch's rows.
    """

    def __init__(self, max_rows: int | None = None) -> None:
        self._requests: dict[int, tuple[Stepper, list[int]]] = {}  # key -> (stepper, [output tokens sent])
        self.max_rows = max_rows
        self._capped: set[int] = set()  # the requests held to max_rows

    def add(self, key: int, decoder: Decoder, job: Job) -> None:
        """Start the request (validation errors are raised here, before any model call)."""
        stepper = decoder.stepper(prompt_ids=job.prompt_ids, max_new_tokens=job.max_tokens, seed=job.seed)
        self._requests[key] = (stepper, [0])
        if self.max_rows is not None and job.options.width != "auto":
            self._capped.add(key)

    def remove(self, key: int) -> None:
        """Drop the request (its cache goes with it)."""
        self._requests.pop(key, None)
        self._capped.discard(key)

    def step(self) -> list[Progress]:
        """One call of every request; a request's failure ends that request only."""
        out: list[Progress] = []
        groups: dict[int, list[tuple[int, Stepper, PhysicalCall]]] = {}
        for key, (stepper, _) in list(self._requests.items()):
            try:
                call = stepper.prepare()
                if key in self._capped and stepper.metrics.nfe and call is not None:
                    self._check_rows(call.num_rows, stepper.decoder.width)
            except Exception as exc:
                out.append(self._failed(key, exc))
                continue
            groups.setdefault(id(stepper.decoder.model), []).append((key, stepper, call))
        for items in groups.values():
            decoder = items[0][1].decoder
            try:
                calls = [(stepper, call) for _, stepper, call in items]
                outputs, seconds, rows = batching.forward(decoder.model, calls, decoder.sync)
            except Exception as exc:  # the shared forward failed: every request in it fails
                out.extend(self._failed(key, exc) for key, _, _ in items)
                continue
            for (key, stepper, _), logits in zip(items, outputs, strict=True):
                try:
                    stepper.finish(logits, seconds, rows)
                except Exception as exc:
                    out.append(self._failed(key, exc))
                    continue
                out.append(self._progress(key))
        return out

    def _progress(self, key: int) -> Progress:
        """The output tokens the request's last call added (the text is the HTTP side's to make)."""
        stepper, sent = self._requests[key]
        if stepper.done:
            self.remove(key)
            generation = stepper.result()
            return Progress(key, generation.output_ids[sent[0] :], generation)
        ids = stepper.state.output_ids()
        new, sent[0] = ids[sent[0] :], len(ids)
        return Progress(key, new)

    def _check_rows(self, rows: int, width: int) -> None:
        """Refuse a call of more than ``max_rows`` rows (raises the 400 that ends its request)."""
        if self.max_rows is not None and rows > self.max_rows:
            raise APIError(
                400,
                f"this request's schedule makes calls of {rows} rows at width {width}, over this server's limit of "
                f"{self.max_rows} rows per call (specframe serve --max-rows); ask for a smaller width, width "
                '"auto", or a schedule with fewer rows per call (packed or linear)',
                param="width",
                code="rows_limit_exceeded",
            )

    def _failed(self, key: int, exc: BaseException) -> Progress:
        self.remove(key)
        return Progress(key, [], error=exc)

    def __len__(self) -> int:
        return len(self._requests)


class DecoderPool:
    """Decoders composed for each option set, reused across requests (bounded).

    A decoder is checked out by one request at a time. Idle decoders are kept for the ``max_sets`` option sets
    used most recently, at most ``max_idle`` per set.

    Args:
        compose: Builds a decoder for an option set (the server's model and settings already applied).
        max_sets: Option sets to keep idle decoders for.
        max_idle: Idle decoders kept per option set.
    """

    def __init__(self, compose: Callable[[DecodeOptions], Decoder], *, max_sets: int = 16, max_idle: int = 8) -> None:
        self._compose = compose
        self._idle: OrderedDict[DecodeOptions, list[Decoder]] = OrderedDict()
        self.max_sets = max_sets
        self.max_idle = max_idle
        self.composed = 0

    def acquire(self, options: DecodeOptions) -> Decoder:
        """An idle decoder for ``options``, or a new one (composition errors propagate)."""
        idle = self._idle.get(options)
        if idle:
            self._idle.move_to_end(options)
            return idle.pop()
        decoder = self._compose(options)
        self.composed += 1
        return decoder

    def release(self, options: DecodeOptions, decoder: Decoder) -> None:
        """Return a decoder whose request ended."""
        idle = self._idle.setdefault(options, [])
        self._idle.move_to_end(options)
        if len(idle) < self.max_idle:
            idle.append(decoder)
        while len(self._idle) > self.max_sets:
            self._idle.popitem(last=False)


@dataclass
class _Active:
    submission: Submission
    decoder: Decoder
    admitted: float
    first_token: float | None = None


class Engine:
    """Owns the decoders; admits, steps and retires requests on a background thread.

    Args:
        compose: Builds a decoder for an option set (see :class:`DecoderPool`).
        max_active: Requests decoded at once (the batch).
        max_queue: Requests that may wait for a slot; one more is refused with 429.
        metrics: Where to record what happens.
        batch: The :class:`Batch` implementation (default :class:`StepperBatch`).
        max_decoder_sets: Option sets whose decoders are kept for reuse.
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
    ) -> None:
        self.pool = DecoderPool(compose, max_sets=max_decoder_sets, max_idle=max_active)
        self.max_active = max_active
        self.max_queue = max_queue
        self.metrics = metrics or ServerMetrics()
        self.metrics.gauges = self.gauges
        self.batch: Batch = batch if batch is not None else StepperBatch()
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
                for submission in admits:
                    self._admit(submission)
                if len(self.batch):
                    self._step()
        except BaseException:  # a bug in the engine itself: say so, and fail every request rather than hang
            log.exception("the specframe engine stopped")
            raise
        finally:
            self._shutdown()

    def _admit(self, submission: Submission) -> None:
        job = submission.job
        key, self._next_key = self._next_key, self._next_key + 1
        now = time.perf_counter()
        self.metrics.observe("specframe_queue_wait_seconds", now - job.arrived)
        try:
            decoder = self.pool.acquire(job.options)
        except SpecframeError as exc:
            self._fail(submission, APIError(400, str(exc), param=_param_of(str(exc)), code="invalid_value"))
            return
        except Exception as exc:
            log.exception("composing a decoder failed")
            self._fail(submission, APIError(500, f"composing the decoder failed: {type(exc).__name__}: {exc}"))
            return
        try:
            self.batch.add(key, decoder, job)
        except SpecframeError as exc:
            self.pool.release(job.options, decoder)
            self._fail(submission, APIError(400, str(exc), code="invalid_value"))
            return
        with self._cond:
            self._active[key] = _Active(submission, decoder, now)
            if submission.cancelled:  # its client went away while it was being admitted (then it was neither
                self._cancelled.add(key)  # waiting nor active): retired before its first step
        info = {"schedule": decoder.schedule.name, "width": decoder.width, "exact": decoder.exact}
        submission.post(Event("started", info=info))

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
            self.pool.release(active.submission.job.options, active.decoder)
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


def _param_of(message: str) -> str | None:
    """The request field a composition error is about, when its message names one."""
    words = message.replace("'", " ").replace(":", " ").split()
    for name in ("schedule", "order", "width", "top_k", "top_p", "temperature", "stop"):
        if name in words:
            return name
    return "temperature" if "acceptance" in words else None
