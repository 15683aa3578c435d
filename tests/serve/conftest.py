"""A real specframe server on 127.0.0.1 (a free port, uvicorn in a thread) over the bundled tiny model."""

from __future__ import annotations

import contextlib
import socket
import threading
import time

import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
pytest.importorskip("openai")

import uvicorn  # noqa: E402

from specframe import load_model  # noqa: E402
from specframe.serve.app import ServerSettings, create_app  # noqa: E402
from specframe.serve.cli import decoder_factory  # noqa: E402
from specframe.serve.engine import Engine  # noqa: E402
from specframe.serve.protocol import Defaults, Limits  # noqa: E402

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
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]}, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 60
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the test server did not start")
            time.sleep(0.02)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)


@pytest.fixture(scope="session")
def served_model():
    """The bundled Nemotron-style tiny model in float64 (exact comparisons), with a chat template set."""
    model = load_model("nemotron-stdlib-tiny", dtype="float64")
    model.tokenizer.chat_template = CHAT_TEMPLATE
    return model


def start_server(model, *, api_key=None, max_active=16, max_queue=64, limits: Limits | None = None):
    engine = Engine(decoder_factory(model, threads=1, max_tokens=256), max_active=max_active, max_queue=max_queue)
    settings = ServerSettings(
        served_name=SERVED,
        defaults=Defaults(schedule="packed", width=4, order="ltr"),
        limits=limits or Limits(max_prompt_tokens=512, max_tokens=256, max_width=16),
        api_key=api_key,
    )
    return RunningServer(create_app(engine, model, settings), engine)


@pytest.fixture(scope="session")
def server(served_model):
    """The shared server: no API key, 16 active, 64 queued."""
    running = start_server(served_model)
    yield running
    running.stop()


@contextlib.contextmanager
def private_server(model, **kwargs):
    """A server of its own (for tests that change its state: keys, a tiny queue, a held engine)."""
    running = start_server(model, **kwargs)
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture
def client(server):
    import openai

    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)
