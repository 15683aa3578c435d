"""Safe defaults: API key, bounded queue, client disconnects, /metrics, graceful shutdown."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import httpx2 as httpx
import openai
import pytest
from serve_helpers import SERVED, expected_text, offline, private_server, wait_for

REQUEST = {"model": SERVED, "prompt": "def fib(n):", "max_tokens": 8, "temperature": 0}


def _client(server, key="unused"):
    return openai.OpenAI(base_url=server.url + "/v1", api_key=key, max_retries=0, timeout=120)


def test_api_key_is_required_everywhere_but_health(served_model):
    with private_server(served_model, api_key="s3cret") as server:
        with pytest.raises(openai.AuthenticationError) as caught:
            _client(server, "wrong").completions.create(**REQUEST)
        assert caught.value.status_code == 401 and caught.value.body["code"] == "invalid_api_key"
        with pytest.raises(openai.AuthenticationError):
            _client(server, "wrong").models.list()
        assert httpx.get(server.url + "/metrics", timeout=60).status_code == 401
        assert httpx.post(server.url + "/v1/completions", json=REQUEST, timeout=60).status_code == 401
        assert httpx.get(server.url + "/health", timeout=60).status_code == 200
        text = _client(server, "s3cret").completions.create(**REQUEST).choices[0].text
        expected = offline(served_model, served_model.encode_prompt(REQUEST["prompt"]), max_tokens=8)
        assert text == expected_text(served_model, expected)


def test_past_the_queue_a_request_gets_429_and_the_queued_one_still_finishes(served_model):
    with private_server(served_model, max_active=1, max_queue=1) as server:
        engine, results = server.engine, {}
        with engine.hold():  # nothing is admitted: the first request waits in the queue
            waiting = threading.Thread(
                target=lambda: results.setdefault("text", _client(server).completions.create(**REQUEST).choices[0].text)
            )
            waiting.start()
            wait_for(lambda: engine.queue_length == 1, "the first request to be queued")
            with pytest.raises(openai.RateLimitError) as caught:
                _client(server).completions.create(**REQUEST)
            error = caught.value.body
            assert caught.value.status_code == 429 and error["code"] == "rate_limit_exceeded"
            assert error["type"] == "rate_limit_error" and "--max-queue" in error["message"]
        waiting.join(120)
        expected = offline(served_model, served_model.encode_prompt(REQUEST["prompt"]), max_tokens=8)
        assert results["text"] == expected_text(served_model, expected)


def _raw_stream(server, body) -> socket.socket:
    """Send a streamed request on a raw socket (to drop the connection at a chosen moment)."""
    payload = json.dumps(body).encode()
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=60)
    sock.sendall(
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(payload)}\r\n\r\n".encode()
        + payload
    )
    return sock


def test_a_client_that_disconnects_while_queued_cancels_its_request(served_model):
    with private_server(served_model) as server:
        engine = server.engine
        with engine.hold():
            sock = _raw_stream(server, {**REQUEST, "stream": True, "max_tokens": 200})
            wait_for(lambda: engine.queue_length == 1, "the request to be queued")
            sock.close()
            wait_for(lambda: engine.queue_length == 0, "the queued request to be dropped")
        assert engine.metrics.value("specframe_requests_finished_total", finish_reason="cancelled") == 1
        assert engine.metrics.value("specframe_generation_tokens_total") == 0


def test_a_client_that_disconnects_mid_stream_cancels_its_request(served_model):
    with private_server(served_model) as server:
        engine = server.engine
        sock = _raw_stream(server, {**REQUEST, "stream": True, "max_tokens": 200})
        received = b""
        while not re.search(rb'"text": ?"[^"]', received):  # the first piece of text has arrived
            data = sock.recv(65536)
            assert data, "the stream ended before any text"
            received += data
        with engine.hold():  # the request cannot finish now: only the disconnect can end it
            before = engine.cancels_requested
            sock.close()
            wait_for(lambda: engine.cancels_requested > before, "the server to notice the disconnect")
        wait_for(lambda: engine.active_count == 0, "the engine to drop the request")
        assert engine.metrics.value("specframe_requests_finished_total", finish_reason="cancelled") == 1
        assert engine.metrics.value("specframe_requests_finished_total", finish_reason="length") == 0


SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{([a-zA-Z_]\w*="(?:[^"\\]|\\.)*",?)*\})? (\S+)$')


def parse_prometheus(text: str) -> dict[str, dict[str, float]]:
    """A strict reader of the text format: every line a HELP/TYPE comment or a sample of a declared metric."""
    types, samples = {}, {}
    for line in text.splitlines():
        if line.startswith("# HELP ") or line.startswith("# TYPE "):
            parts = line.split(" ", 3)
            if parts[1] == "TYPE":
                assert parts[3] in ("counter", "gauge", "histogram"), line
                types[parts[2]] = parts[3]
            continue
        match = SAMPLE.match(line)
        assert match, f"not a sample line: {line!r}"
        name, labels, value = match.group(1), match.group(2) or "", match.group(4)
        base = re.sub(r"_(bucket|sum|count)$", "", name) if name not in types else name
        assert base in types, f"{name} has no # TYPE"
        samples.setdefault(name, {})[labels] = float(value)
    return {"types": types, **samples}


def test_metrics_parse_and_add_up_to_the_responses(served_model):
    with private_server(served_model) as server:
        client = _client(server)
        responses = [
            client.completions.create(**{**REQUEST, "prompt": prompt}, extra_body={"width": width})
            for prompt, width in (("def fib(n):", 4), ("import os", 2), ("class A:", "auto"))
        ]
        metrics = parse_prometheus(httpx.get(server.url + "/metrics", timeout=60).text)
    stats = [r.model_extra["specframe"] for r in responses]
    total = metrics["specframe_generation_tokens_total"][""]
    assert total == sum(r.usage.completion_tokens for r in responses)
    assert metrics["specframe_prompt_tokens_total"][""] == sum(r.usage.prompt_tokens for r in responses)
    assert metrics["specframe_model_calls_total"][""] == sum(s["nfe"] for s in stats)
    assert sum(metrics["specframe_calls_by_width_total"].values()) == sum(s["nfe"] for s in stats)
    assert metrics["specframe_accepted_tokens_total"][""] == sum(s["accepted_tokens"] for s in stats)
    assert (
        metrics["specframe_requests_finished_total"]['{finish_reason="length"}']
        + metrics["specframe_requests_finished_total"].get('{finish_reason="stop"}', 0)
        == 3
    )
    assert metrics["specframe_http_requests_total"]['{endpoint="completions",status="200"}'] == 3
    assert metrics["specframe_queue_length"][""] == 0 and metrics["specframe_active_requests"][""] == 0
    buckets = metrics["specframe_request_latency_seconds_bucket"]
    counts = list(buckets.values())
    assert counts == sorted(counts) and buckets['{le="+Inf"}'] == 3
    assert metrics["specframe_request_latency_seconds_count"][""] == 3
    assert metrics["types"]["specframe_request_latency_seconds"] == "histogram"


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_lets_the_request_in_flight_finish_then_exits_0(sig, tmp_path):
    """`specframe serve` in a subprocess: stop admitting on the signal, finish the stream, exit 0."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2] / "src"), "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "specframe.cli", "serve", "--port", "0", "--schedule", "ar", "--log-level"]
    process = subprocess.Popen(
        [*command, "warning", "--max-tokens", "64"], stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path
    )
    try:
        url = None
        for line in process.stderr:
            found = re.search(r"listening on (http://\S+)", line)
            if found:
                url = found.group(1)
                break
        assert url, "the server did not say where it listens"
        body = {"model": "nemotron-stdlib-tiny", "prompt": "def fib(n):", "max_tokens": 64, "temperature": 0}
        with httpx.stream("POST", url + "/v1/completions", json={**body, "stream": True}, timeout=120) as response:
            assert response.status_code == 200
            lines = response.iter_lines()
            first = next(line for line in lines if line.startswith("data: "))
            process.send_signal(sig)
            rest = [line for line in lines if line.startswith("data: ")]
        assert json.loads(first.removeprefix("data: "))["choices"][0]["finish_reason"] is None
        assert rest[-1] == "data: [DONE]"
        last = json.loads(rest[-2].removeprefix("data: "))
        assert last["choices"][0]["finish_reason"] in ("stop", "length")
        assert process.wait(120) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
