"""A real specframe server on 127.0.0.1 (a free port, uvicorn in a thread) over the bundled tiny model."""

from __future__ import annotations

import importlib.util

import pytest

# Without the serve extra and the OpenAI client (the test extra installs them) these tests are not collected.
MISSING = [name for name in ("starlette", "uvicorn", "openai") if importlib.util.find_spec(name) is None]
if MISSING:
    collect_ignore_glob = ["test_*.py"]


@pytest.fixture(scope="session")
def served_model():
    """The bundled Nemotron-style tiny model in float64 (exact comparisons), with a chat template set."""
    from serve_helpers import CHAT_TEMPLATE

    from specframe import load_model

    model = load_model("nemotron-stdlib-tiny", dtype="float64")
    model.tokenizer.chat_template = CHAT_TEMPLATE
    return model


@pytest.fixture(scope="session")
def server(served_model):
    """The shared server: no API key, 16 active, 64 queued."""
    from serve_helpers import start_server

    running = start_server(served_model)
    yield running
    running.stop()


@pytest.fixture
def client(server):
    import openai

    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)
