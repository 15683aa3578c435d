"""adaptive-packed: lossless on real (tiny, random) models; width and fallback behave as documented."""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from specframe_adaptive_packed import AdaptivePackedSchedule

from specframe import compose
from specframe.errors import ConfigError
from specframe.models import load_model
from specframe.models.base import ModelBackend, ModelCall
from specframe.models.cache import KVCache
from specframe.state import Verification
from specframe.testing.models import small_vocabulary, write_random_checkpoint
from specframe.testing.plugins import install_distribution, run_with
from specframe.testing.reference import ar_distribution, goodness_of_fit

PLUGIN = Path(__file__).resolve().parents[1]
NEMOTRON, SETDLM = "nemotron-labs-diffusion", "setdlm"
VOCAB = 24
EOS = VOCAB - 2
OPTIONS = (
    {},
    {"min_width": 1, "patience": 1, "cooldown": 1},
    {"min_width": 3, "patience": 2, "cooldown": 5},
)


# --8<-- [start:tiny-model]
def tiny_model(family: str, folder: Path, *, seed: int) -> ModelBackend:
    """A random float64 model with VOCAB ids: the last is the mask token, the one before it EOS."""
    write_random_checkpoint(family, folder, seed=seed, tokenizer=False, **small_vocabulary(family, VOCAB))
    return load_model(folder, dtype="float64")


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    return {family: tiny_model(family, root / family, seed=1) for family in (NEMOTRON, SETDLM)}


def generate(model, schedule, prompt, length, width):
    decoder = compose({"model": model, "schedule": schedule, "width": width, "max_new_tokens": length})
    return decoder.generate(prompt_ids=prompt)


# --8<-- [end:tiny-model]


# --8<-- [start:exactness]
@pytest.mark.parametrize("family", [NEMOTRON, SETDLM])
@pytest.mark.parametrize("width", [1, 2, 3, 5, 8])
@pytest.mark.parametrize("options", OPTIONS, ids=["defaults", "eager", "patient"])
def test_greedy_output_equals_plain_ar(models, family, width, options):
    rng = random.Random(f"{family}/{width}")
    for _ in range(4):
        prompt = [rng.randrange(EOS) for _ in range(rng.randint(1, 8))]
        length = rng.randint(1, 40)
        reference = generate(models[family], "ar", prompt, length, "auto")  # ar takes no width
        result = generate(models[family], {"name": "adaptive-packed", **options}, prompt, length, width)
        assert result.output_ids == reference.output_ids
        assert result.stop_reason == reference.stop_reason


# --8<-- [end:exactness]


def test_eos_and_stop_sequences_end_the_output_like_ar(models):
    for family in (NEMOTRON, SETDLM):
        model = models[family]
        reference = generate(model, "ar", [3, 5, 7], 30, "auto")
        stop = reference.output_ids[4:6]
        kwargs = {"model": model, "max_new_tokens": 30, "stop": [stop]}
        ar = compose({**kwargs, "schedule": "ar"}).generate(prompt_ids=[3, 5, 7])
        ours = compose({**kwargs, "schedule": "adaptive-packed", "width": 4}).generate(prompt_ids=[3, 5, 7])
        assert ours.output_ids == ar.output_ids
        assert ours.stop_reason == ar.stop_reason == "stop_sequence"


SAMPLING_VOCAB = 6  # ids 0-3 ordinary, 4 EOS, 5 mask
SAMPLING_PROMPT = [0, 1, 2, 3, 1]
SAMPLING_LENGTH = 3


def test_sampling_follows_the_ar_distribution(tmp_path):
    write_random_checkpoint(
        NEMOTRON,
        tmp_path,
        seed=4,
        tokenizer=False,
        vocab_size=SAMPLING_VOCAB,
        mask_token_id=5,
        eos_token_id=4,
        pad_token_id=4,
        bos_token_id=1,
        logit_scale=0.3,  # flatter outputs: many continuations, many accepted drafts
    )
    model = load_model(tmp_path, dtype="float64")
    exact = ar_distribution(model, SAMPLING_PROMPT, SAMPLING_LENGTH)  # temperature 1, as "rejection"
    assert len([p for p in exact.values() if p * 2000 >= 5]) >= 4  # enough outcomes for the test to bite
    schedule = {"name": "adaptive-packed", "min_width": 1, "patience": 1, "cooldown": 1}
    decoder = compose(
        {"model": model, "schedule": schedule, "acceptance": "rejection", "width": 3, "max_new_tokens": 3}
    )
    counts = Counter(tuple(decoder.generate(prompt_ids=SAMPLING_PROMPT, seed=seed).output_ids) for seed in range(2000))
    assert goodness_of_fit(counts, exact) > 1e-4  # seeds are fixed: deterministic


