"""What the server tests compare against: offline decoding of the same request, written out independently."""

from __future__ import annotations

import contextlib
import functools
import json
import socket
import threading
import time

import uvicorn

from specframe import compose
from specframe.models.chat import render_chat
from specframe.serve.app import ServerSettings, create_app
from specframe.serve.builder import decoder_factory
from specframe.serve.engine import Engine
from specframe.serve.protocol import Defaults, Limits


def wait_for(condition, what: str, limit_s: float = 60.0) -> None:
    """Poll ``condition`` until it holds (a bound against hanging, not a timed assertion)."""
    deadline = time.monotonic() + limit_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what}")
        time.sleep(0.01)


def acceptance(temperature: float, top_p: float = 1.0):
    """The acceptance rule a request's sampling fields mean (OpenAI: temperature 0 is greedy)."""
    if temperature == 0:
        return "greedy"
    rule = {"name": "rejection", "temperature": temperature}
    if top_p < 1:
        rule["top_p"] = top_p
    return rule


@functools.cache
def _offline(model, prompt_ids, config_json, max_tokens, seed):
    decoder = compose({"model": model, **json.loads(config_json), "threads": 1, "seed": None})
    return decoder.generate(prompt_ids=list(prompt_ids), max_new_tokens=max_tokens, seed=seed)


def offline(
    model,
    prompt_ids,
    *,
    schedule="packed",
    width=4,
    order="ltr",
    temperature=0.0,
    top_p=1.0,
    stop=(),
    max_tokens=16,
    seed=None,
):
    """``Decoder.generate`` of the request, on the same model (cached per request)."""
    config = {
        "schedule": schedule,
        "width": width,
        "order": order,
        "acceptance": acceptance(temperature, top_p),
        "stop": list(stop),
    }
    return _offline(model, tuple(prompt_ids), json.dumps(config, sort_keys=True), max_tokens, seed)


def expected_text(model, generation, stop=()) -> str:
    """What OpenAI's API returns for a generation: no final EOS, and the text ends before the first stop string."""
    ids = list(generation.output_ids)
    if ids and ids[-1] in model.eos_token_ids:
        ids = ids[:-1]
    text = model.decode(ids)
    cuts = [text.find(s) for s in stop if s in text]
    return text[: min(cuts)] if cuts else text


def expected_finish(generation) -> str:
    return "length" if generation.stop_reason == "length" else "stop"


def chat_ids(model, messages) -> list[int]:
    """The prompt ids of chat ``messages`` (``generate --chat``'s way: the template's text, encoded)."""
    return model.encode_prompt(render_chat(model.tokenizer.chat_template, messages))


SERVED = "tiny"
# A ChatML-style template for the chat tests (the bundled models have none).
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


class RunningServer:
    """uvicorn serving ``app`` in a daemon thread; ``url`` is its base URL."""

    def __init__(self, app, engine: Engine) -> None:
        self.engine = engine
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(app, log_level="warning", lifespan="on", timeout_graceful_shutdown=5)
        self.server, run = self.make(config)
        self.thread = threading.Thread(target=run, kwargs={"sockets": [sock]}, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 60
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the test server did not start")
            time.sleep(0.02)

    def make(self, config):
        """The uvicorn server, and what runs it (a subclass may wrap it)."""
        server = uvicorn.Server(config)
        return server, server.run

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)


def start_server(
    model,
    *,
    api_key=None,
    max_active=16,
    max_queue=64,
    limits: Limits | None = None,
    exact_only=False,
    max_rows=None,
    read_timeout=30.0,
    server_class=None,
):
    """A server over ``model`` (``server_class``: how to run the app, :class:`RunningServer` by default)."""
    engine = Engine(
        decoder_factory(model, threads=1, max_tokens=256, exact_only=exact_only),
        max_active=max_active,
        max_queue=max_queue,
        max_rows=max_rows,
    )
    settings = ServerSettings(
        served_name=SERVED,
        defaults=Defaults(schedule="packed", width=4, order="ltr"),
        limits=limits or Limits(max_prompt_tokens=512, max_tokens=256, max_width=16),
        api_key=api_key,
        read_timeout=read_timeout,
    )
    return (server_class or RunningServer)(create_app(engine, model, settings), engine)


@contextlib.contextmanager
def private_server(model, **kwargs):
    """A server of its own (for tests that change its state: keys, a tiny queue, a held engine)."""
    running = start_server(model, **kwargs)
    try:
        yield running
    finally:
        running.stop()
