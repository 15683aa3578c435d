"""Streaming: ``Decoder.stream`` and ``specframe generate`` hand out text as tokens are accepted, changing nothing."""

from __future__ import annotations

import json

import pytest

from specframe import compose
from specframe.cli import main
from specframe.errors import InputError
from specframe.models import load_model
from specframe.streaming import IncrementalText
from specframe.testing.models import NEMOTRON, SETDLM, write_random_checkpoint

SCHEDULES = ("ar", "linear", "quadratic", "packed", "native")


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("stream")
    return {
        family: load_model(write_random_checkpoint(family, root / family, seed=7, logit_scale=0.5), dtype="float64")
        for family in (NEMOTRON, SETDLM)
    }


def _pieces(decoder, **request):
    pieces = list(decoder.stream(**request))
    assert pieces[-1].done and not any(p.done for p in pieces[:-1])
    return pieces


@pytest.mark.parametrize("family", [NEMOTRON, SETDLM])
@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("acceptance", ["greedy", {"name": "rejection", "temperature": 1.0}])
def test_stream_changes_no_token(models, family, schedule, acceptance):
    config = {"model": models[family], "schedule": schedule, "acceptance": acceptance, "max_new_tokens": 20}
    config["width"] = "auto" if schedule == "ar" else 4  # ar takes no width
    for seed in range(3):
        expected = compose(config).generate("def f(x):", seed=seed)
        pieces = _pieces(compose(config), prompt="def f(x):", seed=seed)
        final = pieces[-1].generation
        assert [t for p in pieces for t in p.token_ids] == expected.output_ids == final.output_ids
        assert "".join(p.text for p in pieces) == expected.text == final.text
        assert final.stop_reason == expected.stop_reason
        assert final.metrics.nfe == expected.metrics.nfe
        assert final.metrics.rows_per_call == expected.metrics.rows_per_call


def test_pieces_follow_the_calls(models):
    """Packed-SS accepting several tokens per call hands them out together, one piece per call at most."""
    decoder = compose({"model": models[NEMOTRON], "schedule": "packed", "width": 4, "max_new_tokens": 24})
    pieces = _pieces(decoder, prompt_ids=[1, 5, 9])
    calls = pieces[-1].generation.metrics.nfe
    assert 1 < len([p for p in pieces if p.token_ids]) <= calls
    assert max(len(p.token_ids) for p in pieces) == max(v.appended for v in pieces[-1].generation.metrics.verifications)


def test_multi_byte_characters_come_out_whole(models):
    """Byte-level BPE splits 'é', '€' and '日' across tokens; no piece shows a half character."""
    tokenizer = models[SETDLM].tokenizer
    text = "é€ 日本 abc ü"
    ids = tokenizer.encode(text)
    assert any("\ufffd" in tokenizer.decode([i]) for i in ids), "the test needs characters split across tokens"
    stream = IncrementalText(tokenizer.decode)
    pieces = [stream.update(ids[: k + 1]) for k in range(len(ids))]
    pieces.append(stream.finish(ids))
    assert "".join(pieces) == text
    assert not any("\ufffd" in p for p in pieces)
    assert "€" in pieces or any(p.startswith("€") or p.endswith("€") for p in pieces)


def test_a_stop_string_is_written_in_one_piece(models):
    model = models[NEMOTRON]
    free = compose({"model": model, "schedule": "ar", "max_new_tokens": 24}).generate(prompt_ids=[1, 5, 9])
    found = 0
    for start in range(4, 12):
        stop = free.output_ids[start : start + 3]
        if tuple(stop) in {tuple(free.output_ids[i : i + 3]) for i in range(start)}:
            continue  # an earlier occurrence would end generation earlier
        stop_text = model.decode(stop)
        decoder = compose({"model": model, "schedule": "packed", "width": 3, "max_new_tokens": 24, "stop": [stop]})
        pieces = _pieces(decoder, prompt_ids=[1, 5, 9])
        result = pieces[-1].generation
        assert result.stop_reason == "stop_sequence" and result.output_ids == free.output_ids[: start + 3]
        before = "".join(p.text for p in pieces[:-1])
        if not stop_text or not result.text.endswith(stop_text):
            continue
        found += 1
        # Nothing of the stop string was handed out before the last piece.
        assert len(before) <= len(result.text) - len(stop_text)
        assert "".join(p.text for p in pieces) == result.text
    assert found >= 3


