"""The HTTP routes: an OpenAI-compatible API on Starlette, in front of the :class:`~specframe.serve.engine.Engine`.

Routes: ``GET /health``, ``GET /metrics``, ``GET /v1/models`` (and ``/v1/models/{id}``), ``POST
/v1/completions`` and ``POST /v1/chat/completions`` (server-sent events with ``"stream": true``). Every error
is OpenAI's JSON (``{"error": {"message", "type", "param", "code"}}``); a request the client sent wrong is
a 4xx, never a 500.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hmac
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import anyio
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from specframe.errors import SpecframeError
from specframe.models.base import ModelBackend
from specframe.serve import protocol
from specframe.serve.engine import Engine, Event, Submission
from specframe.serve.protocol import APIError, Defaults, Job, Limits

log = logging.getLogger("specframe.serve")

#: The status of a request whose client went away before its response (nginx's convention; never sent).
CLIENT_GONE = 499
#: Seconds a client told 429 (the queue is full) waits before retrying (the ``Retry-After`` header).
RETRY_AFTER_S = 1
#: The ``endpoint`` label of /metrics for each route path (other paths: ``"other"``).
ENDPOINTS = {"/v1/completions": "completions", "/v1/chat/completions": "chat", "/v1/models": "models"}


@dataclass(frozen=True)
class ServerSettings:
    """What the server serves and what it allows.

    Attributes:
        served_name: The model id clients name in ``model`` (and ``/v1/models`` lists).
        defaults: Schedule, width and order of requests that name none.
        limits: Request size limits.
        api_key: Bearer token every route except ``/health`` requires (``None``: no authentication). Compared
            as UTF-8 bytes, so a non-ASCII key matches a client that sends its UTF-8 bytes.
        read_timeout: Seconds a client may take to send a request body; a slower one gets 408.
    """

    served_name: str
    defaults: Defaults = Defaults()
    limits: Limits = Limits()
    api_key: str | None = None
    read_timeout: float = 30.0


def create_app(engine: Engine, model: ModelBackend, settings: ServerSettings) -> Starlette:
    """The ASGI application; its lifespan starts the engine and closes it at shutdown.

    Args:
        engine: The engine that decodes (started by the app's lifespan, closed at its end).
        model: The served model (its tokenizer, chat template, context and vocabulary; never decoded with here).
        settings: Name, defaults, limits and API key.
    """
    api = _API(engine, model, settings)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        engine.start()
        try:
            yield
        finally:
            engine.stop_admitting()
            await run_in_threadpool(engine.close)

    routes = [
        Route("/health", api.health, methods=["GET"]),
        Route("/metrics", api.prometheus, methods=["GET"]),
        Route("/v1/models", api.models, methods=["GET"]),
        Route("/v1/models/{model_id:path}", api.retrieve_model, methods=["GET"]),
        Route("/v1/completions", api.completions, methods=["POST"]),
        Route("/v1/chat/completions", api.chat, methods=["POST"]),
    ]
    handlers: dict[Any, Callable[..., Awaitable[Response]]] = {
        HTTPException: _http_error,
        Exception: _server_error,
    }
    app = Starlette(routes=routes, exception_handlers=handlers, lifespan=lifespan)
    app.state.api = api
    return app


def error_response(error: APIError) -> JSONResponse:
    """OpenAI's error JSON with the error's status, and the headers it calls for.

    ``WWW-Authenticate`` on a 401, ``Retry-After`` on a 429, ``Connection: close`` on a 408 (the body was not
    read to its end, so the connection cannot carry another request).
    """
    headers = {
        401: {"WWW-Authenticate": "Bearer"},
        408: {"Connection": "close"},
        429: {"Retry-After": str(RETRY_AFTER_S)},
    }.get(error.status)
    return JSONResponse(error.body(), status_code=error.status, headers=headers)


def _endpoint(path: str) -> str:
    """The ``endpoint`` label of a request path."""
    return "models" if path.startswith("/v1/models/") else ENDPOINTS.get(path, "other")


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    path = protocol.shown(request.url.path)
    messages = {404: f"no route {path}", 405: f"{request.method} is not allowed on {path}"}
    message = messages.get(exc.status_code, str(exc.detail))
    error = APIError(exc.status_code, message, code="not_found" if exc.status_code == 404 else None)
    return request.app.state.api.respond(_endpoint(request.url.path), error_response(error))


async def _server_error(request: Request, exc: Exception) -> Response:
    log.error("unhandled error on %s", request.url.path, exc_info=exc)
    error = APIError(500, f"internal server error ({type(exc).__name__}); see the server's log")
    return request.app.state.api.respond(_endpoint(request.url.path), error_response(error))


class _API:
    """The route handlers and what they share."""

    def __init__(self, engine: Engine, model: ModelBackend, settings: ServerSettings) -> None:
        self.engine = engine
        self.model = model
        self.settings = settings
        self.metrics = engine.metrics
        self.created = int(time.time())
        self.context = model.max_positions + 1

    # -- plumbing ------------------------------------------------------------------------------------------
    def _check_key(self, request: Request) -> None:
        key = self.settings.api_key
        if key is None:
            return
        given = request.headers.get("authorization", "")
        scheme, _, token = given.partition(" ")
        # Header values arrive decoded as latin-1: encoding back gives the bytes sent, compared with the key's
        # UTF-8 bytes (what curl and other clients send for a non-ASCII key).
        sent = token.strip().encode("latin-1")
        if scheme.lower() != "bearer" or not hmac.compare_digest(sent, key.encode("utf-8")):
            raise APIError(
                401,
                "missing or wrong API key: send the header 'Authorization: Bearer <key>' with the key the server "
                "was started with (specframe serve --api-key)",
                code="invalid_api_key",
            )

    async def _body(self, request: Request) -> bytes:
        limit, timeout = self.settings.limits.max_body_bytes, self.settings.read_timeout
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise _too_large(int(declared), limit)
        chunks, size = [], 0
        try:
            with anyio.fail_after(timeout):
                async for chunk in request.stream():
                    size += len(chunk)
                    if size > limit:
                        raise _too_large(size, limit)
                    chunks.append(chunk)
        except ClientDisconnect:
            raise _Gone from None
        except TimeoutError:
            raise APIError(
                408,
                f"the request body did not arrive within {timeout:g} s ({size} bytes came); send the whole body "
                "at once (the server's limit is specframe serve --read-timeout)",
                code="request_timeout",
            ) from None
        return b"".join(chunks)

    def respond(self, endpoint: str, response: Response) -> Response:
        """Count ``response`` in /metrics under ``endpoint``, and return it."""
        self.metrics.http(endpoint, response.status_code)
        return response

    def _error(self, endpoint: str, error: APIError) -> Response:
        return self.respond(endpoint, error_response(error))

    # -- simple routes -------------------------------------------------------------------------------------
    async def health(self, request: Request) -> Response:
        """``GET /health``: 200 while the engine runs and admits requests, 503 otherwise."""
        engine = self.engine
        engine.start()  # where the host ran no lifespan
        ok = engine.alive and engine._admitting  # noqa: SLF001
        body = {
            "status": "ok" if ok else "unavailable",
            "model": self.settings.served_name,
            "active": engine.active_count,
            "queued": engine.queue_length,
        }
        return JSONResponse(body, status_code=200 if ok else 503)

    async def prometheus(self, request: Request) -> Response:
        """``GET /metrics``: Prometheus text format."""
        try:
            self._check_key(request)
        except APIError as exc:
            return error_response(exc)
        return PlainTextResponse(self.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    def _model_card(self) -> dict[str, Any]:
        return {"id": self.settings.served_name, "object": "model", "created": self.created, "owned_by": "specframe"}

    async def models(self, request: Request) -> Response:
        """``GET /v1/models``: the one served model."""
        try:
            self._check_key(request)
        except APIError as exc:
            return self._error("models", exc)
        return self.respond("models", JSONResponse({"object": "list", "data": [self._model_card()]}))

    async def retrieve_model(self, request: Request) -> Response:
        """``GET /v1/models/{id}``."""
        try:
            self._check_key(request)
            name = request.path_params["model_id"]
            if name != self.settings.served_name:
                raise protocol.model_not_found(name, self.settings.served_name)
        except APIError as exc:
            return self._error("models", exc)
        return self.respond("models", JSONResponse(self._model_card()))

    # -- generation ----------------------------------------------------------------------------------------
    async def completions(self, request: Request) -> Response:
        """``POST /v1/completions``."""
        return await self._generate(request, "completion")

    async def chat(self, request: Request) -> Response:
        """``POST /v1/chat/completions``."""
        return await self._generate(request, "chat")

    def _parse(self, body: bytes, kind: str) -> Job:
        settings, model = self.settings, self.model
        data = protocol.parse_json(body)
        common = {"served": settings.served_name, "defaults": settings.defaults, "limits": settings.limits}
        encode = self._encode
        try:
            if kind == "chat":
                template = getattr(model.tokenizer, "chat_template", None)
                job = protocol.parse_chat(data, template=template, encode=encode, context=self.context, **common)
            else:
                job = protocol.parse_completion(
                    data, encode=encode, vocab_size=model.vocab_size, context=self.context, **common
                )
        except SpecframeError as exc:  # e.g. a model without a tokenizer asked for text
            raise protocol.bad(str(exc)) from None
        self._check_plugins(job, width_given=data.get("width") is not None)
        return job

    def _check_plugins(self, job: Job, *, width_given: bool) -> None:
        """Refuse an unknown schedule or order now (400 naming it), not after the request waited for a slot.

        A schedule that takes no width (``ar``) named without a width gets ``"auto"`` rather than the server's
        default width, which it would refuse.
        """
        from specframe.plugins import get_registry

        registry = get_registry()
        config = job.options.config()
        for field, kind in (("schedule", "schedule"), ("order", "order_policy")):
            value = config[field]
            name = value if isinstance(value, str) else value["name"]
            try:
                entry = registry.get(kind, name, family=self.model.family if kind == "schedule" else None)
            except SpecframeError as exc:
                raise protocol.bad(str(exc), field, "unknown_" + field) from None
            if kind == "schedule" and not width_given and not getattr(entry.factory, "takes_width", True):
                job.options = dataclasses.replace(job.options, width="auto")

    def _encode(self, text: str) -> list[int]:
        # A prompt far over the limit is refused before tokenizing it all (a token is at least one character).
        limit = self.settings.limits.max_prompt_tokens
        if len(text) > 64 * limit:
            raise protocol.bad(
                f"the prompt has {len(text)} characters, far more than this server's limit of {limit} tokens",
                "prompt",
                "context_length_exceeded",
            )
        return self.model.encode_prompt(text)

    async def _generate(self, request: Request, kind: str) -> Response:
        endpoint = "chat" if kind == "chat" else "completions"
        try:
            self._check_key(request)
            body = await self._body(request)
            job = await run_in_threadpool(self._parse, body, kind)
            submission = self.engine.submit(job, asyncio.get_running_loop())
        except APIError as exc:
            return self._error(endpoint, exc)
        except _Gone:
            return self.respond(endpoint, Response(status_code=CLIENT_GONE))
        event = await _next_or_gone(request, submission)
        if event is None:  # the client went away while the request waited
            submission.cancel()
            return self.respond(endpoint, Response(status_code=CLIENT_GONE))
        if event.kind == "error":
            return self._error(endpoint, event.error)
        info = event.info
        if job.stream:
            self.metrics.http(endpoint, 200)
            return _EventStream(self._events(job, submission, info), submission)
        event = await _next_or_gone(request, submission)
        if event is None:
            submission.cancel()
            return self.respond(endpoint, Response(status_code=CLIENT_GONE))
        if event.kind == "error":
            return self._error(endpoint, event.error)
        generation = event.generation
        text = self._output(job).final(generation.output_ids)
        return self.respond(endpoint, JSONResponse(protocol.response(job, text, generation, info)))

    def _output(self, job: Job) -> protocol.OutputText:
        return protocol.OutputText(self.model.decode, self.model.eos_token_ids, job.options.stop)

    async def _events(self, job: Job, submission: Submission, info: dict[str, Any]) -> AsyncIterator[bytes]:
        """The server-sent events of a streamed response."""
        text = self._output(job)
        ids: list[int] = []
        if job.kind == "chat":
            yield protocol.sse(protocol.chunk(job, "", role=True))
        while True:
            event = await submission.next()
            if event.kind == "tokens":
                ids += event.ids
                new = text.update(ids)
                if new:
                    yield protocol.sse(protocol.chunk(job, new))
            elif event.kind == "done":
                generation = event.generation
                rest = text.finish(generation.output_ids)
                if rest:
                    yield protocol.sse(protocol.chunk(job, rest))
                last = protocol.chunk(job, None, reason=protocol.finish_reason(generation.stop_reason))
                last["specframe"] = protocol.speculative_stats(generation, info)
                yield protocol.sse(last)
                if job.include_usage:
                    yield protocol.sse(protocol.usage_chunk(job, generation))
                yield protocol.sse("[DONE]")
                return
            elif event.kind == "error":  # headers are sent: the error goes in the stream, as OpenAI's does
                yield protocol.sse(event.error.body())
                yield protocol.sse("[DONE]")
                return


class _Gone(Exception):
    """The client disconnected."""


def _too_large(size: int, limit: int) -> APIError:
    return APIError(
        413,
        f"the request body has {size} bytes or more, over this server's limit of {limit} "
        "(specframe serve --max-body-bytes)",
        code="request_too_large",
    )


async def _wait_disconnect(receive: Receive) -> None:
    """Return once the client has disconnected (the request body must have been read)."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


async def _next_or_gone(request: Request, submission: Submission) -> Event | None:
    """The submission's next event, or ``None`` if the client disconnects first."""
    gone = asyncio.ensure_future(_wait_disconnect(request.receive))
    event = asyncio.ensure_future(submission.next())
    try:
        await asyncio.wait({gone, event}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        if not event.done():
            event.cancel()
    return event.result() if event.done() and not event.cancelled() else None


class _EventStream(Response):
    """A ``text/event-stream`` response that cancels its job when the client disconnects mid-stream."""

    media_type = "text/event-stream"

    def __init__(self, events: AsyncIterator[bytes], submission: Submission) -> None:
        self.events = events
        self.submission = submission
        self.status_code = 200
        self.background = None
        self.init_headers({"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Send the events while listening for a disconnect; either ending stops the other."""
        try:
            async with anyio.create_task_group() as group:

                async def stream() -> None:
                    await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
                    async for data in self.events:
                        await send({"type": "http.response.body", "body": data, "more_body": True})
                    await send({"type": "http.response.body", "body": b"", "more_body": False})
                    group.cancel_scope.cancel()

                async def listen() -> None:
                    await _wait_disconnect(receive)
                    group.cancel_scope.cancel()

                group.start_soon(stream)
                group.start_soon(listen)
        except OSError:  # the connection broke while sending
            pass
        finally:
            self.submission.cancel()  # a no-op once the job has ended
