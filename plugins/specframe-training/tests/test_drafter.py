"""Drafter training for a converted model: greedy data, block layout, the run, and the declared drafter."""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict, fields
from pathlib import Path

import pytest
import torch
from specframe_training.drafter import (
    DrafterConfig,
    attach_trainable_lora,
    batched_greedy,
    block_batch,
    offset_agreement,
    start_from_adapter,
    train_drafter,
)
from specframe_training.forward import TrainingForward

from decoding_helpers import eos_ids
from specframe import compose
from specframe.errors import CheckpointError, ConfigError
from specframe.models import load_model
from specframe.models.loading import attach_drafter
from specframe.models.lora import read_acceptance

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
    # the last evaluation's agreement by offset rides with the adapter, as width auto's prior when it loads
    measured = read_acceptance(work / "adapter")
    last = summary["last"]["agreement"]
    assert measured == tuple(round(last[str(d)], 4) for d in range(1, len(last) + 1))
    assert all(len(tokens) - prompt >= 2 for tokens, prompt in data["train"] + data["held_out"])


def test_a_run_resumes_and_refuses_other_settings(drafter_run, converted, tmp_path):
    work = tmp_path / "run"
    shutil.copytree(drafter_run[0], work)
    lines = []
    resumed = DrafterConfig(**{**RUN, "steps": 45, "fit_eval": 0})  # how it evaluates may change
    summary = train_drafter(converted, work, resumed, threads=1, log=lines.append)
    assert "resumed at step 40" in lines
    assert not any("self-distilled data" in line for line in lines), "data.pt is reused"
    assert summary["steps"] == 45 and summary["first"]["step"] == 0 and summary["last"]["step"] == 45
    assert torch.load(work / "state.pt", weights_only=False)["step"] == 45
    steps = [json.loads(line)["step"] for line in (work / "log.jsonl").read_text().splitlines()]
    assert steps == [0, 20, 40, 45]
    with pytest.raises(ConfigError, match="rank"):
        train_drafter(converted, work, DrafterConfig(**{**RUN, "rank": 4}), threads=1, log=lines.append)


def test_each_evaluation_also_measures_the_fit_on_training_continuations(drafter_run, converted, tmp_path):
    work, summary = drafter_run
    entries = [json.loads(line) for line in (work / "log.jsonl").read_text().splitlines()]
    data = torch.load(work / "data.pt", weights_only=False)
    assert all(set(e["fit"]["agreement"]) == set(e["agreement"]) for e in entries)
    assert summary["last"]["fit"] == entries[-1]["fit"]
    # the fit is measured on the training continuations (the first fit_eval of them), not the held-out ones
    model, config = load_model(converted, dtype="float32"), DrafterConfig(**RUN)
    attach_trainable_lora(model.network, config.rank, config.alpha, torch.Generator().manual_seed(0))
    start_from_adapter(model.network, work / "adapter", config)
    forward = TrainingForward(model.network)
    with torch.no_grad():
        again = offset_agreement(forward, data["train"][: config.fit_eval], config, model.mask_token_id)
    assert again["agreement"] == entries[-1]["fit"]["agreement"]
    assert entries[-1]["fit"] != {k: entries[-1][k] for k in ("loss", "agreement")}
    # evaluating the fit changes nothing the run trains: the same adapter, bit for bit, without it
    other = tmp_path / "no-fit"
    other.mkdir()
    shutil.copy(work / "data.pt", other / "data.pt")
    train_drafter(converted, other, DrafterConfig(**{**RUN, "fit_eval": 0}), threads=1, log=lambda _: None)
    assert all("fit" not in json.loads(line) for line in (other / "log.jsonl").read_text().splitlines())
    trained = torch.load(work / "state.pt", weights_only=False)["adapter"]
    without = torch.load(other / "state.pt", weights_only=False)["adapter"]
    assert all(torch.equal(a, b) for a, b in zip(trained, without, strict=True))


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


def objective_batch(converted, config):
    model = load_model(converted, dtype="float32")
    forward = TrainingForward(model.network)
    tokens = model.tokenizer.encode(TEXTS[2])
    windows = [(tokens, 3), (tokens[:12], 2)]
    batch = block_batch(windows, config, model.mask_token_id, torch.Generator().manual_seed(3))
    return model, forward, batch


