"""``specframe convert`` on the command line: a GGUF file and a transformers folder in, one-line errors out."""

from __future__ import annotations

import json

import pytest
from convert_helpers import PROMPTS, leftovers, random_weights, reference_greedy, write_gguf

from specframe.cli import main
from specframe.convert.source import ARCHITECTURES
from specframe.models import load_model


def _generated_ids(capsys, folder, prompt) -> list[int]:
    ids = ",".join(map(str, prompt))
    assert (
        main(
            [
                "generate",
                "--model",
                str(folder),
                "--schedule",
                "packed",
                "--width",
                "3",
                "--prompt-ids",
                ids,
                "--max-new-tokens",
                "8",
                "--dtype",
                "float64",
                "--json",
            ]
        )
        == 0
    )
    return json.loads(capsys.readouterr().out)["output_ids"]


def test_a_gguf_file_converts_and_decodes_from_the_command_line(tmp_path, capsys):
    path = write_gguf(tmp_path / "tiny.gguf", random_weights(seed=3), qtype="Q8_0")
    out = tmp_path / "model"
    assert main(["convert", str(path), "--out", str(out), "--dtype", "float32"]) == 0
    printed = capsys.readouterr().out
    assert "LlamaForCausalLM -> nemotron-labs-diffusion" in printed and f"wrote {out}" in printed
    model = load_model(out, dtype="float64")
    assert model.family == "nemotron-labs-diffusion" and model.config.dims.num_layers == 2
    assert len(_generated_ids(capsys, out, PROMPTS[0])) == 8


def test_a_transformers_folder_converts_and_the_ar_output_is_the_source_models(tmp_path, capsys, converted):
    item = converted("llama")
    out = tmp_path / "model"
    assert main(["convert", str(item.source), "--out", str(out), "--dtype", "float32"]) == 0
    capsys.readouterr()
    prompt = PROMPTS[1]
    assert _generated_ids(capsys, out, prompt) == reference_greedy(item.model, prompt, 8)


def test_help_says_every_family_becomes_the_nemotron_layout(capsys):
    """The help names the layout the code writes: Qwen3 too goes to Nemotron-Labs-Diffusion, not SetDLM."""
    with pytest.raises(SystemExit):
        main(["convert", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "Llama, Mistral, Qwen2 (Qwen2.5) and Qwen3 all become Nemotron-Labs-Diffusion-layout models" in text
    assert "SetDLM-layout" not in text and "Qwen3 is not written as SetDLM" in text
    assert set(ARCHITECTURES.values()) == {"nemotron-labs-diffusion"}


def test_command_line_errors_are_one_line_and_leave_nothing(tmp_path, capsys):
    out = tmp_path / "model"
    missing = tmp_path / "absent.gguf"
    path = write_gguf(tmp_path / "tiny.gguf", random_weights(seed=3))
    cases = [
        (["convert", str(missing), "--out", str(out)], "absent.gguf: no such GGUF file"),
        (["convert", str(path), "--out", str(out), "--revision", "main"], "--revision applies to Hub repo ids"),
        (["convert", str(path), "--out", str(out), "--dtype", "int8"], "--dtype 'int8': choose one of"),
        (["convert", str(path), "--out", str(out), "--mask-token", "<nope>"], "--mask-token '<nope>' is not"),
    ]
    for argv, message in cases:
        assert main(argv) == 1, argv
        err = capsys.readouterr().err.strip()
        assert err.startswith("error:") and message in err and len(err.splitlines()) == 1, err
        assert not out.exists() and leftovers(out) == []
    out.mkdir()
    assert main(["convert", str(path), "--out", str(out)]) == 1
    assert "already there" in capsys.readouterr().err
