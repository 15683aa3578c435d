"""A bounded load test: a few hundred requests at concurrency 1 to 32, 0 errors, every output equal offline.

It stops by itself (a fixed list of requests, no duration) and asserts nothing about time.
"""

from __future__ import annotations

import asyncio
import itertools

import openai
from serve_helpers import SERVED, chat_ids, expected_text, offline

PROMPTS = [
    "def fib(n):",
    "import os\n",
    "class Stack:",
    "for i in range(",
    "def __init__(self",
    "# Return the sum",
    "x = [",
    "with open(",
]
# (extra body fields, the offline decoder's options): greedy over several schedules, and seeded sampling
OPTIONS = [
    ({"temperature": 0}, {}),
    ({"temperature": 0, "extra_body": {"schedule": "ar"}}, {"schedule": "ar", "width": "auto"}),
    ({"temperature": 0, "extra_body": {"width": "auto"}}, {"width": "auto"}),
    ({"temperature": 0, "extra_body": {"schedule": "linear", "width": 2}}, {"schedule": "linear", "width": 2}),
    ({"temperature": 0.9, "seed": 5, "extra_body": {"width": 3}}, {"temperature": 0.9, "seed": 5, "width": 3}),
]
LEVELS = [(1, 16), (4, 40), (8, 64), (16, 80), (32, 96)]  # (concurrency, requests): 296 in all


def _requests():
    """A fixed, varied stream of requests: prompt, options, length, streamed or not, chat or not."""
    cases = itertools.product(range(len(PROMPTS)), range(len(OPTIONS)), (4, 9), (False, True), (False, True))
    return [
        {"prompt": p, "options": o, "max_tokens": n, "stream": s, "chat": c}
        for p, o, n, s, c in itertools.islice(itertools.cycle(cases), sum(count for _, count in LEVELS))
    ]


async def _one(client, case):
    fields, _ = OPTIONS[case["options"]]
    prompt = PROMPTS[case["prompt"]]
    common = {"model": SERVED, "max_tokens": case["max_tokens"], **fields}
    if case["chat"]:
        common["messages"] = [{"role": "user", "content": prompt}]
        create = client.chat.completions.create
    else:
        common["prompt"] = prompt
        create = client.completions.create
    if not case["stream"]:
        response = await create(**common)
        choice = response.choices[0]
        return choice.message.content if case["chat"] else choice.text
    pieces = []
    async for chunk in await create(**common, stream=True):
        if chunk.choices:
            delta = chunk.choices[0]
            pieces.append((delta.delta.content or "") if case["chat"] else delta.text)
    return "".join(pieces)


async def _level(url, cases, concurrency):
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=300)
    gate = asyncio.Semaphore(concurrency)

    async def run(case):
        async with gate:
            try:
                return await _one(client, case)
            except Exception as exc:  # counted, not raised: every error of the run is reported together
                return exc

    try:
        return await asyncio.gather(*(run(case) for case in cases))
    finally:
        await client.close()


def test_concurrent_requests_all_succeed_and_equal_offline_decoding(server, served_model):
    cases, start, errors, mismatches = _requests(), 0, [], []
    for concurrency, count in LEVELS:
        batch = cases[start : start + count]
        start += count
        results = asyncio.run(_level(server.url, batch, concurrency))
        for case, result in zip(batch, results, strict=True):
            if isinstance(result, Exception):
                errors.append((concurrency, case, repr(result)))
                continue
            prompt = PROMPTS[case["prompt"]]
            ids = (
                chat_ids(served_model, [{"role": "user", "content": prompt}])
                if case["chat"]
                else served_model.encode_prompt(prompt)
            )
            expected = offline(served_model, ids, max_tokens=case["max_tokens"], **OPTIONS[case["options"]][1])
            if result != expected_text(served_model, expected):
                mismatches.append((concurrency, case, result, expected_text(served_model, expected)))
    assert not errors, errors[:5]
    assert not mismatches, mismatches[:5]
    assert start == len(cases) >= 200
    assert server.engine.active_count == 0 and server.engine.queue_length == 0
