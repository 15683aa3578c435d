"""Drafter training for a converted model: greedy data, block layout, the run, and the declared drafter."""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict, fields
from pathlib import Path

import pytest
import torch
from specframe_training.drafter import DrafterConfig, batched_greedy, block_batch, train_drafter
from specframe_training.forward import TrainingForward

from decoding_helpers import eos_ids
from specframe import compose
from specframe.errors import CheckpointError, ConfigError
from specframe.models import load_model
from specframe.models.loading import attach_drafter

TEXTS = ("Hi", "What is gravity?", "Write a short paragraph about the ocean and the moon, please.")


def ar_output(model, prompt, length):
    return compose({"model": model, "schedule": "ar", "max_new_tokens": length}).generate(prompt_ids=prompt).output_ids


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_batched_greedy_is_the_decoders_ar_output(converted, dtype):
    model = load_model(converted, dtype=dtype)
    prompts = [model.tokenizer.encode(text) for text in TEXTS]
    assert len({len(p) for p in prompts}) == 3, "the prompts must need different amounts of left padding"
    forward = TrainingForward(model.network, dtype=dtype)
    got = batched_greedy(forward, prompts, 10, set(), autocast=False)
    expected = [ar_output(model, prompt, 10) for prompt in prompts]
    assert got == expected
    assert len({tuple(e) for e in expected}) > 1, "distinct prompts should continue differently"
    # A batch of one (no padding) agrees too: padding changes nothing.
    assert batched_greedy(forward, prompts[:1], 10, set(), autocast=False) == expected[:1]
    # An end token stops that sequence only (it is kept, as the decoder keeps it).
    stop = expected[1][4]
    with eos_ids(model, (stop,)):
        stopped = [ar_output(model, prompt, 10) for prompt in prompts]
    assert stopped[1][-1] == stop and len(stopped[1]) <= 5
    assert batched_greedy(forward, prompts, 10, {stop}, autocast=False) == stopped


def check_block_layout(windows, config, mask_id, batch):
    size = len(windows)
    longest = max(len(t) for t, _ in windows)
    rows = batch.query.shape[1]
    assert batch.clean.shape == (size, longest) and batch.clean_mask.shape == (size, longest, longest)
    assert batch.query_mask.shape == (size, rows, longest + rows)
    kinds = {"seed": 0, "seedless": 0}
    for b, (tokens, prompt) in enumerate(windows):
        n = len(tokens)
        assert batch.clean[b, :n].tolist() == tokens and not batch.clean[b, n:].any()
        causal = torch.ones(longest, longest, dtype=torch.bool).tril()
        causal[:, n:] = False
        causal |= torch.eye(longest, dtype=torch.bool)
        assert torch.equal(batch.clean_mask[b], causal)
        query, position = batch.query[b].tolist(), batch.query_positions[b].tolist()
        target, offset = batch.targets[b].tolist(), batch.offsets[b].tolist()
        real = [offset[r] > 0 or query[r] != mask_id or target[r] != -100 for r in range(rows)]
        used = max(r for r in range(rows) if real[r]) + 1
        assert all(real[:used]), "padding rows come after every block row"
        blocks, members = [], []  # per row: its block's index; per block: its rows
        for r in range(used):
            if offset[r] == 0:
                members.append([])
            members[-1].append(r)
            blocks.append(len(members) - 1)
        assert len(members) == config.blocks
        for rows_of_block in members:
            first = rows_of_block[0]
            start = position[first]
            assert 1 <= len(rows_of_block) <= config.max_width + 1
            assert [position[r] for r in rows_of_block] == list(range(start, start + len(rows_of_block)))
            assert [offset[r] for r in rows_of_block] == list(range(len(rows_of_block)))
            assert prompt - 1 <= start and start + len(rows_of_block) <= n
            if query[first] == mask_id:  # seedless: the first row drafts the token at the block's start
                kinds["seedless"] += 1
                assert start >= prompt and target[first] == tokens[start]
            else:  # the seed is the clean token, no target
                kinds["seed"] += 1
                assert query[first] == tokens[start] and target[first] == -100
            for r in rows_of_block[1:]:
                assert query[r] == mask_id and target[r] == tokens[position[r]]
            for r in rows_of_block:
                sees = batch.query_mask[b, r]
                assert sees[:longest].tolist() == [c < start for c in range(longest)], "clean rows before the block"
                assert sees[longest:].nonzero().flatten().tolist() == rows_of_block, "its own block, nothing else"
        for r in range(used, rows):
            assert target[r] == -100 and offset[r] == 0
            sees = batch.query_mask[b, r]
            assert sees.nonzero().flatten().tolist() == [longest + r], "a padding row sees only itself"
    return kinds


