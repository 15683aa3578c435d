"""The built-in commands, registered through the ``register_commands`` hook exactly as a plugin's are.

Each target module is imported only when its command runs, so ``specframe --help`` stays fast.
"""

from __future__ import annotations

from specframe.hookspecs import Register, hookimpl

COMMANDS = (  # name, "module:add_parser", the line of `specframe --help`
    ("plugins", "specframe.cli:add_plugins_parser", "list registered plugins as JSON"),
    ("generate", "specframe.cli:add_generate_parser", "decode one prompt (the text is written as tokens are accepted)"),
    (
        "bench",
        "specframe.bench.cli:add_parser",
        "compare schedules on a task's prompts (speed, accuracy, acceptance, bootstrap intervals)",
    ),
    (
        "calibrate",
        "specframe.cli:add_calibrate_parser",
        "measure (or show) this machine's model-call cost model, which width 'auto' uses",
    ),
    (
        "convert",
        "specframe.convert.cli:add_parser",
        "convert an AR checkpoint (GGUF or transformers Llama/Mistral/Qwen3) into a specframe model folder",
    ),
    (
        "pull",
        "specframe.convert.pull:add_parser",
        "fetch and convert a named real model (e.g. smollm2-135m) for offline use",
    ),
    (
        "serve",
        "specframe.serve.cli:add_parser",
        "serve a model over an OpenAI-compatible HTTP API (completions, chat, streaming, /metrics)",
    ),
)


@hookimpl
def register_commands(register: Register) -> None:
    """Register :data:`COMMANDS`."""
    for name, target, line in COMMANDS:
        register(name, target, help=line)