def test_the_teacher_logits_are_the_base_models_next_token_logits(converted):
    from specframe_training.drafter import block_logits

    config = DrafterConfig(**{**RUN, "bf16": False})
    model, forward, batch = objective_batch(converted, config)
    _, base = block_logits(forward, batch, autocast=False)
    rows = batch.targets != -100
    owners = torch.arange(2)[:, None].expand_as(rows)[rows]
    for n, (b, position) in enumerate(zip(owners.tolist(), batch.query_positions[rows].tolist(), strict=True)):
        prefix = batch.clean[b, :position][None]
        with torch.no_grad():
            causal = torch.ones(position, position, dtype=torch.bool).tril()[None]
            expected = model.network.logits(forward.hidden(prefix, torch.arange(position)[None], causal)[:, -1])
        torch.testing.assert_close(base[n], expected[0].float(), rtol=1e-4, atol=1e-4)


def test_the_loss_weighs_offsets_and_mixes_the_teachers_distribution(converted):
    from specframe_training.drafter import block_logits, drafting_loss

    config = DrafterConfig(**{**RUN, "bf16": False})
    _, forward, batch = objective_batch(converted, config)
    logits, base = block_logits(forward, batch, autocast=False)
    rows = batch.targets != -100
    targets, near = batch.targets[rows], batch.offsets[rows] <= 1
    assert near.any() and (~near).any()
    ce = torch.nn.functional.cross_entropy(logits, targets, reduction="none")
    teacher = base.log_softmax(-1)
    kl = (teacher.exp() * (teacher - logits.log_softmax(-1))).sum(-1)
    for near_weight, distill in ((1.0, 0.0), (0.35, 0.0), (0.0, 1.0), (0.35, 0.5)):
        settings = DrafterConfig(**{**RUN, "near_weight": near_weight, "distill": distill})
        weights = torch.where(near, torch.tensor(near_weight), torch.tensor(1.0))
        expected = (((1 - distill) * ce + distill * kl) * weights).sum() / weights.sum()
        torch.testing.assert_close(drafting_loss(logits, base, batch, settings), expected)
    # the plain setting is the mean cross-entropy; a teacher equal to the student leaves only its entropy out
    plain = DrafterConfig(**{**RUN, "near_weight": 1.0, "distill": 0.0})
    torch.testing.assert_close(drafting_loss(logits, base, batch, plain), ce.mean())
    pure_kl = DrafterConfig(**{**RUN, "near_weight": 1.0, "distill": 1.0})
    assert float(drafting_loss(logits, logits, batch, pure_kl)) == pytest.approx(0.0, abs=1e-5)


def test_a_run_stops_when_its_curve_flattens(tmp_path):
    from specframe_training.drafter import flattened

    log = tmp_path / "log.jsonl"

    def write(means):
        log.write_text("".join(json.dumps({"agreement": {"1": 0.9, "2": m, "3": m, "4": m}}) + "\n" for m in means))

    write([0.1, 0.2, 0.3])
    assert not flattened(log, 2) and not flattened(log, 0)
    write([0.1, 0.3, 0.301, 0.302])
    assert flattened(log, 2) and not flattened(log, 3)
    write([0.1, 0.3, 0.301, 0.31])
    assert not flattened(log, 2)
    assert not flattened(tmp_path / "missing.jsonl", 2)


def test_a_run_starts_from_a_saved_adapter(drafter_run, converted, tmp_path):
    saved = drafter_run[0] / "adapter"
    lines = []
    config = DrafterConfig(**{**RUN, "steps": 1, "eval_every": 1, "alpha": 8.0, "init_from": str(saved)})
    summary = train_drafter(converted, tmp_path / "warm", config, threads=1, log=lines.append)
    # before its first step the warm run drafts as the saved adapter (bfloat16 on disk) did at the end of its run
    cold = drafter_run[1]
    assert abs(summary["first"]["loss"] - cold["last"]["loss"]) < 0.05 * (cold["first"]["loss"] - cold["last"]["loss"])
    for bad, message in ((tmp_path, "adapter_config.json"), (saved.parent / "data.pt", "adapter")):
        with pytest.raises(ConfigError, match=message):
            train_drafter(
                converted, tmp_path / f"bad-{bad.name}", DrafterConfig(**{**RUN, "init_from": str(bad)}), threads=1
            )
    rank = json.loads((saved / "adapter_config.json").read_text())["r"]
    with pytest.raises(ConfigError, match=f"rank {rank}; give --set rank={rank}"):
        train_drafter(converted, tmp_path / "rank", DrafterConfig(**{**RUN, "rank": 3, "init_from": str(saved)}))


