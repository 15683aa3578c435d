"""Defects a hostile-input trial found (issue 31, item 4): each is a clear error or the right behaviour now."""

from __future__ import annotations

import functools
import json
import re
import shutil
import signal
import socket
import threading

import httpx2 as httpx
import pytest
from serve_helpers import (
    SERVED,
    RunningServer,
    expected_text,
    offline,
    private_server,
    start_server,
    wait_for,
)
from test_serve_safety import _raw_stream, parse_prometheus

from specframe.serve.cli import GracefulServer

REQUEST = {"model": SERVED, "prompt": "def fib(n):", "max_tokens": 8, "temperature": 0}
CHAT = {"model": SERVED, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "temperature": 0}


def _post(server, body, path="/v1/completions", **kwargs):
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(server.url + path, content=content, timeout=120, **kwargs)


def _error(response, status):
    assert response.status_code == status, response.text
    return response.json()["error"]


def test_a_top_p_below_float32s_smallest_keeps_the_most_likely_token():
    """top_p 1e-50 rounds to 0 in float32; it keeps each step's most likely token, so sampling is greedy."""
    from specframe import load_model

    model = load_model("nemotron-stdlib-tiny", dtype="float32")
    with private_server(model) as server:
        response = _post(server, {**REQUEST, "temperature": 1, "top_p": 1e-50, "seed": 3})
    assert response.status_code == 200, response.text
    greedy = offline(model, model.encode_prompt(REQUEST["prompt"]), max_tokens=8)
    assert response.json()["choices"][0]["text"] == expected_text(model, greedy)


def test_a_lone_surrogate_in_a_field_name_is_escaped_in_the_400(server):
    error = _error(_post(server, b'{"model": "tiny", "prompt": "x", "\\ud800abc": 1}'), 400)
    assert error["code"] == "unknown_parameter"
    assert error["param"] == "\\ud800abc" and "\\ud800abc" in error["message"]


@pytest.mark.parametrize(
    "body,status,param",
    [
        ({**REQUEST, "seed": int("9" * 4000)}, 400, "seed"),
        ({**REQUEST, "model": "m" * 100_000}, 404, "model"),
        ({**REQUEST, "x" * 100_000: 1}, 400, "x" * 30),
        ({**REQUEST, "schedule": "s" * 100_000}, 400, "schedule"),
    ],
    ids=["4000-digit-seed", "100kb-model", "100kb-field-name", "100kb-schedule"],
)
def test_error_messages_echo_a_bounded_part_of_the_input(server, body, status, param):
    error = _error(_post(server, body), status)
    assert len(error["message"]) < 1200 and len(error["param"]) < 100
    assert error["param"].startswith(param)


def test_a_non_ascii_api_key_matches_its_utf8_bytes(served_model):
    with private_server(served_model, api_key="clé-ü") as server:
        good = _post(server, REQUEST, headers={"Authorization": "Bearer clé-ü".encode()})
        assert good.status_code == 200, good.text
        wrong = _post(server, REQUEST, headers={"Authorization": "Bearer clé-ü".encode("latin-1")})
        assert _error(wrong, 401)["code"] == "invalid_api_key"


@pytest.mark.parametrize(
    "path,base,field,value",
    [
        ("/v1/completions", REQUEST, "logprobs", 0),
        ("/v1/completions", REQUEST, "logprobs", False),
        ("/v1/completions", REQUEST, "echo", True),
        ("/v1/completions", REQUEST, "echo", 0),
        ("/v1/completions", REQUEST, "best_of", True),
        ("/v1/chat/completions", CHAT, "logprobs", True),
        ("/v1/chat/completions", CHAT, "logprobs", 0),
        ("/v1/chat/completions", CHAT, "top_logprobs", 2),
        ("/v1/chat/completions", CHAT, "tool_choice", "required"),
        ("/v1/chat/completions", CHAT, "tool_choice", {"type": "function", "function": {"name": "f"}}),
        ("/v1/chat/completions", CHAT, "response_format", {"type": "json_object"}),
        ("/v1/chat/completions", CHAT, "presence_penalty", 0.5),
    ],
)
def test_an_unsupported_option_asking_for_something_is_refused_naming_it(server, path, base, field, value):
    error = _error(_post(server, {**base, field: value}, path), 400)
    assert error["param"] == field and error["code"] == "unsupported_value"
    assert "not supported" in error["message"] and "leave it out" in error["message"]