def test_options_are_validated_and_described(models):
    model = models[NEMOTRON]
    with pytest.raises(ConfigError, match="adaptive-packed.*patience must be an integer >= 1"):
        compose({"model": model, "schedule": {"name": "adaptive-packed", "patience": 0}})
    with pytest.raises(ConfigError, match="does not take option"):
        compose({"model": model, "schedule": {"name": "adaptive-packed", "threshold": 0.5}})
    decoder = compose({"model": model, "schedule": {"name": "adaptive-packed", "cooldown": 2}, "width": 8})
    assert decoder.describe()["schedule"] == {
        "name": "adaptive-packed",
        "min_width": 2,
        "patience": 3,
        "cooldown": 2,
    }


def test_the_default_width_runs_it_at_its_declared_width(tmp_path, capsys):
    """No width given (width "auto", the default): it runs at W = 8 and picks each call's width up to that."""
    from specframe.cli import main

    model = tiny_model(NEMOTRON, tmp_path / "model", seed=1)
    config = {"model": model, "schedule": {"name": "adaptive-packed", "min_width": 3}, "max_new_tokens": 12}
    decoder = compose(config)
    assert decoder.describe()["width"] == 8
    prompt = [3, 5, 7, 11]
    assert decoder.generate(prompt_ids=prompt).output_ids == generate(model, "ar", prompt, 12, "auto").output_ids
    args = ["generate", "--model", str(tmp_path / "model"), "--schedule", "adaptive-packed:min_width=3"]
    assert main([*args, "--max-new-tokens", "4", "--prompt-ids", "3,5,7"]) == 0, capsys.readouterr().err


class CountingModel(ModelBackend):
    """A scripted Nemotron-style model: the AR continuation counts up, the drafter is wrong where told.

    A causal row holding token ``t`` predicts ``t + 1`` (mod the mask id) for the next position. A mask row at
    position ``p`` counts on from the visible clean row nearest before it (cached or in the call); when
    ``hard(p)`` holds and that row is not ``p - 1``, it is off by one, so drafts at hard positions fail.
    """

    num_parameters = 1_000  # a scripted stand-in: the thread policy gives it one thread

    family = NEMOTRON

    def __init__(self, hard, vocab_size: int = 50):
        self.hard = hard
        self.name = "counting"
        self.vocab_size = vocab_size
        self.mask_token_id = vocab_size - 1
        self.eos_token_ids = ()
        self.max_positions = 1 << 16
        self.num_layers, self.num_kv_heads, self.head_dim = 1, 1, 2
        self.dtype = torch.float64

    def forward(self, cache: KVCache, call: ModelCall):
        input_ids, position_ids, attention = call.input_ids, call.position_ids, call.attention
        output_rows = call.output_rows
        rows = input_ids.shape[0]
        cache.reserve(rows)
        code = torch.stack([position_ids, input_ids], -1).to(torch.float64).view(rows, 1, 2)
        keys, _ = cache.write(0, code, code)  # the cache remembers (position, token) of committed rows
        cached = [(int(p), int(t)) for p, t in keys[: cache.length, 0].tolist()]
        count = self.vocab_size - 1
        logits = torch.zeros(rows, self.vocab_size, dtype=torch.float64)
        for row in range(rows):
            position, token = int(position_ids[row]), int(input_ids[row])
            if token != self.mask_token_id:
                logits[row, (token + 1) % count] = 1.0
                continue
            visible = cached + [
                (int(position_ids[j]), int(input_ids[j]))
                for j in range(rows)
                if attention[row, j] and int(input_ids[j]) != self.mask_token_id
            ]
            q, t = max(p for p in visible if p[0] < position)
            guess = t + position - q + (1 if self.hard(position) and q < position - 1 else 0)
            logits[row, guess % count] = 1.0
        return logits if output_rows is None else logits[output_rows]


