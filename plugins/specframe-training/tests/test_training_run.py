"""The training loop end to end on a tiny corpus and a tiny model: resume, export, load, CLI.

The real corpus and the shipped sizes never train in CI; this runs a few steps of a model with a few
thousand parameters on a handful of made-up files.
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open
from specframe_training import corpus as corpus_module
from specframe_training import trainer
from specframe_training.corpus import SourceFile, is_heldout, split_files

from specframe import compose
from specframe.cli import main
from specframe.models import load_model

TINY = {
    "vocab_size": 640,
    "hidden_size": 32,
    "num_hidden_layers": 1,
    "intermediate_size": 64,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 16,
    "seq_len": 32,
    "batch_size": 2,
    "eval_every": 2,
    "eval_windows": 2,
    "save_every": 1,
    "log_every": 1,
    "bf16": False,
    "distill_steps": 0,
}


def fake_files():
    files = []
    for i in range(60):
        body = "".join(f"    x{j} = compute({i}, {j}) + {i * j}\n" for j in range(12))
        files.append(SourceFile(f"pkg/mod{i}.py", f"def function_{i}(a, b):\n{body}    return a + b\n"))
    return files


@pytest.fixture
def tiny_corpus(monkeypatch):
    files = fake_files()
    assert split_files(files)[1], "the fake corpus needs held-out files"
    monkeypatch.setattr(trainer, "corpus_files", lambda: files)
    return files


def test_split_is_by_file_and_deterministic():
    names = [f"a/m{i}.py" for i in range(2000)]
    held = [n for n in names if is_heldout(n)]
    assert 0.02 < len(held) / len(names) < 0.08
    assert held == [n for n in names if is_heldout(n)]


def test_corpus_excludes_tests_and_third_party(tmp_path):
    for relative in ("a.py", "test/test_a.py", "site-packages/x/y.py", "encodings/cp1.py", "pkg/tests/t.py", "b.py"):
        path = tmp_path / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("x = 1\n")
    assert [f.relative for f in corpus_module.corpus_files(tmp_path)] == ["a.py", "b.py"]


@pytest.mark.parametrize("family", ["nemotron", "setdlm"])
def test_train_resume_export_and_load(tmp_path, tiny_corpus, family):
    work = tmp_path / "run"
    first = trainer.preset(family, steps=2, **TINY)
    trainer.train(first, work, threads=1, log=lambda _: None)
    with pytest.raises(ValueError, match="other settings"):
        trainer.train(trainer.preset(family, steps=3, **{**TINY, "hidden_size": 64}), work, log=lambda _: None)
    lines = []
    summary = trainer.train(trainer.preset(family, steps=3, **TINY), work, threads=1, log=lines.append)
    assert "resumed at step 2 " in " ".join(lines)  # only the step count may change on resume
    assert summary["train_tokens"] == 3 * 2 * 32
    records = [json.loads(line) for line in (work / "log.jsonl").read_text().splitlines()]
    assert any(r.get("eval") for r in records)
    hub = trainer.ship(work, tmp_path / "model", tmp_path / "records")
    assert sorted(p.name for p in hub.iterdir()) == ["config.json", "model.safetensors", "tokenizer.json"]
    assert (tmp_path / "records" / "summary.json").is_file()
    with safe_open(str(hub / "model.safetensors"), "pt") as handle:
        names = set(handle.keys())
        dtype = handle.get_tensor(next(iter(names))).dtype
    model = load_model(hub)
    if model.family == "nemotron-labs-diffusion":
        assert {"encoder.embed_tokens.weight", "diffusion_head.weight", "encoder.norm.weight"} <= names
    else:
        assert "backbone.model.model.layers.0.self_attn.q_norm.weight" in names
    assert str(dtype) == "torch.bfloat16"
    out = compose({"model": model, "schedule": "packed", "width": 3, "max_new_tokens": 5}).generate("def f(a):\n")
    assert len(out.output_ids) == 5


def test_distillation_stage_continues_a_finished_run(tmp_path, tiny_corpus):
    work = tmp_path / "run"
    trainer.train(trainer.preset("nemotron", steps=2, **TINY), work, threads=1, log=lambda _: None)
    before = load_model(work / "hub").network.state_dict()
    distill = {"prefix": 6, "rollout": 5, "batch_size": 2}
    lines = []
    config = trainer.preset("nemotron", steps=2, **{**TINY, "distill_steps": 2, "distill": distill})
    summary = trainer.train(config, work, threads=1, log=lines.append)
    assert any("resumed at step 2 " in line for line in lines)
    assert any("drafter distillation: 2 steps" in line for line in lines)
    records = [json.loads(line) for line in (work / "log.jsonl").read_text().splitlines()]
    assert [r["distill_step"] for r in records if "loss" in r and "distill_step" in r] == [1, 2]
    assert summary["distill_seconds"] > 0 and summary["total_train_seconds"] > summary["train_seconds"]
    after = load_model(work / "hub").network.state_dict()
    assert any(not torch.equal(before[name], after[name]) for name in before)  # the exported weights moved
    lines.clear()  # a finished stage is not repeated
    trainer.train(config, work, threads=1, log=lines.append)
    assert not any("drafter distillation" in line for line in lines)


def test_distillation_settings_are_checked():
    with pytest.raises(ValueError, match="nemotron-labs-diffusion only"):
        trainer.preset("setdlm", distill_steps=2)
    with pytest.raises(ValueError, match="distill_steps must be an integer >= 0"):
        trainer.preset("nemotron", distill_steps=-1)
    with pytest.raises(ValueError, match="distill.rollout must be >= 1"):
        trainer.preset("nemotron", distill={"rollout": 0})
    with pytest.raises(TypeError, match="bogus"):
        trainer.preset("nemotron", distill={"bogus": 1})


def test_train_cli(tmp_path, tiny_corpus, capsys):
    settings = [f"--set={k}={json.dumps(v)}" for k, v in TINY.items()]
    work, model = tmp_path / "work", tmp_path / "model"
    code = main(
        ["train", "setdlm", "--work-dir", str(work), "--steps", "1", "--threads", "1", *settings, "--ship", str(model)]
    )
    assert code == 0
    assert json.loads(capsys.readouterr().out.split("shipped to")[1].split("\n", 1)[1])["family"] == "setdlm"
    assert load_model(model).family == "setdlm"
    assert main(["train", "nope", "--work-dir", str(work)]) != 0
    assert main(["train", "setdlm", "--work-dir", str(work), "--set", "bogus"]) != 0


def test_step_seconds(tmp_path, tiny_corpus):
    config = trainer.preset("nemotron", steps=1, **TINY)
    hub, _ = trainer.prepare(config, tmp_path / "work", log=lambda _: None)
    seconds = trainer.step_seconds(config, hub, steps=2, threads=1)
    assert 0 < seconds < 30