def test_block_batch_layout():
    config = DrafterConfig(blocks=6, max_width=4, seedless_prob=0.5)
    mask_id = 99
    data = torch.Generator().manual_seed(5)
    kinds = {"seed": 0, "seedless": 0}
    for trial in range(12):
        windows = []
        for _ in range(3):
            prompt = int(torch.randint(1, 6, (1,), generator=data))
            length = prompt + int(torch.randint(2, 12, (1,), generator=data))
            windows.append((torch.randint(0, mask_id, (length,), generator=data).tolist(), prompt))
        batch = block_batch(windows, config, mask_id, torch.Generator().manual_seed(trial))
        for kind, count in check_block_layout(windows, config, mask_id, batch).items():
            kinds[kind] += count
    assert kinds["seed"] > 0 and kinds["seedless"] > 0


RUN = {
    "prompts": 40,
    "held_out": 8,
    "new_tokens": 16,
    "max_prompt_tokens": 96,
    "steps": 40,
    "batch_size": 4,
    "blocks": 8,
    "lr": 3e-3,
    "warmup": 4,
    "eval_every": 20,
    "save_every": 20,
    "bf16": False,
    "gen_batch": 12,
}


@pytest.fixture(scope="module")
def drafter_run(converted, tmp_path_factory):
    work = tmp_path_factory.mktemp("drafter-run")
    lines = []
    summary = train_drafter(converted, work, DrafterConfig(**RUN), threads=1, log=lines.append)
    return work, summary


def test_training_lowers_the_held_out_drafting_loss(drafter_run):
    work, summary = drafter_run
    assert summary["steps"] == 40 and summary["held_out_sequences"] == 8
    assert summary["first"]["step"] == 0 and summary["last"]["step"] == 40
    assert summary["last"]["loss"] < summary["first"]["loss"]
    for name in ("data.pt", "state.pt", "log.jsonl", "summary.json", "adapter/adapter_model.safetensors"):
        assert (work / name).is_file(), name
    data = torch.load(work / "data.pt", weights_only=False)
    assert len(data["held_out"]) == 8 and len(data["train"]) >= 20
    assert all(len(tokens) - prompt >= 2 for tokens, prompt in data["train"] + data["held_out"])


def test_a_run_resumes_and_refuses_other_settings(drafter_run, converted, tmp_path):
    work = tmp_path / "run"
    shutil.copytree(drafter_run[0], work)
    lines = []
    summary = train_drafter(converted, work, DrafterConfig(**{**RUN, "steps": 45}), threads=1, log=lines.append)
    assert "resumed at step 40" in lines
    assert not any("self-distilled data" in line for line in lines), "data.pt is reused"
    assert summary["steps"] == 45 and summary["first"]["step"] == 0 and summary["last"]["step"] == 45
    assert torch.load(work / "state.pt", weights_only=False)["step"] == 45
    steps = [json.loads(line)["step"] for line in (work / "log.jsonl").read_text().splitlines()]
    assert steps == [0, 20, 40, 45]
    with pytest.raises(ConfigError, match="rank"):
        train_drafter(converted, work, DrafterConfig(**{**RUN, "rank": 4}), threads=1, log=lines.append)


def test_the_trained_adapter_keeps_every_schedule_exact(drafter_run, converted):
    model = load_model(converted, dtype="float64", adapter=drafter_run[0] / "adapter")
    assert model.has_adapter
    prompt = model.tokenizer.encode(TEXTS[1])
    expected = ar_output(model, prompt, 14)
    for schedule, width in (("packed", 4), ("linear", 3), ("quadratic", 2)):
        config = {"model": model, "schedule": schedule, "width": width, "max_new_tokens": 14}
        assert compose(config).generate(prompt_ids=prompt).output_ids == expected, schedule
    sampled = {"model": model, "schedule": "packed", "width": 4, "max_new_tokens": 14, "seed": 11}
    sampled["acceptance"] = {"name": "rejection", "temperature": 1.0}
    first = compose(sampled).generate(prompt_ids=prompt).output_ids
    assert compose(sampled).generate(prompt_ids=prompt).output_ids == first and len(first) == 14


