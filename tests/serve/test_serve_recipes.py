"""The Serving page's recipes run: the OpenAI-client example against a live server, and the Ray Serve app's builder."""

from __future__ import annotations

import contextlib
import io
import os
import sys
import types
from pathlib import Path

import httpx2 as httpx
import pytest
from serve_helpers import SERVED, RunningServer, expected_text

ROOT = Path(__file__).parents[2]


def test_the_openai_client_example_runs_against_a_live_server(server):
    code = (ROOT / "docs/recipes/openai_client.py").read_text(encoding="utf-8")
    assert "http://127.0.0.1:8000" in code and '"nemotron-stdlib-tiny"' in code
    code = code.replace("http://127.0.0.1:8000", server.url).replace('"nemotron-stdlib-tiny"', repr(SERVED))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "openai_client.py", "exec"), {"__name__": "docs_recipe"})
    assert out.getvalue().strip()


def test_the_ray_serve_recipe_builds_a_working_app(monkeypatch):
    """Ray is not installed here: a stand-in ``ray.serve`` records what the recipe hands it, and the builder it
    gives Ray (what each replica runs) is served by uvicorn and answers a request."""
    recorded = {}

    def deployment(**options):
        recorded["options"] = options
        return lambda cls: types.SimpleNamespace(bind=lambda: ("bound", cls))

    def ingress(builder):
        recorded["builder"] = builder
        return lambda cls: cls

    serve = types.ModuleType("ray.serve")
    serve.deployment, serve.ingress = deployment, ingress
    ray = types.ModuleType("ray")
    ray.serve = serve
    monkeypatch.setitem(sys.modules, "ray", ray)
    monkeypatch.setitem(sys.modules, "ray.serve", serve)
    code = (ROOT / "docs/recipes/ray_serve_app.py").read_text(encoding="utf-8")
    namespace = {"__name__": "ray_serve_app"}
    exec(compile(code, "ray_serve_app.py", "exec"), namespace)
    assert namespace["app"][0] == "bound" and recorded["options"]["num_replicas"] == 2
    app = recorded["builder"]()  # what a replica runs when it starts
    running = RunningServer(app, app.state.api.engine)
    try:
        body = {"model": "nemotron-stdlib-tiny", "prompt": "def fib(n):", "max_tokens": 4, "temperature": 0}
        response = httpx.post(running.url + "/v1/completions", json=body, timeout=120)
        assert response.status_code == 200 and response.json()["usage"]["completion_tokens"] >= 1
    finally:
        running.stop()


@pytest.mark.slow
def test_ray_serve_replicas_answer_as_offline_decoding(monkeypatch):
    """With ray[serve] installed (not a test dependency: see the Serving page for its cost), the recipe's two
    replicas answer whole and streamed requests with offline decoding's output."""
    pytest.importorskip("ray.serve")
    import socket

    import openai
    import ray
    from ray import serve

    from specframe import compose

    monkeypatch.syspath_prepend(str(ROOT / "docs/recipes"))
    paths = [str(ROOT / "src"), str(ROOT / "docs/recipes"), *filter(None, [os.environ.get("PYTHONPATH")])]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(paths))  # the replicas' workers import both
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        import ray_serve_app

        serve.run(ray_serve_app.app, route_prefix="/")
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0, timeout=300)
        decoder = compose({"model": "nemotron-stdlib-tiny", "schedule": "packed", "width": 4, "threads": 1})
        for prompt in ("def fib(n):", "import os\n", "class Stack:", "for i in range("):
            request = {"model": "nemotron-stdlib-tiny", "prompt": prompt, "max_tokens": 16, "temperature": 0}
            whole = client.completions.create(**request, extra_body={"width": 4})
            streamed = client.completions.create(**request, extra_body={"width": 4}, stream=True)
            expected = decoder.generate(prompt, max_new_tokens=16)
            text = expected_text(decoder.model, expected)
            assert whole.choices[0].text == text == "".join(c.choices[0].text for c in streamed)
            assert whole.model_extra["specframe"]["output_ids"] == expected.output_ids
    finally:
        serve.shutdown()
        ray.shutdown()
