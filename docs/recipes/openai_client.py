"""Talk to `specframe serve` with the OpenAI Python client (pip install openai)."""

from openai import OpenAI

client = OpenAI(base_url="http://127.0.0.1:8000/v1", api_key="unused")  # the key matters only with --api-key

# A completion, greedy (temperature 0), with specframe's own fields in extra_body.
response = client.completions.create(
    model="nemotron-stdlib-tiny",
    prompt="def fib(n):",
    max_tokens=32,
    temperature=0,
    extra_body={"schedule": "packed", "width": 4},
)
print(response.choices[0].text)
stats = response.model_extra["specframe"]  # how it was decoded
print(stats["nfe"], stats["tokens_per_nfe"], stats["widths"])

# The same request streamed: text arrives as each model call accepts tokens.
for chunk in client.completions.create(
    model="nemotron-stdlib-tiny", prompt="def fib(n):", max_tokens=32, temperature=0, stream=True
):
    print(chunk.choices[0].text, end="", flush=True)
print()

# Seeded sampling: the same seed gives the same tokens.
sampled = client.completions.create(
    model="nemotron-stdlib-tiny", prompt="import os\n", max_tokens=16, temperature=0.8, top_p=0.95, seed=3
)
print(sampled.choices[0].text)