def run_counting(hard, *, width=8, length=120, **options):
    decoder = compose(
        {
            "model": CountingModel(hard),
            "schedule": {"name": "adaptive-packed", **options},
            "width": width,
            "max_new_tokens": length,
        }
    )
    result = decoder.generate(prompt_ids=[0, 1, 2])
    assert result.output_ids == [(3 + i) % 49 for i in range(length)]  # the AR continuation, exactly
    return result.metrics


def test_easy_drafts_keep_the_full_width():
    metrics = run_counting(lambda position: False, width=8)
    steady = metrics.rows_per_call[2:]
    assert steady and max(steady) == 2 * (8 + 1)  # a Packed-SS call of width W on Nemotron
    assert metrics.tokens_per_nfe > 3


def test_short_accepted_runs_shrink_the_width():
    # Every third position is wrong: runs of at most three tokens, so the width settles at 2 * 3 = 6.
    metrics = run_counting(lambda position: position % 3 == 0, width=12)
    steady = metrics.rows_per_call[6:]
    assert max(steady) <= 2 * (6 + 1) < 2 * (12 + 1)
    assert metrics.accepted_tokens > 0


def test_failing_drafts_fall_back_to_ar_calls_and_probe_again():
    metrics = run_counting(lambda position: True, width=8, patience=2, cooldown=5)
    rows = metrics.rows_per_call
    runs, current = [], 0
    for count in rows[1:]:
        if count == 1:  # a plain AR call on Nemotron: the pending token's causal row only
            current += 1
        else:
            runs.append(current)
            current = 0
    runs.append(current)
    assert max(runs) == 5  # cooldown AR calls, then one drafting call to probe
    assert sum(rows[1:]) < 0.4 * 2 * (8 + 1) * (len(rows) - 1)  # far below Packed-SS's rows
    assert metrics.accepted_tokens == 0


def test_drafting_resumes_when_drafts_pay_again():
    metrics = run_counting(lambda position: 20 <= position < 60, width=8, patience=2, cooldown=4, length=150)
    assert 1 in metrics.rows_per_call  # it fell back inside the hard stretch ...
    assert metrics.rows_per_call[-5:-1] == [18] * 4  # ... and drafts at full width after it


def test_the_drafting_decision_reads_recent_verifications():
    schedule = AdaptivePackedSchedule(min_width=2, patience=2, cooldown=3)
    state = SimpleNamespace(drafts={}, verifications=[])
    assert schedule.drafting(state)  # nothing checked yet
    state.verifications = [Verification(4, 0, 1), Verification(3, 0, 1)]
    assert not schedule.drafting(state)  # two failures in a row: AR calls
    state.verifications += [Verification(0, 0, 1)] * 3
    assert schedule.drafting(state)  # cooldown over: probe
    state.drafts = {9: object()}
    assert not schedule.drafting(state)  # the probe's draft is checked before drafting more
    state.drafts = {}
    state.verifications = [Verification(4, 2, 3), Verification(3, 0, 1)]
    assert schedule.drafting(state)  # one failure is not enough
    state.verifications = [Verification(4, 0, 1), Verification(0, 0, 1), Verification(3, 0, 1)]
    assert not schedule.drafting(state)  # calls without a draft between failures do not reset them


def test_the_width_follows_the_longest_recent_run():
    schedule = AdaptivePackedSchedule(min_width=3)
    state = SimpleNamespace(ctx=SimpleNamespace(width=10), verifications=[])
    assert schedule.draft_width(state) == 10  # nothing checked yet: W
    state.verifications = [Verification(5, 4, 5), *[Verification(3, 0, 1)] * 4]
    assert schedule.draft_width(state) == 3  # the run of 5 is older than the last four checked drafts
    state.verifications.append(Verification(3, 1, 2))
    assert schedule.draft_width(state) == 4
    state.verifications.append(Verification(9, 9, 10))
    assert schedule.draft_width(state) == 10  # never wider than W


def test_installed_distribution_is_found_by_entry_point(tmp_path):
    site = install_distribution(PLUGIN, tmp_path / "site")
    result = run_with(site, ["-m", "specframe.cli", "plugins"], load="specframe-adaptive-packed")
    assert result.returncode == 0, result.stderr
    entry = next(e for e in json.loads(result.stdout) if e["name"] == "adaptive-packed")
    assert entry["kind"] == "schedule" and entry["plugin"] == "adaptive_packed"
    assert entry["distribution"] == "specframe-adaptive-packed" and entry["exact"] is True