def test_a_declared_drafter_loads_by_default(drafter_run, converted, tmp_path):
    folder = tmp_path / "model"
    shutil.copytree(converted, folder)
    assert not load_model(folder).has_adapter
    attach_drafter(drafter_run[0] / "adapter", folder)
    assert json.loads((folder / "config.json").read_text())["specframe_drafter"] == "linear_spec_lora"
    assert (folder / "linear_spec_lora" / "adapter_config.json").is_file()
    assert load_model(folder).has_adapter
    assert not load_model(folder, adapter=False).has_adapter
    shutil.rmtree(folder / "linear_spec_lora")
    with pytest.raises(CheckpointError, match="linear_spec_lora"):
        load_model(folder)
    assert not load_model(folder, adapter=False).has_adapter
    config = json.loads((folder / "config.json").read_text())
    for bad in ("../x", "/tmp", ".", ""):
        (folder / "config.json").write_text(json.dumps({**config, "specframe_drafter": bad}))
        with pytest.raises(CheckpointError, match="specframe_drafter"):
            load_model(folder)


def test_train_drafter_cli_attaches_the_adapter(drafter_run, converted, tmp_path, capsys):
    from specframe.cli import main

    folder, work = tmp_path / "model", tmp_path / "run"
    shutil.copytree(converted, folder)
    shutil.copytree(drafter_run[0], work)
    recorded = json.loads((work / "settings.json").read_text())  # the run, as if made on this copy of the model
    (work / "settings.json").write_text(json.dumps({**recorded, "model": str(folder.resolve())}))
    settings = [f"--set={key}={json.dumps(value)}" for key, value in RUN.items() if key != "steps"]
    assert main(["train-drafter", str(folder), "--work-dir", str(work), "--steps", "40", *settings, "--attach"]) == 0
    assert "attached the drafter" in capsys.readouterr().out
    assert load_model(folder).has_adapter
    assert main(["train-drafter", str(folder), "--work-dir", str(work), "--set", "nope=1"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "nope" in err
    assert main(["train-drafter", str(folder), "--work-dir", str(work), "--steps", "40"]) == 1
    assert "other settings" in capsys.readouterr().err


def test_alpha_follows_the_rank_unless_given():
    assert DrafterConfig().alpha == 128.0  # rank 64: the shipped drafter's settings
    assert DrafterConfig(rank=8).alpha == 16.0  # the update's scale alpha / rank stays 2
    assert DrafterConfig(rank=8, alpha=4).alpha == 4
    with pytest.raises(ConfigError, match="alpha must be a number > 0"):
        DrafterConfig(alpha=0)


def test_other_settings_in_a_run_folder_name_both_values_and_both_ways_on(tmp_path):
    work = tmp_path / "run"
    work.mkdir()
    model = tmp_path / "model"
    stored = {"model": str(model.resolve()), **asdict(DrafterConfig(rank=16))}
    (work / "settings.json").write_text(json.dumps(stored))
    with pytest.raises(ConfigError) as info:  # refused before the model is read
        train_drafter(model, work, DrafterConfig(rank=8), threads=1, log=lambda line: None)
    message = str(info.value)
    assert "stored: alpha=32.0, rank=16; given: alpha=16.0, rank=8" in message
    assert "to resume that run, give what it stored (--set alpha=32.0, --set rank=16)" in message
    assert "to train with the new settings, use a new --work-dir" in message


@pytest.fixture
def model_folder(tmp_path):
    """A folder that passes the command's first check (a config.json); nothing loads it in these tests."""
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    return folder


def test_an_interrupted_run_says_how_to_resume_it(model_folder, tmp_path, monkeypatch, capsys):
    from specframe_training import drafter

    from specframe.cli import main

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(drafter, "train_drafter", interrupted)
    work = tmp_path / "run"
    assert main(["train-drafter", str(model_folder), "--work-dir", str(work)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: interrupted; {work} keeps the run") and err.count("\n") == 1
    assert "run the same command again to resume it" in err


def test_a_work_dir_that_is_a_file_is_refused_clearly(model_folder, tmp_path, capsys):
    from specframe.cli import main

    work = tmp_path / "run.txt"
    work.write_text("mine")
    assert main(["train-drafter", str(model_folder), "--work-dir", str(work)]) == 1
    err = capsys.readouterr().err
    assert f"--work-dir {work} is an existing file, not a folder" in err and "internal error" not in err
    assert work.read_text() == "mine"


def test_every_setting_is_documented_with_its_default():
    page = Path(__file__).resolve().parents[3] / "docs" / "models" / "bring-your-own.md"
    rows = {line.split("|")[1].strip(" `"): line for line in page.read_text().splitlines() if line.startswith("| `")}
    for setting in fields(DrafterConfig):
        assert setting.name in rows, f"drafter setting {setting.name} is not in the settings table of {page.name}"