def test_held_back_stop_prefix_is_released_when_the_output_moves_on():
    decode = "".join  # ids are characters here
    stream = IncrementalText(decode, ["STOP"])
    assert stream.update(list("abS")) == "ab"
    assert stream.update(list("abST")) == ""
    assert stream.update(list("abSTx")) == "STx"
    assert stream.finish(list("abSTxSTOP")) == "STOP"


def test_generate_command_streams_the_same_text(capsys, models, tmp_path):
    folder = write_random_checkpoint(SETDLM, tmp_path / "m", seed=7)
    args = ["generate", "def f(x):", "--model", str(folder), "--schedule", "packed", "--max-new-tokens", "12"]
    assert main([*args, "--json"]) == 0
    expected = json.loads(capsys.readouterr().out)["text"]
    assert main(args) == 0
    out, err = capsys.readouterr()
    assert out == expected + "\n" and "tokens/NFE" in err


def test_time_between_pieces_is_not_counted(models, monkeypatch):
    """A slow consumer (here a fake clock jumping 100 s per piece) does not inflate the metrics."""
    import specframe.decoder as decoder_module

    now = [0.0]
    monkeypatch.setattr(decoder_module.time, "perf_counter", lambda: now[0])
    decoder = compose({"model": models[NEMOTRON], "schedule": "packed", "width": 3, "max_new_tokens": 12})
    for _piece in decoder.stream(prompt_ids=[1, 5, 9]):
        now[0] += 100.0
    assert _piece.generation.metrics.wall_s == 0.0


def test_stream_validates_at_once(models):
    decoder = compose({"model": models[NEMOTRON], "max_new_tokens": 4})
    with pytest.raises(Exception, match="the prompt is empty"):
        decoder.stream(prompt_ids=[])


@pytest.mark.parametrize("family", [NEMOTRON, SETDLM])
@pytest.mark.parametrize("schedule", [*SCHEDULES, "kbranch", "auto"])
@pytest.mark.parametrize("acceptance", ["greedy", {"name": "rejection", "temperature": 1.0}])
def test_stream_many_gives_each_request_its_own_stream(models, family, schedule, acceptance):
    """Interleaved in one batch, each request's pieces are those it streams alone (stop strings included)."""
    config = {"model": models[family], "schedule": schedule, "acceptance": acceptance, "max_new_tokens": 16}
    config["width"] = "auto" if schedule == "ar" else 4
    config["stop"] = ["\n\n", "))"]
    config["cost"] = {"tau": 0.007, "delta": 0.0002, "host_s": 0.001}
    prompts = ["def f(x):", "é€日", "import os", "x = [", "class A:"]
    limits = [16, 5, 12, 1, 9]
    seeds = [3, 1, 4, 1, 5]
    alone = [
        _pieces(compose(config), prompt=p, max_new_tokens=n, seed=s)
        for p, n, s in zip(prompts, limits, seeds, strict=True)
    ]
    batched: dict[int, list] = {i: [] for i in range(len(prompts))}
    for index, piece in compose(config).stream_many(prompts, max_new_tokens=limits, seeds=seeds, max_batch=3):
        assert not batched[index] or not batched[index][-1].done  # nothing after a request's last piece
        batched[index].append(piece)
    for index, pieces in batched.items():
        if schedule == "auto":  # its choices carry over between requests decoded alone: the same tokens, other calls
            assert "".join(p.text for p in pieces) == "".join(p.text for p in alone[index])
        else:
            assert [(p.text, p.token_ids) for p in pieces] == [(p.text, p.token_ids) for p in alone[index]]
        final, expected = pieces[-1].generation, alone[index][-1].generation
        assert final.output_ids == expected.output_ids and final.stop_reason == expected.stop_reason


def test_stream_many_validates_every_request_at_once(models):
    decoder = compose({"model": models[NEMOTRON], "schedule": "packed", "width": 2, "max_new_tokens": 8})
    with pytest.raises(InputError, match="request 1: the prompt text is empty"):
        decoder.stream_many(["a", "", "b"])
    with pytest.raises(InputError, match="seeds has 2 entries for 3 prompts"):
        decoder.generate_many(["a", "b", "c"], seeds=[1, 2])
    with pytest.raises(InputError, match="max_batch must be an integer >= 1"):
        decoder.generate_many(["a"], max_batch=0)
