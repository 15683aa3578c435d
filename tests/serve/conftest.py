"""A real specframe server on 127.0.0.1 (a free port, uvicorn in a thread) over the bundled tiny model."""

from __future__ import annotations

import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
pytest.importorskip("openai")

from serve_helpers import CHAT_TEMPLATE, start_server  # noqa: E402

from specframe import load_model  # noqa: E402


@pytest.fixture(scope="session")
def served_model():
    """The bundled Nemotron-style tiny model in float64 (exact comparisons), with a chat template set."""
    model = load_model("nemotron-stdlib-tiny", dtype="float64")
    model.tokenizer.chat_template = CHAT_TEMPLATE
    return model


@pytest.fixture(scope="session")
def server(served_model):
    """The shared server: no API key, 16 active, 64 queued."""
    running = start_server(served_model)
    yield running
    running.stop()


@pytest.fixture
def client(server):
    import openai

    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)
