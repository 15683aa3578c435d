"""Client input never causes a 500 or stops the server: each bad request is a 4xx naming the problem."""

from __future__ import annotations

import json

import httpx2 as httpx
import pytest
from serve_helpers import SERVED

GOOD = {"model": SERVED, "prompt": "def f(x):", "max_tokens": 4, "temperature": 0}
CHAT = {"model": SERVED, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "temperature": 0}


def _with(base, **changes):
    body = dict(base)
    for key, value in changes.items():
        if value is _DROP:
            body.pop(key)
        else:
            body[key] = value
    return json.dumps(body).encode()


_DROP = object()

# (name, path, raw body, status, param or None, a word the message must contain)
CASES = [
    ("truncated-json", "/v1/completions", b'{"model": ', 400, None, "JSON"),
    ("array-body", "/v1/completions", b"[]", 400, None, "object"),
    ("empty-body", "/v1/completions", b"", 400, None, "empty"),
    ("not-utf8", "/v1/completions", b"\xff\xfe{}", 400, None, "UTF-8"),
    ("nan-literal", "/v1/completions", b'{"model": "tiny", "prompt": "x", "temperature": NaN}', 400, None, "NaN"),
    ("deep-nesting", "/v1/completions", b"[" * 100000, 400, None, "JSON"),
    ("huge-int", "/v1/completions", b'{"max_tokens": ' + b"9" * 5000 + b"}", 400, None, "JSON"),
    ("no-model", "/v1/completions", _with(GOOD, model=_DROP), 400, "model", "model"),
    ("model-not-string", "/v1/completions", _with(GOOD, model=3), 400, "model", "string"),
    ("no-prompt", "/v1/completions", _with(GOOD, prompt=_DROP), 400, "prompt", "required"),
    ("empty-prompt", "/v1/completions", _with(GOOD, prompt=""), 400, "prompt", "empty"),
    ("empty-id-prompt", "/v1/completions", _with(GOOD, prompt=[]), 400, "prompt", "empty"),
    ("number-prompt", "/v1/completions", _with(GOOD, prompt=5), 400, "prompt", "string"),
    ("float-ids", "/v1/completions", _with(GOOD, prompt=[1.5, 2]), 400, "prompt", "integers"),
    ("id-out-of-vocab", "/v1/completions", _with(GOOD, prompt=[10**9]), 400, "prompt", "vocabulary"),
    ("negative-id", "/v1/completions", _with(GOOD, prompt=[-1]), 400, "prompt", "vocabulary"),
    ("two-prompts", "/v1/completions", _with(GOOD, prompt=["a", "b"]), 400, "prompt", "one prompt"),
    ("long-prompt", "/v1/completions", _with(GOOD, prompt="x = 1\n" * 400), 400, "prompt", "limit"),
    ("max-tokens-string", "/v1/completions", _with(GOOD, max_tokens="10"), 400, "max_tokens", "integer"),
    ("max-tokens-float", "/v1/completions", _with(GOOD, max_tokens=8.0), 400, "max_tokens", "integer"),
    ("max-tokens-bool", "/v1/completions", _with(GOOD, max_tokens=True), 400, "max_tokens", "integer"),
    ("max-tokens-zero", "/v1/completions", _with(GOOD, max_tokens=0), 400, "max_tokens", ">= 1"),
    ("max-tokens-huge", "/v1/completions", _with(GOOD, max_tokens=10**12), 400, "max_tokens", "limit"),
    ("temperature-text", "/v1/completions", _with(GOOD, temperature="hot"), 400, "temperature", "number"),
    ("temperature-negative", "/v1/completions", _with(GOOD, temperature=-1), 400, "temperature", "[0, 2]"),
    ("temperature-high", "/v1/completions", _with(GOOD, temperature=3), 400, "temperature", "[0, 2]"),
    ("top-p-zero", "/v1/completions", _with(GOOD, temperature=1, top_p=0), 400, "top_p", "> 0"),
    ("top-k-negative", "/v1/completions", _with(GOOD, temperature=1, top_k=-2), 400, "top_k", ">= 0"),
    ("top-k-over-vocab", "/v1/completions", _with(GOOD, temperature=1, top_k=10**7), 400, "top_k", "vocabulary"),
    ("n-two", "/v1/completions", _with(GOOD, n=2), 400, "n", "1"),
    ("best-of", "/v1/completions", _with(GOOD, best_of=3), 400, "best_of", "not supported"),
    ("logprobs", "/v1/completions", _with(GOOD, logprobs=5), 400, "logprobs", "not supported"),
    ("empty-stop", "/v1/completions", _with(GOOD, stop=[""]), 400, "stop", "empty"),
    ("five-stops", "/v1/completions", _with(GOOD, stop=list("abcde")), 400, "stop", "at most 4"),
    ("stop-number", "/v1/completions", _with(GOOD, stop=7), 400, "stop", "string"),
    ("seed-negative", "/v1/completions", _with(GOOD, seed=-1), 400, "seed", "2**64"),
    ("seed-huge", "/v1/completions", _with(GOOD, seed=2**64), 400, "seed", "2**64"),
    ("stream-text", "/v1/completions", _with(GOOD, stream="yes"), 400, "stream", "true or false"),
    (
        "stream-options-alone",
        "/v1/completions",
        _with(GOOD, stream_options={"include_usage": True}),
        400,
        "stream_options",
        "stream: true",
    ),
    ("unknown-field", "/v1/completions", _with(GOOD, frobnicate=1), 400, "frobnicate", "unrecognized"),
    ("unknown-schedule", "/v1/completions", _with(GOOD, schedule="nope"), 400, "schedule", "nope"),
    ("schedule-cli-form", "/v1/completions", _with(GOOD, schedule="kbranch:k=3"), 400, "schedule", "object"),
    ("schedule-no-name", "/v1/completions", _with(GOOD, schedule={"k": 3}), 400, "schedule", "name"),
    (
        "schedule-bad-option",
        "/v1/completions",
        _with(GOOD, schedule={"name": "packed", "bogus": 1}),
        400,
        "schedule",
        "bogus",
    ),
    ("width-zero", "/v1/completions", _with(GOOD, width=0), 400, "width", "[1, 16]"),
    ("width-huge", "/v1/completions", _with(GOOD, width=1000), 400, "width", "[1, 16]"),
    ("width-text", "/v1/completions", _with(GOOD, width="wide"), 400, "width", "integer"),
    ("ar-with-width", "/v1/completions", _with(GOOD, schedule="ar", width=4), 400, "schedule", "no width"),
    ("unknown-order", "/v1/completions", _with(GOOD, order="sideways"), 400, "order", "sideways"),
    ("order-family-refuses", "/v1/completions", _with(GOOD, order="confidence"), 400, "order", "confidence"),
    ("other-model", "/v1/completions", _with(GOOD, model="gpt-4"), 404, "model", "gpt-4"),
    ("no-messages", "/v1/chat/completions", _with(CHAT, messages=_DROP), 400, "messages", "required"),
    ("empty-messages", "/v1/chat/completions", _with(CHAT, messages=[]), 400, "messages", "non-empty"),
    (
        "bad-role",
        "/v1/chat/completions",
        _with(CHAT, messages=[{"role": "wizard", "content": "x"}]),
        400,
        "messages[0]",
        "role",
    ),
    (
        "content-number",
        "/v1/chat/completions",
        _with(CHAT, messages=[{"role": "user", "content": 5}]),
        400,
        "messages[0]",
        "content",
    ),
    (
        "image-part",
        "/v1/chat/completions",
        _with(CHAT, messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]),
        400,
        "messages[0]",
        "text only",
    ),
    (
        "tool-calls",
        "/v1/chat/completions",
        _with(CHAT, messages=[{"role": "user", "content": "x", "tool_calls": []}]),
        400,
        "messages[0]",
        "tool",
    ),
    ("chat-prompt-field", "/v1/chat/completions", _with(CHAT, prompt="x"), 400, "prompt", "unrecognized"),
    (
        "big-max-completion",
        "/v1/chat/completions",
        _with(CHAT, max_completion_tokens=10**6),
        400,
        "max_completion_tokens",
        "limit",
    ),
]


