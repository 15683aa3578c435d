"""The models shipped in specframe/assets/models, as training measures them: held-out quality, lossless decoding
of held-out code with drafts that get accepted, and the distilled drafter.

Their layout and loading are checked by specframe's own tests (tests/models/test_bundled_assets.py).
"""

from __future__ import annotations

import json

import pytest
import torch
from specframe_training.evaluate import heldout_perplexity, heldout_prompts, heldout_windows
from specframe_training.trainer import BUNDLED

from specframe import compose
from specframe.models import load_model
from specframe.models.hub import DEFAULT_MODEL, bundled_model
from specframe.testing.models import NEMOTRON, SETDLM

# Held-out next-token perplexity bounds (4 windows of 128 tokens). The shipped models measure about 30
# (Nemotron-style) and 62 (SetDLM-style) on these windows; their weights shuffled within each tensor measure
# in the thousands, a random model near the vocabulary size (2048).
PPL_BOUND = {NEMOTRON: 45.0, SETDLM: 90.0}
FAMILIES = (NEMOTRON, SETDLM)
SCHEDULES = ("linear", "quadratic", "packed")


@pytest.fixture(scope="module")
def models():
    return {family: load_model(bundled_model(BUNDLED[family])) for family in FAMILIES}


@pytest.fixture(scope="module")
def exact_models():
    return {family: load_model(bundled_model(BUNDLED[family]), dtype="float64") for family in FAMILIES}


@pytest.fixture(scope="module")
def windows(models):
    return {family: heldout_windows(model, 128, 4) for family, model in models.items()}


def test_the_nemotron_run_ships_the_default_model():
    assert BUNDLED[NEMOTRON] == DEFAULT_MODEL


@pytest.mark.parametrize("family", FAMILIES)
def test_heldout_perplexity_bound(models, windows, family):
    model = models[family]
    ppl = heldout_perplexity(model, windows[family])
    assert ppl < PPL_BOUND[family]
    # the bound is not vacuous: the same weights shuffled within each tensor miss it by far
    saved = {name: p.detach().clone() for name, p in model.network.named_parameters()}
    generator = torch.Generator().manual_seed(0)
    try:
        with torch.no_grad():
            for p in model.network.parameters():
                flat = p.view(-1)
                flat.copy_(flat[torch.randperm(flat.numel(), generator=generator)])
        assert heldout_perplexity(model, windows[family]) > 10 * PPL_BOUND[family]
    finally:
        with torch.no_grad():
            for name, p in model.network.named_parameters():
                p.copy_(saved[name])


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("schedule", SCHEDULES)
def test_greedy_speculative_equals_ar(exact_models, family, schedule):
    model = exact_models[family]
    for prompt in heldout_prompts(2, context_chars=200):
        reference = compose({"model": model, "schedule": "ar", "max_new_tokens": 24}).generate(prompt.text)
        for width in (4, 8):
            decoder = compose({"model": model, "schedule": schedule, "width": width, "max_new_tokens": 24})
            result = decoder.generate(prompt.text)
            assert result.output_ids == reference.output_ids
            assert result.metrics.accepted_tokens > 0  # trained drafts do get accepted


def test_the_default_model_ships_a_distilled_drafter(models):
    # The shipped Nemotron-style model went through drafter self-distillation; undistilled it reached about
    # 2.3 tokens per verification (Linear-SS) and 1.4 tokens per NFE (Packed-SS) at W = 8 on held-out code.
    from specframe_training.evaluate import acceptance

    config = json.loads((bundled_model() / "config.json").read_text(encoding="utf-8"))
    assert config["model_type"] == "nemotron_labs_diffusion"
    prompts = heldout_prompts(8)
    linear = acceptance(models[NEMOTRON], "linear", 8, prompts, 64)
    packed = acceptance(models[NEMOTRON], "packed", 8, prompts, 64)
    assert linear.to_dict()["tokens_per_verification"] > 2.4
    assert packed.to_dict()["tokens_per_nfe"] > 1.55
