"""Build the server's ASGI app from plain options: what ``specframe serve`` runs, and what other hosts embed.

``build_app(...)`` loads the model once, composes the default decoder (which checks the defaults and, for
width ``"auto"``, measures the machine's call cost before the first request), and returns the Starlette app.
Any ASGI server can run it (uvicorn, hypercorn, a Ray Serve replica: see the Serving page); its engine thread
starts with the app's lifespan, or with the first request where a host runs no lifespan.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from specframe.errors import ConfigError


def _require_serve_extra() -> None:
    try:
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as exc:
        raise ConfigError(
            f"specframe serve needs the serve extra ({exc.name} is missing): pip install 'specframe[serve]'"
        ) from None


def decoder_factory(
    model: Any, *, threads: int | None, max_tokens: int, exact_only: bool = False
) -> Callable[[Any], Any]:
    """``options -> Decoder`` on the loaded ``model`` (what :class:`~specframe.serve.engine.Engine` composes with).

    Args:
        model: The loaded model backend every decoder shares.
        threads: CPU threads (the count chosen once at start-up, so composing never re-measures the machine).
        max_tokens: The decoders' default output limit (requests always give their own).
        exact_only: Refuse options whose decoder is not exact (its output would not be the AR model's).
    """
    from specframe.config import compose

    def build(options: Any) -> Any:
        config = {**options.config(), "threads": threads, "max_new_tokens": max_tokens, "seed": None}
        decoder = compose({"model": model, **config})
        if exact_only:
            check_exact(decoder)
        return decoder

    return build


def check_exact(decoder: Any) -> None:
    """Refuse a decoder whose output is not the AR model's, on a server that serves exact schedules only.

    Raises:
        ConfigError: Naming the schedule and ``--exact-only`` (a request gets it as a 400 about ``schedule``).
    """
    if not decoder.exact:
        raise ConfigError(
            f"schedule {decoder.schedule.name!r} is not exact: its output is not the AR model's, and this server "
            "serves exact schedules only (specframe serve --exact-only); use an exact schedule such as packed or ar"
        )


def public_model_id(name: str) -> str:
    """The id a server shows for a model: a bundled model's or a local folder's name, never this machine's path.

    Args:
        name: The model backend's name: a Hub repo id, a bundled model's name, or a checkpoint folder's path.

    Returns:
        The last component of a path that exists here (``/srv/models/my-model`` and ``./my-model`` are
        ``my-model``), otherwise ``name`` itself.
    """
    path = Path(name)
    return (path.resolve().name or name) if path.is_absolute() or path.exists() else name


def build_app(
    model: Any = None,
    *,
    served_name: str | None = None,
    schedule: str | Mapping[str, Any] = "packed",
    width: int | str = "auto",
    order: str | Mapping[str, Any] = "ltr",
    api_key: str | None = None,
    max_active: int = 16,
    max_queue: int = 64,
    max_tokens: int = 1024,
    max_prompt_tokens: int | None = None,
    max_body_bytes: int = 1 << 20,
    max_width: int = 32,
    max_rows: int | None = None,
    kv_blocks: int | None = None,
    kv_block_size: int = 16,
    prefill_chunk: int | None = None,
    exact_only: bool = False,
    read_timeout: float = 30.0,
    device: str | None = None,
    dtype: str | None = None,
    quant: str | None = None,
    revision: str | None = None,
    adapter: bool | None = None,
    threads: int | None = None,
    compile: bool = False,
) -> Any:
    """The server's ASGI app (Starlette) for one model.

    Args:
        model: Hub repo id, checkpoint folder, bundled model name, a loaded backend, or ``None`` (bundled default).
        served_name: The id clients send as ``model`` (default: the model's name; a local folder's name, not its
            path, see :func:`public_model_id`).
        schedule: Default schedule of requests that name none (a name or ``{"name": ..., **options}``).
        width: Default width (an integer or ``"auto"``).
        order: Default verification order.
        api_key: Bearer key every route but ``/health`` requires (``None``: none).
        max_active: Requests decoded at once.
        max_queue: Requests that may wait; one more gets 429.
        max_tokens: Largest ``max_tokens`` of a request.
        max_prompt_tokens: Longest prompt (default: the model's context).
        max_body_bytes: Largest request body.
        max_width: Widest width a request may ask for.
        max_rows: The most rows one call of a request that gives a width may have (``None``: no limit).
        kv_blocks: Page every request's KV cache from one pool of this many blocks, allocated now; a request
            waits until its blocks are free (``None``: a contiguous cache per request).
        kv_block_size: Rows per KV block.
        prefill_chunk: Most prompt tokens one model call evaluates (chunked prefill; ``None``: whole prompts).
        exact_only: Refuse requests (and defaults) whose decoding is not exact (the output not the AR model's).
        read_timeout: Seconds a client may take to send its request body (408 after).
        device: Device to load the model on.
        dtype: Model dtype.
        quant: GGUF block format to quantize the projections to at load (``None``: as stored).
        revision: Hub revision.
        adapter: Use the model's proposal-only adapter (``None``: the drafter the checkpoint declares).
        threads: CPU threads (``None``: chosen from the model's size and the free cores).
        compile: Compiled model calls.

    Raises:
        ConfigError: A bad option, default decoding options the model refuses, or the serve extra missing.
    """
    _require_serve_extra()
    import torch

    from specframe.batching import Batch
    from specframe.config import compose
    from specframe.models.paged import BlockPool
    from specframe.serve.app import ServerSettings, create_app
    from specframe.serve.engine import Engine
    from specframe.serve.metrics import ServerMetrics
    from specframe.serve.protocol import DecodeOptions, Defaults, Limits

    for name, value in (
        ("max_active", max_active),
        ("max_queue", max_queue),
        ("max_tokens", max_tokens),
        ("max_prompt_tokens", max_prompt_tokens),
        ("max_body_bytes", max_body_bytes),
        ("max_width", max_width),
        ("max_rows", max_rows),
        ("kv_blocks", kv_blocks),
        ("kv_block_size", kv_block_size),
        ("prefill_chunk", prefill_chunk),
    ):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ConfigError(f"{name} must be an integer >= 1, got {value!r}")
    if api_key is not None and (not isinstance(api_key, str) or not api_key.strip()):
        raise ConfigError("the API key is empty; give a key, or None for no authentication")
    if isinstance(read_timeout, bool) or not isinstance(read_timeout, (int, float)) or not 0 < read_timeout < 1e9:
        raise ConfigError(f"read_timeout must be a number of seconds > 0, got {read_timeout!r}")
    if served_name is not None and (not isinstance(served_name, str) or not served_name.strip()):
        raise ConfigError(f"served_name must be a non-empty string (or None for the model's name), got {served_name!r}")
    # The default decoder is composed once now: it loads the model and checks the defaults.
    first = compose(
        {
            "model": model,
            "device": device,
            "dtype": dtype,
            "quant": quant,
            "revision": revision,
            "adapter": adapter,
            "schedule": schedule,
            "order": order,
            "width": width,
            "threads": threads,
            "compile": compile,
            "max_new_tokens": max_tokens,
            "seed": None,
        }
    )
    backend = first.model
    if exact_only:
        check_exact(first)
    context = backend.max_positions + 1
    limits = Limits(
        max_body_bytes=max_body_bytes,
        max_prompt_tokens=min(max_prompt_tokens or context, context),
        max_tokens=max_tokens,
        max_width=max_width,
    )
    engine = Engine(
        decoder_factory(backend, threads=torch.get_num_threads(), max_tokens=max_tokens, exact_only=exact_only),
        max_active=max_active,
        max_queue=max_queue,
        metrics=ServerMetrics(),
        max_rows=max_rows,
        batch=Batch(
            None if kv_blocks is None else BlockPool.for_model(backend, kv_blocks, kv_block_size),
            prefill_chunk=prefill_chunk,
        ),
    )
    defaults = Defaults(schedule=schedule, width=width, order=order)

    def canonical(value: Any) -> str:
        return json.dumps(value, sort_keys=True)

    greedy = DecodeOptions(canonical(schedule), canonical(order), canonical("greedy"), width, ())
    engine.decoders.put(greedy, first)  # greedy requests with the defaults decode with it
    name = served_name or public_model_id(backend.name)
    return create_app(engine, backend, ServerSettings(name, defaults, limits, api_key, read_timeout))