@pytest.mark.parametrize(
    "path,base,fields",
    [
        ("/v1/completions", REQUEST, {"logprobs": None, "echo": False, "best_of": 1, "suffix": ""}),
        ("/v1/completions", REQUEST, {"frequency_penalty": 0, "presence_penalty": 0.0, "logit_bias": {}}),
        ("/v1/chat/completions", CHAT, {"logprobs": False, "top_logprobs": 0, "tool_choice": "none"}),
        ("/v1/chat/completions", CHAT, {"response_format": {"type": "text"}, "tools": [], "tool_choice": "auto"}),
        ("/v1/chat/completions", CHAT, {"parallel_tool_calls": True, "function_call": "none"}),
    ],
)
def test_openai_neutral_values_are_accepted(served_model, server, path, base, fields):
    response = _post(server, {**base, **fields}, path)
    assert response.status_code == 200, response.text
    plain = _post(server, base, path)
    assert response.json()["choices"] == plain.json()["choices"]


def test_a_429_says_when_to_retry(served_model):
    with private_server(served_model, max_active=1, max_queue=1) as server:
        engine = server.engine
        with engine.hold():
            waiting = threading.Thread(target=_post, args=(server, REQUEST))
            waiting.start()
            wait_for(lambda: engine.queue_length == 1, "the first request to be queued")
            response = _post(server, REQUEST)
        waiting.join(120)
    assert _error(response, 429)["code"] == "rate_limit_exceeded"
    assert int(response.headers["retry-after"]) >= 1


def test_a_body_that_does_not_arrive_gets_408(served_model):
    with private_server(served_model, read_timeout=0.2) as server:
        sock = socket.create_connection(("127.0.0.1", server.port), timeout=60)
        sock.sendall(b'POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{"model": ')
        received = b""
        while b"\r\n\r\n" not in received or not received.endswith(b"}"):
            data = sock.recv(65536)
            if not data:
                break
            received += data
        sock.close()
        metrics = parse_prometheus(httpx.get(server.url + "/metrics", timeout=60).text)
    head, _, body = received.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408"), received
    error = json.loads(body)["error"]
    assert error["code"] == "request_timeout" and "--read-timeout" in error["message"]
    assert metrics["specframe_http_requests_total"]['{endpoint="completions",status="408"}'] == 1


def test_every_response_is_counted_by_its_status(served_model, monkeypatch):
    from specframe.serve import protocol

    with private_server(served_model) as server:
        engine = server.engine
        # A client error the engine finds (composing the decoder): a 400, and no server error.
        bogus = _post(server, {**REQUEST, "schedule": {"name": "packed", "bogus": 1}})
        assert _error(bogus, 400)["param"] == "schedule"
        # A client that goes away while its request waits: 499.
        with engine.hold():
            sock = _raw_stream(server, {**REQUEST, "stream": True})
            wait_for(lambda: engine.queue_length == 1, "the request to be queued")
            sock.close()
            wait_for(lambda: engine.queue_length == 0, "the queued request to be dropped")

        # A bug in the server: a 500 with OpenAI's error JSON.
        def broken(*args, **kwargs):
            raise RuntimeError("a bug")

        monkeypatch.setattr(protocol, "parse_completion", broken)
        assert _error(_post(server, REQUEST), 500)["type"] == "server_error"
        wait_for(
            lambda: engine.metrics.value("specframe_http_requests_total", endpoint="completions", status="499") == 1,
            "the 499 to be counted",
        )
        metrics = parse_prometheus(httpx.get(server.url + "/metrics", timeout=60).text)
    http = metrics["specframe_http_requests_total"]
    assert http['{endpoint="completions",status="400"}'] == 1
    assert http['{endpoint="completions",status="500"}'] == 1
    finished = metrics["specframe_requests_finished_total"]
    assert finished['{finish_reason="invalid_request"}'] == 1 and '{finish_reason="error"}' not in finished