def test_a_folder_from_before_the_new_settings_resumes_with_what_it_trained_with(drafter_run, converted, tmp_path):
    work = tmp_path / "old"
    shutil.copytree(drafter_run[0], work)
    stored = json.loads((work / "settings.json").read_text())
    for key in ("near_weight", "distill", "init_from", "patience", "mlp_rank", "mlp_alpha"):
        stored.pop(key)
    (work / "settings.json").write_text(json.dumps(stored))
    old = {**RUN, "near_weight": 1.0, "distill": 0.0}
    assert train_drafter(converted, work, DrafterConfig(**old), threads=1, log=lambda _: None)["steps"] == 40
    with pytest.raises(ConfigError, match="distill"):
        train_drafter(converted, work, DrafterConfig(**{**old, "distill": 0.5}), threads=1)


@pytest.mark.parametrize(
    ("setting", "value"),
    [("near_weight", 1.5), ("distill", -0.1), ("patience", -1), ("init_from", 3), ("mlp_rank", -1), ("fit_eval", -1)]
    + [("mlp_rank", 1.5), ("mlp_alpha", 4.0)],
)
def test_bad_objective_settings_are_refused(setting, value):
    with pytest.raises(ConfigError, match=setting):
        DrafterConfig(**{setting: value})


def test_the_device_flag_names_what_is_wrong(monkeypatch):
    from specframe_training.drafter_cli import training_device

    assert training_device("cpu") == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert training_device(None) == torch.device("cpu")  # no GPU: the CPU, said nowhere as an error
    with pytest.raises(ConfigError, match="no CUDA GPU.*use --device cpu"):
        training_device("cuda")
    with pytest.raises(ConfigError, match="is not a device"):
        training_device("gpu0")
    with pytest.raises(ConfigError, match="runs on cpu or cuda"):
        training_device("meta")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert training_device(None) == torch.device("cuda")  # a GPU present is used by default
    with pytest.raises(ConfigError, match="has 1 GPU"):
        training_device("cuda:3")


def test_a_run_keeps_its_state_on_the_cpu_so_it_resumes_on_any_device(drafter_run):
    state = torch.load(drafter_run[0] / "state.pt", weights_only=False)
    assert all(t.device.type == "cpu" for t in state["adapter"])


# -- the MLP adapter (mlp_rank) -----------------------------------------------------------------------------
def test_mlp_alpha_follows_mlp_rank_and_needs_it():
    assert DrafterConfig().mlp_rank == 0 and DrafterConfig().mlp_alpha is None  # no MLP adapter by default
    assert DrafterConfig(mlp_rank=16).mlp_alpha == 32.0
    assert DrafterConfig(mlp_rank=16, mlp_alpha=8).mlp_alpha == 8
    with pytest.raises(ConfigError, match="mlp_alpha=4.0 needs an MLP adapter: give --set mlp_rank=N"):
        DrafterConfig(mlp_alpha=4.0)
    with pytest.raises(ConfigError, match="mlp_alpha must be a number > 0"):
        DrafterConfig(mlp_rank=4, mlp_alpha=-1)


def test_the_mlp_adapter_trains_on_the_block_rows_only(converted):
    from specframe_training.drafter import attach_trainable_lora, block_logits, drafting_loss

    config = DrafterConfig(**{**RUN, "rank": 4, "mlp_rank": 3})
    model, forward, batch = objective_batch(converted, config)
    _, base_before = block_logits(forward, batch, autocast=False)
    generator = torch.Generator().manual_seed(0)
    trainable = attach_trainable_lora(model.network, 4, 8.0, generator, 3, 6.0, torch.Generator().manual_seed(1))
    layers = model.network.body.layers
    assert len(trainable) == 4 * len(layers) and all(p.requires_grad for p in trainable)
    assert [tuple(layer.mlp.down_lora.lora_A.shape) for layer in layers][0] == (3, layers[0].mlp.down_proj.in_features)
    assert layers[0].mlp.down_lora.scale == 2.0 and not any(layer.mlp.down_lora.lora_B.any() for layer in layers)
    logits, base = block_logits(forward, batch, autocast=False)
    assert torch.equal(base, base_before)  # the teacher (clean rows) runs no adapter
    drafting_loss(logits, base, batch, config).backward()
    for layer in layers:  # B starts at zero, so its gradient is the first to move
        assert layer.mlp.down_lora.lora_B.grad.abs().sum() > 0 and layer.self_attn.o_lora.lora_B.grad.abs().sum() > 0
    assert not any(p.requires_grad for p in model.network.parameters() if all(p is not t for t in trainable))
    # the same o_proj draws as a run without an MLP adapter: its own generator draws the MLP's A
    again = attach_trainable_lora(model.network, 4, 8.0, torch.Generator().manual_seed(0))
    assert torch.equal(again[0], trainable[0]) and all(layer.mlp.down_lora is None for layer in layers)


