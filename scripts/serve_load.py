"""Tokens per second of ``specframe serve`` under N concurrent clients (closed loop), from one run.

Usage::

    python scripts/serve_load.py                                   # bundled model, ar and auto, 1 and 8 clients
    python scripts/serve_load.py --schedules ar,packed --widths 0,2,auto --clients 1,4,8,16 --requests 32

It starts ``specframe serve`` on a free port of 127.0.0.1 (``--threads`` as given), waits for ``/health``, and
for each (schedule, width) and client count sends ``--requests`` greedy ``/v1/completions`` requests from
that many threads, each sending its next request when its last one returned (closed loop). It prints total
completion tokens per second, its ratio to one client, and checks that every response is the same at every
client count (greedy decoding is exact, batched or not). The runs of one method are interleaved over the
client counts ``--repeats`` times and the fastest is kept, as the machine is shared.
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

PROMPTS = [
    "def fibonacci(n):",
    "import os\n\ndef list_files(path):",
    "class Stack:\n    def __init__(self):",
    "def is_prime(n):",
    "# Return the sum of a list\ndef total(xs):",
    "def read_json(path):",
    "def reverse_words(text):",
    "def flatten(nested):",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(url: str, body: dict) -> dict:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=600) as response:
        return json.loads(response.read())


def run_clients(url: str, bodies: list[dict], clients: int) -> tuple[float, list[str], int]:
    """Send ``bodies`` from ``clients`` threads (closed loop); ``(seconds, texts in order, tokens)``."""
    texts: list[str | None] = [None] * len(bodies)
    tokens = [0] * len(bodies)
    next_index = iter(range(len(bodies)))
    lock = threading.Lock()

    def client() -> None:
        while True:
            with lock:
                index = next(next_index, None)
            if index is None:
                return
            reply = post(url, bodies[index])
            texts[index] = reply["choices"][0]["text"]
            tokens[index] = reply["usage"]["completion_tokens"]

    threads = [threading.Thread(target=client) for _ in range(clients)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return time.perf_counter() - started, texts, sum(tokens)  # type: ignore[return-value]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="as for specframe serve (default: the bundled model)")
    parser.add_argument("--schedules", default="ar,packed")
    parser.add_argument("--widths", default="auto", help="widths of the non-ar schedules, comma separated")
    parser.add_argument("--clients", default="1,8")
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1, help="torch threads of the server (default 1)")
    parser.add_argument("--max-active", type=int, default=16)
    args = parser.parse_args()
    clients = [int(c) for c in args.clients.split(",")]
    methods = []
    for schedule in args.schedules.split(","):
        if schedule == "ar":
            methods.append(("ar", None))
        else:
            methods += [(schedule, w if w == "auto" else int(w)) for w in args.widths.split(",")]

    port = free_port()
    command = [sys.executable, "-m", "specframe.cli", "serve", "--port", str(port), "--threads", str(args.threads)]
    command += ["--max-active", str(args.max_active), "--log-level", "warning"]
    command += ["--model", args.model] if args.model else []
    server = subprocess.Popen(command)
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            try:
                with urllib.request.urlopen(base + "/health", timeout=2):
                    break
            except OSError:
                time.sleep(0.2)
        else:
            print("the server did not come up", file=sys.stderr)
            return 1
        with urllib.request.urlopen(base + "/v1/models", timeout=10) as response:
            model = json.loads(response.read())["data"][0]["id"]
        print(f"{'method':<16} {'clients':>7} {'tok/s':>9} {'x 1 client':>10} {'same':>5}")
        for schedule, width in methods:
            extra = {"schedule": schedule} | ({"width": width} if width is not None else {})
            bodies = [
                {"model": model, "prompt": PROMPTS[i % len(PROMPTS)], "max_tokens": args.max_tokens,
                 "temperature": 0, **extra}
                for i in range(args.requests)
            ]  # fmt: skip
            run_clients(base + "/v1/completions", bodies[: max(clients)], max(clients))  # warm-up
            best: dict[int, float] = {}
            texts: dict[int, list[str]] = {}
            for _ in range(args.repeats):
                for count in clients:
                    seconds, got, tokens = run_clients(base + "/v1/completions", bodies, count)
                    best[count] = max(best.get(count, 0.0), tokens / seconds)
                    texts[count] = got
            label = schedule if width is None else f"{schedule}/w{width}"
            for count in clients:
                same = "yes" if texts[count] == texts[clients[0]] else "NO"
                print(f"{label:<16} {count:>7} {best[count]:>9.1f} {best[count] / best[clients[0]]:>10.2f} {same:>5}")
    finally:
        server.terminate()
        server.wait(timeout=60)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    raise SystemExit(main())
