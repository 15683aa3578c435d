"""The built-in commands, registered through the ``register_commands`` hook exactly as a plugin's are.

Each target module is imported only when its command runs, so ``specframe --help`` stays fast.
"""

from __future__ import annotations

from specframe.hookspecs import Register, hookimpl


@hookimpl
def register_commands(register: Register) -> None:
    """Register ``plugins``, ``generate`` and the commands that live in their own modules."""
    register("plugins", "specframe.cli:add_plugins_parser", help="list registered plugins as JSON")
    register(
        "generate",
        "specframe.cli:add_generate_parser",
        help="decode one prompt (the text is written as tokens are accepted)",
    )
    register(
        "bench",
        "specframe.bench.cli:add_parser",
        help="compare schedules on a task's prompts (speed, accuracy, acceptance, bootstrap intervals)",
    )
    register(
        "train",
        "specframe.training.cli:add_parser",
        help="train one of the small bundled-style models on the Python standard library",
    )
    register(
        "calibrate",
        "specframe.choice.cli:add_parser",
        help="measure (or show) this machine's model-call cost model, which width 'auto' uses",
    )
    register(
        "convert",
        "specframe.convert.cli:add_parser",
        help="convert an AR checkpoint (GGUF or transformers Llama/Mistral/Qwen3) into a specframe model folder",
    )
    register(
        "train-drafter",
        "specframe.training.drafter_cli:add_parser",
        help="train the drafter (proposal LoRA) of a converted model on its own greedy text",
    )
    register(
        "pull",
        "specframe.convert.pull:add_parser",
        help="fetch and convert a named real model (e.g. smollm2-135m) for offline use",
    )