def test_write_adapter_round_trips_both_modules(converted, tmp_path):
    from specframe_training.drafter import attach_trainable_lora, write_adapter

    config = DrafterConfig(rank=4, mlp_rank=3, mlp_alpha=9.0)
    model = load_model(converted, dtype="float32")
    trainable = attach_trainable_lora(model.network, 4, config.alpha, torch.Generator().manual_seed(0), 3, 9.0)
    with torch.no_grad():
        for parameter in trainable:
            parameter.normal_(generator=torch.Generator().manual_seed(parameter.numel()))
    write_adapter(model.network, tmp_path / "adapter", config, "tiny")
    settings = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert settings["target_modules"] == ["o_proj", "down_proj"] and (settings["r"], settings["lora_alpha"]) == (4, 8.0)
    assert settings["rank_pattern"] == {"down_proj": 3} and settings["alpha_pattern"] == {"down_proj": 9.0}
    loaded = load_model(converted, dtype="float32", adapter=tmp_path / "adapter")
    for trained, read in zip(model.network.body.layers, loaded.network.body.layers, strict=True):
        for block, attribute in (("self_attn", "o_lora"), ("mlp", "down_lora")):
            mine, theirs = getattr(getattr(trained, block), attribute), getattr(getattr(read, block), attribute)
            assert theirs.scale == mine.scale
            for half in ("lora_A", "lora_B"):  # saved in bfloat16
                assert torch.equal(getattr(theirs, half), getattr(mine, half).detach().bfloat16().float())
    write_adapter(model.network, tmp_path / "attention", DrafterConfig(rank=4), "tiny")  # no MLP adapter: as before
    settings = json.loads((tmp_path / "attention" / "adapter_config.json").read_text())
    assert settings["target_modules"] == ["o_proj"] and "rank_pattern" not in settings


@pytest.fixture(scope="module")
def mlp_run(drafter_run, converted, tmp_path_factory):
    """Three steps with an MLP adapter, started from the o_proj-only adapter of ``drafter_run`` (its data reused)."""
    work = tmp_path_factory.mktemp("mlp-run")
    shutil.copy(drafter_run[0] / "data.pt", work / "data.pt")
    settings = {**RUN, "steps": 3, "eval_every": 3, "mlp_rank": 4, "init_from": str(drafter_run[0] / "adapter")}
    summary = train_drafter(converted, work, DrafterConfig(**settings), threads=1, log=lambda _: None)
    return work, summary


def test_a_run_with_an_mlp_adapter_continues_an_o_proj_only_one(drafter_run, mlp_run, converted):
    work, summary = mlp_run
    assert summary["steps"] == 3 and summary["config"]["mlp_alpha"] == 8.0
    # the fresh MLP adapter changes nothing before the first step: the run drafts as the saved adapter did
    cold = drafter_run[1]
    assert abs(summary["first"]["loss"] - cold["last"]["loss"]) < 0.05 * (cold["first"]["loss"] - cold["last"]["loss"])
    model = load_model(converted, dtype="float32", adapter=work / "adapter")
    assert all(layer.mlp.down_lora is not None for layer in model.network.body.layers)
    assert any(layer.mlp.down_lora.lora_B.any() for layer in model.network.body.layers)  # it trained
    prompt = model.tokenizer.encode(TEXTS[1])
    expected = ar_output(model, prompt, 12)
    config = {"model": model, "schedule": "packed", "width": 3, "max_new_tokens": 12}
    assert compose(config).generate(prompt_ids=prompt).output_ids == expected


def test_a_run_starts_from_a_saved_mlp_adapter_of_its_rank_only(mlp_run, converted, tmp_path):
    saved = str(mlp_run[0] / "adapter")

    def train(name, **settings):
        work = tmp_path / name
        work.mkdir()
        shutil.copy(mlp_run[0] / "data.pt", work / "data.pt")  # the same data, not generated again
        config = DrafterConfig(**{**RUN, "init_from": saved, **settings})
        return train_drafter(converted, work, config, threads=1, log=lambda _: None)

    for mlp_rank in (0, 2):  # the saved MLP adapter would be dropped, or does not fit
        with pytest.raises(ConfigError, match="has down_proj rank 4; give --set mlp_rank=4 to start from it"):
            train(f"rank{mlp_rank}", mlp_rank=mlp_rank)
    summary = train("warm", steps=1, eval_every=1, mlp_rank=4, mlp_alpha=2.0)
    # before its first step it drafts as the saved adapter (bfloat16 on disk) did at the end of its run
    assert summary["first"]["loss"] == pytest.approx(mlp_run[1]["last"]["loss"], abs=0.02)