def test_a_served_folder_is_named_by_its_name_not_its_path(tmp_path):
    from specframe.models.hub import bundled_models_folder
    from specframe.serve.builder import build_app

    folder = tmp_path / "private" / "my-model"
    shutil.copytree(bundled_models_folder() / "nemotron-stdlib-tiny", folder)
    app = build_app(str(folder), schedule="packed", width=4, threads=1)
    assert app.state.api.settings.served_name == "my-model"
    named = build_app(str(folder), served_name="public", schedule="packed", width=4, threads=1)
    assert named.state.api.settings.served_name == "public"


def test_an_exact_only_server_refuses_a_lossy_schedule(served_model):
    with private_server(served_model, exact_only=True) as server:
        error = _error(_post(server, {**REQUEST, "schedule": "native"}), 400)
        assert error["param"] == "schedule" and "--exact-only" in error["message"]
        exact = _post(server, REQUEST)
        assert exact.status_code == 200 and exact.json()["specframe"]["exact"] is True
    with private_server(served_model) as server:
        lossy = _post(server, {**REQUEST, "schedule": "native"})
        assert lossy.status_code == 200 and lossy.json()["specframe"]["exact"] is False


def test_a_server_refuses_calls_over_its_rows_limit(served_model):
    """Quadratic calls at width 4 have up to 30 rows, packed ones 10 (on the Nemotron layout)."""
    with private_server(served_model, max_rows=20) as server:
        wide = _post(server, {**REQUEST, "schedule": "quadratic", "width": 4})
        error = _error(wide, 400)
        assert error["code"] == "rows_limit_exceeded" and error["param"] == "width"
        assert "--max-rows" in error["message"] and "width 4" in error["message"]
        assert int(re.search(r"calls of (\d+) rows", error["message"]).group(1)) > 20
        assert _post(server, {**REQUEST, "schedule": "packed", "width": 4}).status_code == 200
        assert _post(server, {**REQUEST, "schedule": "quadratic", "width": "auto"}).status_code == 200
    with private_server(served_model) as server:
        assert _post(server, {**REQUEST, "schedule": "quadratic", "width": 4}).status_code == 200


class _GracefulRunningServer(RunningServer):
    """The test server run by ``specframe serve``'s :class:`GracefulServer`, with a shutdown timeout of 0."""

    def make(self, config):
        engine = self.engine
        config.timeout_graceful_shutdown = 60  # as `specframe serve`: uvicorn's own cancelling comes well after
        self.graceful = GracefulServer(
            config, on_signal=engine.stop_admitting, on_expiry=functools.partial(engine.close, 0), shutdown_timeout=0
        )
        return self.graceful.server, self.graceful.run


def test_requests_still_running_at_the_shutdown_timeout_get_503(served_model):
    """A queued request gets a 503 JSON error, a started stream an error event and [DONE], not a bare 500."""
    server = start_server(served_model, server_class=_GracefulRunningServer)
    engine, results = server.engine, {}
    try:
        stream = _raw_stream(server, {**REQUEST, "stream": True, "max_tokens": 200})
        received = b""
        while b'"text":' not in received:
            data = stream.recv(65536)
            assert data, "the stream ended before its first chunk"
            received += data
        with engine.hold():  # neither request can finish now: only the shutdown ends them
            queued = threading.Thread(target=lambda: results.setdefault("queued", _post(server, REQUEST)))
            queued.start()
            wait_for(lambda: engine.queue_length == 1, "the second request to be queued")
            server.graceful._handle(signal.SIGTERM, None)
            while True:
                data = stream.recv(65536)
                if not data:
                    break
                received += data
            queued.join(120)
    finally:
        server.stop()
    events = [line.removeprefix(b"data: ") for line in received.split(b"\n") if line.startswith(b"data: ")]
    assert events[-1] == b"[DONE]"
    assert json.loads(events[-2])["error"]["code"] == "shutting_down"
    error = _error(results["queued"], 503)
    assert error["code"] == "shutting_down"


@pytest.mark.parametrize(
    "option,value,word",
    [
        ("--read-timeout", "0", "--read-timeout must be a number of seconds > 0"),
        ("--max-rows", "0", "--max-rows must be >= 1"),
        ("--served-model-name", " ", "--served-model-name is empty"),
        ("--shutdown-timeout", "nan", "--shutdown-timeout must be a number of seconds >= 0"),
    ],
)
def test_the_new_serve_options_refuse_bad_values_before_loading(option, value, word, capsys):
    from specframe.cli import main

    assert main(["serve", option, value]) != 0
    assert word in capsys.readouterr().err
