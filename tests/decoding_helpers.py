"""Shared helpers for the decoding tests: tiny float64 models and independent reference computations.

The references here do not use specframe's mask builders or schedules: they build full-recompute inputs by
hand (a fresh cache, every clean token as an input row), so they check the builders' layouts and the cache
bookkeeping instead of repeating them.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import torch

from specframe import compose
from specframe.models import load_model
from specframe.models.base import ModelBackend, ModelCall
from specframe.testing.models import small_vocabulary, write_random_checkpoint

NEMOTRON = "nemotron-labs-diffusion"
SETDLM = "setdlm"
FAMILIES = (NEMOTRON, SETDLM)


def tiny_model(
    family: str, folder: Path, *, vocab: int, seed: int, dtype: str = "float64", logit_scale: float = 1.0
) -> ModelBackend:
    """A random model with ``vocab`` ids: the last is the mask token, the one before it EOS.

    ``logit_scale`` multiplies every logit (a flatter output distribution for sampling tests; argmax
    unchanged).
    """
    write_random_checkpoint(
        family, folder, seed=seed, tokenizer=False, logit_scale=logit_scale, **small_vocabulary(family, vocab)
    )
    return load_model(folder, dtype=dtype)


@contextlib.contextmanager
def eos_ids(model: ModelBackend, ids: tuple[int, ...]):
    """Temporarily change which ids end generation."""
    saved = model.eos_token_ids
    model.eos_token_ids = ids
    try:
        yield
    finally:
        model.eos_token_ids = saved


#: A fixed cost model for width / schedule "auto" in tests: choices must never depend on this machine's timing.
SYNTHETIC_COST = {"tau": 0.007, "delta": 0.0002, "host_s": 0.001}


def generate(model, schedule, prompt, length, *, width=4, order="ltr", acceptance="greedy", stop=(), seed=0, cost=None):
    """One generation with a freshly composed decoder (width / schedule "auto" use SYNTHETIC_COST by default)."""
    decoder = compose(
        {
            "model": model,
            "schedule": schedule,
            "order": order,
            "acceptance": acceptance,
            "width": "auto" if schedule == "ar" else width,  # ar takes no width
            "max_new_tokens": length,
            "stop": [list(s) for s in stop],
            "seed": seed,
            "cost": SYNTHETIC_COST if cost is None else cost,
        }
    )
    return decoder.generate(prompt_ids=prompt)


def conditional_logits(model: ModelBackend, context: list[tuple[int, int]], target: int) -> torch.Tensor:
    """The verifier's logits at output position ``target`` given clean ``(position, token)`` pairs.

    Computed from scratch: the clean tokens are input rows in the given (generation) order, attending causally
    among themselves. Nemotron reads the next-token prediction of the clean row at ``target - 1`` (which must
    be the last context pair); SetDLM adds one mask row at ``target`` that attends to every clean row.
    """
    positions = [p for p, _ in context]
    tokens = [t for _, t in context]
    if model.family == NEMOTRON:
        assert positions == list(range(len(positions))) and target == len(positions), "Nemotron is left to right"
        rows = len(tokens)
        attention = torch.ones(rows, rows, dtype=torch.bool).tril()
        output = rows - 1
    else:
        rows = len(tokens) + 1
        tokens = [*tokens, model.mask_token_id]
        positions = [*positions, target]
        attention = torch.ones(rows, rows, dtype=torch.bool).tril()
        attention[-1, :-1] = True
        output = rows - 1
    cache = model.new_cache(rows + 1)
    logits = model.forward(
        cache,
        ModelCall(
            torch.tensor(tokens, device=model.device),
            torch.tensor(positions, device=model.device),
            attention.to(model.device),
            torch.tensor([output], device=model.device),
        ),
    )
    return logits[0]
