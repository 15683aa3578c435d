"""Training for specframe's models: ``specframe train`` and ``specframe train-drafter`` (a plugin distribution).

Maintainer tooling, kept out of the installed ``specframe`` package: it trains the small tri-mode models that
ship with specframe and the drafters of converted models. Installing this distribution adds the two commands
through specframe's ``register_commands`` hook (the ``specframe`` entry-point group in ``pyproject.toml``);
their modules are imported only when a command runs. Everything runs offline, on the CPython
standard-library source of the machine (the drafter also on a GPU):

* :mod:`~specframe_training.corpus`: the corpus, its deterministic held-out split by file, and the BPE
  tokenizers (one per family, with the family's special-token layout);
* :mod:`~specframe_training.forward`: a batched, cache-free forward of the inference network under an
  arbitrary ``[B, T, T]`` attention mask, with autograd;
* :mod:`~specframe_training.objectives`: the Nemotron-Labs-Diffusion joint objective (next-token loss plus a
  block-diffusion loss) and SetDLM's any-order objective over staggered orders (duplicate masks);
* :mod:`~specframe_training.distill`: drafter self-distillation on the model's own greedy AR rollouts (a short
  stage after the Nemotron-style model's main steps);
* :mod:`~specframe_training.trainer`: the resumable training loop and the export to each family's Hub layout;
* :mod:`~specframe_training.evaluate`: held-out perplexity and speculative acceptance;
* :mod:`~specframe_training.drafter` and :mod:`~specframe_training.prompts`: the drafter (proposal LoRA) of a
  converted model, trained on the base model's own greedy continuations of the prompts written here.
"""

from __future__ import annotations

from specframe import hookimpl


@hookimpl
def register_commands(register):
    """Register ``specframe train`` and ``specframe train-drafter`` (each imported only when it runs)."""
    register(
        "train",
        "specframe_training.cli:add_parser",
        help="train one of the small bundled-style models on the Python stdlib",
    )
    register(
        "train-drafter",
        "specframe_training.drafter_cli:add_parser",
        help="train the drafter (proposal LoRA) of a converted model on its own greedy text",
    )
