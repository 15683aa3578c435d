"""``specframe serve``: load a model once and serve it over an OpenAI-compatible HTTP API (uvicorn)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

from specframe.errors import ConfigError

API_KEY_ENV = "SPECFRAME_API_KEY"
#: Seconds uvicorn waits past --shutdown-timeout for the 503s of the cancelled requests to be written, before
#: it cancels what is left (a connection that does not read its response).
SHUTDOWN_GRACE_S = 10.0


def add_parser(sub: Any) -> None:
    """Add ``specframe serve``."""
    from specframe.cli import add_model_options, width_value

    parser = sub.add_parser(
        "serve",
        help="serve a model over an OpenAI-compatible HTTP API (completions, chat, streaming, /metrics)",
        description="Load the model once and serve /v1/completions, /v1/chat/completions, /v1/models, /health and "
        "/metrics on 127.0.0.1 (unless --host). Concurrent requests are decoded together, each exactly as "
        "decoding it alone would. Requests choose schedule, width and order with extra body fields; these "
        "options are the defaults.",
    )
    parser.add_argument(
        "--model",
        help="Hub repo id, checkpoint folder, or a bundled model's name (default: nemotron-stdlib-tiny)",
    )
    parser.add_argument(
        "--served-model-name",
        help="the id clients send as 'model' (default: the model's name; a local folder's name, never its path)",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    parser.add_argument("--port", type=int, default=8000, help="port (default 8000; 0 picks a free one)")
    parser.add_argument(
        "--api-key",
        help=f"require 'Authorization: Bearer KEY' on every route but /health (default: ${API_KEY_ENV} if set, "
        "else no key)",
    )
    parser.add_argument(
        "--schedule", default="packed", help="default schedule (NAME or NAME:key=value,...; default packed)"
    )
    parser.add_argument(
        "--width", type=width_value, default="auto", help="default width (integer or auto; default auto)"
    )
    parser.add_argument("--order", default="ltr", help="default verification order (default ltr)")
    parser.add_argument("--max-active", type=int, default=16, help="requests decoded at once (default 16)")
    parser.add_argument(
        "--max-queue", type=int, default=64, help="requests waiting beyond those (default 64); more get 429"
    )
    parser.add_argument(
        "--max-tokens", type=int, default=1024, help="largest max_tokens a request may ask for (default 1024)"
    )
    parser.add_argument("--max-prompt-tokens", type=int, help="longest prompt in tokens (default: the model's context)")
    parser.add_argument("--max-body-bytes", type=int, default=1 << 20, help="largest request body (default 1 MiB)")
    parser.add_argument("--max-width", type=int, default=32, help="widest width a request may ask for (default 32)")
    parser.add_argument(
        "--max-rows",
        type=int,
        help="most rows one model call of a request that gives a width may have (a quadratic call at width W has "
        "(W+1)(W+2)); default: no limit",
    )
    parser.add_argument(
        "--kv-blocks",
        type=int,
        help="page every request's KV cache from one pool of this many blocks, allocated at start; a request "
        "waits until its blocks are free (default: a cache of its own per request)",
    )
    parser.add_argument("--kv-block-size", type=int, default=16, help="rows per KV block (default 16)")
    parser.add_argument(
        "--prefill-chunk",
        type=int,
        help="most prompt tokens one model call evaluates: a longer prompt is cached in chunks of this many "
        "first, so that it does not stall the other requests' steps (default: whole prompts)",
    )
    parser.add_argument(
        "--exact-only",
        action="store_true",
        help="refuse requests whose schedule is not exact (output not the AR model's), such as native",
    )
    parser.add_argument(
        "--read-timeout",
        type=float,
        default=30.0,
        help="seconds a client may take to send its request body; slower ones get 408 (default 30)",
    )
    parser.add_argument(
        "--shutdown-timeout",
        type=float,
        default=30.0,
        help="on SIGINT/SIGTERM, seconds to let requests in flight finish before cancelling them (default 30)",
    )
    add_model_options(parser)
    parser.add_argument(
        "--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"], help="server log"
    )
    parser.set_defaults(handler=run)


def build_server(args: argparse.Namespace) -> tuple[Any, Any]:
    """Load the model and build ``(app, engine)`` from the parsed command line.

    Raises:
        ConfigError: A bad option, or default decoding options the model refuses.
    """
    from specframe.serve.builder import build_app
    from specframe.specs import parse_spec

    if not 0 <= args.port <= 65535:
        raise ConfigError(f"--port must lie in [0, 65535], got {args.port}")
    if not 0 <= args.shutdown_timeout < 1e9:
        raise ConfigError(f"--shutdown-timeout must be a number of seconds >= 0, got {args.shutdown_timeout}")
    if not 0 < args.read_timeout < 1e9:
        raise ConfigError(f"--read-timeout must be a number of seconds > 0, got {args.read_timeout}")
    if args.served_model_name is not None and not args.served_model_name.strip():
        raise ConfigError("--served-model-name is empty; give the id clients send, or leave it out for the model's")
    api_key = args.api_key if args.api_key is not None else os.environ.get(API_KEY_ENV) or None
    if api_key is not None and not api_key.strip():
        raise ConfigError("--api-key is empty; give a key, or leave the option out for no authentication")
    limits = ("max_active", "max_queue", "max_tokens", "max_prompt_tokens", "max_body_bytes", "max_width", "max_rows",
              "kv_blocks", "kv_block_size", "prefill_chunk")  # fmt: skip
    for name in limits:
        value = getattr(args, name)
        if value is not None and value < 1:
            raise ConfigError(f"--{name.replace('_', '-')} must be >= 1, got {value}")
    app = build_app(
        args.model,
        served_name=args.served_model_name,
        schedule=parse_spec(args.schedule, option="--schedule"),
        width=args.width,
        order=parse_spec(args.order, option="--order"),
        api_key=api_key,
        **{name: getattr(args, name) for name in limits},
        exact_only=args.exact_only,
        read_timeout=args.read_timeout,
        device=args.device,
        dtype=args.dtype,
        quant=args.quant,
        revision=args.revision,
        adapter=args.adapter,
        threads=args.threads,
        compile=args.compile,
    )
    return app, app.state.api.engine


def run(args: argparse.Namespace) -> int:
    """Serve until SIGINT or SIGTERM; requests in flight finish (up to --shutdown-timeout), then exit 0."""
    import uvicorn

    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s: %(name)s: %(message)s")
    app, engine = build_server(args)
    config = uvicorn.Config(
        app,
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        timeout_graceful_shutdown=args.shutdown_timeout + SHUTDOWN_GRACE_S,
        lifespan="on",
    )
    server = GracefulServer(
        config,
        on_signal=engine.stop_admitting,
        on_expiry=functools.partial(engine.close, 0),
        shutdown_timeout=args.shutdown_timeout,
    )
    server.run()
    return 0


class GracefulServer:
    """A uvicorn server whose SIGINT/SIGTERM stop admissions, let requests in flight finish, and exit 0.

    uvicorn re-raises the signal after its own graceful shutdown (so the process ends "killed by SIGTERM");
    here the signal only starts the shutdown. Requests still running ``shutdown_timeout`` seconds after it are
    ended by ``on_expiry`` (the engine's ``close``: each gets a 503, or an error event in its stream), before
    uvicorn's own ``timeout_graceful_shutdown`` (set longer) would cancel them with a bare 500. A second
    SIGINT cancels what is still running at once.

    Args:
        config: The uvicorn configuration.
        on_signal: Called on the first signal (the engine's ``stop_admitting``).
        on_expiry: Called once ``shutdown_timeout`` has passed with requests still running, and on a second
            SIGINT; it must not block.
        shutdown_timeout: Seconds requests in flight may run after the signal (``None``: uvicorn's timeout).
    """

    def __init__(
        self,
        config: Any,
        *,
        on_signal: Callable[[], None],
        on_expiry: Callable[[], None] | None = None,
        shutdown_timeout: float | None = None,
    ) -> None:
        import uvicorn

        outer = self

        class _Server(uvicorn.Server):
            @contextlib.contextmanager
            def capture_signals(self) -> Iterator[None]:
                if threading.current_thread() is not threading.main_thread():
                    yield
                    return
                handled = [signal.SIGINT, signal.SIGTERM]
                original = {sig: signal.signal(sig, outer._handle) for sig in handled}
                try:
                    yield
                finally:
                    for sig, handler in original.items():
                        signal.signal(sig, handler)

            async def startup(self, sockets: Any = None) -> None:
                await super().startup(sockets=sockets)
                for server in getattr(self, "servers", []):
                    for sock in server.sockets:
                        host, port = sock.getsockname()[:2]
                        print(f"specframe serve: listening on http://{host}:{port}", file=sys.stderr, flush=True)

            async def shutdown(self, sockets: Any = None) -> None:
                timer = None
                if outer.on_expiry is not None and outer.shutdown_timeout is not None:
                    timer = asyncio.get_running_loop().call_later(outer.shutdown_timeout, outer.on_expiry)
                try:
                    await super().shutdown(sockets=sockets)
                finally:
                    if timer is not None:
                        timer.cancel()

        self.server = _Server(config)
        self.on_signal = on_signal
        self.on_expiry = on_expiry
        self.shutdown_timeout = shutdown_timeout

    def _handle(self, sig: int, frame: Any) -> None:
        if self.server.should_exit and sig == signal.SIGINT:
            self.server.force_exit = True
            if self.on_expiry is not None:
                self.on_expiry()
        self.server.should_exit = True
        self.on_signal()

    def run(self, sockets: Any = None) -> None:
        """Serve until a signal (or ``should_exit``)."""
        self.server.run(sockets=sockets)