@pytest.mark.parametrize("name,path,body,status,param,word", CASES, ids=[c[0] for c in CASES])
def test_bad_request_is_a_4xx_with_openai_error_json(server, name, path, body, status, param, word):
    response = httpx.post(server.url + path, content=body, headers={"content-type": "application/json"}, timeout=60)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == ("not_found_error" if status == 404 else "invalid_request_error")
    assert error["param"] == param
    assert word in error["message"]


def test_an_oversized_body_is_a_413_before_it_is_read(server):
    body = b'{"prompt": "' + b"x" * (2 << 20) + b'"}'
    response = httpx.post(server.url + "/v1/completions", content=body, timeout=60)
    assert response.status_code == 413 and response.json()["error"]["code"] == "request_too_large"


@pytest.mark.parametrize("method,path,status", [("GET", "/v1/nowhere", 404), ("GET", "/v1/completions", 405)])
def test_unknown_routes_and_methods_get_openai_error_json(server, method, path, status):
    response = httpx.request(method, server.url + path, timeout=60)
    assert response.status_code == status and path in response.json()["error"]["message"]


def test_the_server_survives_every_bad_request_and_never_answered_500(server):
    for _, path, body, *_ in CASES:
        httpx.post(server.url + path, content=body, timeout=60)
    assert httpx.get(server.url + "/health", timeout=60).json()["status"] == "ok"
    good = httpx.post(server.url + "/v1/completions", content=json.dumps(GOOD).encode(), timeout=60)
    assert good.status_code == 200 and good.json()["choices"][0]["finish_reason"] in ("stop", "length")
    metrics = httpx.get(server.url + "/metrics", timeout=60).text
    assert 'status="500"' not in metrics
