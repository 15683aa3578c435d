"""Bad inputs found by a trial of the CLI and the API (issue 12): each is a named SpecframeError saying what to do."""

from __future__ import annotations

import json
import pickle
import re
import warnings

import numpy as np
import pytest
import torch

from decoding_helpers import NEMOTRON, tiny_model
from specframe import compose
from specframe.acceptance.base import AcceptanceRule
from specframe.cli import build_parser, decoder_config, main, unescape
from specframe.errors import CheckpointError, ConfigError, InputError, OutputError, PluginError, UnsafeWeightsError
from specframe.hookspecs import hookimpl
from specframe.models import load_model
from specframe.plugins import plugin_registered
from specframe.testing.models import write_random_checkpoint

VOCAB = 12


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return tiny_model(NEMOTRON, tmp_path_factory.mktemp("bad"), vocab=VOCAB, seed=1)


def _cli(capsys, *args):
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def _args(*argv):
    return build_parser(["generate"]).parse_args(["generate", "x", *argv])


# -- 1. escapes in --stop ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("written", "meant"),
    [
        ("փ", "փ"),
        ("é\\n", "é\n"),
        ("a\\tb", "a\tb"),
        ("\\\\", "\\"),
        ("\\x41", "A"),
        ("\\u0583", "փ"),
        ("日本", "日本"),
    ],
)
def test_stop_escapes_keep_non_ascii_text(written, meant):
    assert decoder_config(_args("--stop", written))["stop"] == [meant]


@pytest.mark.parametrize("written", ["\\x", "\\x4", "\\u12", "\\q", "end\\", "\\UFFFFFFFF", "\\ud800"])
def test_bad_escapes_are_config_errors(written):
    with pytest.raises(ConfigError, match="not a valid escape|not a Unicode character"):
        unescape(written, option="--stop")


def test_cli_stop_string_stops_like_the_api(capsys):
    """The bundled tokenizer: a non-ASCII stop string ends the CLI's output exactly where the API's ends."""
    decoder = compose({"schedule": "ar", "max_new_tokens": 12})
    free = decoder.generate("a")
    # Stop at the second output token, written as text (whatever the model produced).
    stop_text = decoder.model.decode(free.output_ids[1:2])
    api = compose({"schedule": "ar", "max_new_tokens": 12, "stop": [stop_text]}).generate("a")
    code, out, err = _cli(
        capsys, "generate", "a", "--schedule", "ar", "--max-new-tokens", "12", "--stop", stop_text, "--json"
    )
    assert code == 0, err
    assert json.loads(out)["output_ids"] == api.output_ids
    assert decoder_config(_args("--stop", "փ"))["stop"] == ["փ"]


# -- 2. temperature 0 with sampling options ----------------------------------------------------------------------
@pytest.mark.parametrize(
    "extra",
    [["--top-k", "20"], ["--top-p", "0.5"], ["--acceptance", "rejection"], ["--acceptance", "rejection:top_k=3"]],
)
def test_temperature_zero_with_sampling_options_is_refused(extra):
    with pytest.raises(ConfigError, match="--temperature 0 means greedy"):
        decoder_config(_args("--temperature", "0", *extra))


def test_temperature_zero_with_another_rule_names_the_rule_not_sampling():
    # A plugin's rule may well be deterministic: what conflicts is the rule, not sampling.
    with pytest.raises(ConfigError) as info:
        decoder_config(_args("--temperature", "0", "--acceptance", "greedy-high"))
    message = str(info.value)
    assert "--acceptance greedy-high names another rule" in message and "asks for sampling" not in message


def test_temperature_zero_alone_is_greedy():
    assert decoder_config(_args("--temperature", "0"))["acceptance"] == "greedy"


def test_bench_refuses_temperature_zero_with_top_k(capsys, tmp_path):
    code, _, err = _cli(
        capsys, "bench", "--schedules", "ar", "--temperature", "0", "--top-k", "20", "--repeats", "3",
        "--limit", "1", "--no-progress", "--out", str(tmp_path / "run"),
    )  # fmt: skip
    assert code == 1 and "--temperature 0 means greedy" in err
    assert not (tmp_path / "run").exists()


# -- 3. width bounded by the model's context ---------------------------------------------------------------------
def test_width_beyond_the_context_is_refused(model):
    with pytest.raises(ConfigError, match=r"width 10000 exceeds the context .* \(256 positions\)"):
        compose({"model": model, "width": 10000})


def test_a_request_width_beyond_the_context_is_refused_like_the_decoders(model):
    decoder = compose({"model": model, "schedule": "packed", "width": 4, "max_new_tokens": 4})
    with pytest.raises(InputError, match=r"request 1: width 5000 exceeds the model's context of 256 positions"):
        decoder.generate_many([[1, 2], [3]], widths=[4, 5000])
    with pytest.raises(InputError, match=r"width 257 exceeds .* use a width <= 256"):
        decoder.stepper(prompt_ids=[1], width=257)
    assert decoder.stepper(prompt_ids=[1], width=256).state.ctx.width == 256


def test_a_wide_window_with_a_short_output_allocates_for_the_output(model):
    wide = compose({"model": model, "schedule": "quadratic", "width": 256, "max_new_tokens": 4})
    narrow = compose({"model": model, "schedule": "quadratic", "width": 4, "max_new_tokens": 4})
    assert wide.generate(prompt_ids=[1, 2]).output_ids == narrow.generate(prompt_ids=[1, 2]).output_ids


# -- 4. devices and huge seeds ------------------------------------------------------------------------------------
@pytest.mark.parametrize(("device", "message"), [("meta", "unsupported device type 'meta'"), ("cpu:3", "use 'cpu'")])
def test_unusable_devices(capsys, device, message):
    code, _, err = _cli(capsys, "generate", "x", "--max-new-tokens", "2", "--device", device)
    assert code == 1 and message in err and "internal error" not in err


def test_huge_seed_with_sampling(capsys):
    code, _, err = _cli(capsys, "generate", "x", "--temperature", "1", "--seed", str(2**80), "--max-new-tokens", "2")
    assert code == 1 and "seed must lie in [0, 2**64 - 1]" in err


# -- 5. seeds in compose and per request --------------------------------------------------------------------------
@pytest.mark.parametrize("seed", [2**70, -1, 1.5, "abc", True])
def test_bad_seeds_in_compose(model, seed):
    with pytest.raises(ConfigError, match="seed must"):
        compose({"model": model, "acceptance": "rejection", "seed": seed})


@pytest.mark.parametrize("seed", [2**70, -1, 1.5, "abc", True])
def test_bad_seeds_per_request(model, seed):
    decoder = compose({"model": model, "acceptance": "rejection", "max_new_tokens": 3})
    with pytest.raises(InputError, match="seed must"):
        decoder.generate(prompt_ids=[1, 2], seed=seed)


def test_largest_seed_is_usable(model):
    decoder = compose({"model": model, "acceptance": "rejection", "max_new_tokens": 3, "seed": 2**64 - 1})
    assert len(decoder.generate(prompt_ids=[1, 2]).output_ids) == 3


# -- 6. prompt ids validated, not coerced --------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("prompt_ids", "message"),
    [
        ([1.7, 2.2], "entry 0 is float"),
        ("567", "got str"),
        ("5,6,7", "got str"),
        ([True, False], "boolean"),
        ([None], "entry 0 is NoneType"),
        ([[1, 2]], "entry 0 is list"),
        (torch.tensor([[1, 2]]), "2-D int64 tensor"),
        (torch.tensor([1.0, 2.0]), "1-D float32 tensor"),
        (np.array([[1, 2]]), "2-D array"),
        (12, "got int"),
    ],
)
def test_prompt_ids_are_validated(model, prompt_ids, message):
    decoder = compose({"model": model, "max_new_tokens": 2})
    with pytest.raises(InputError, match="prompt_ids must be a list of integer token ids") as info:
        decoder.generate(prompt_ids=prompt_ids)
    assert message in str(info.value)


@pytest.mark.parametrize(
    "prompt_ids", [[1, 2, 3], (1, 2, 3), torch.tensor([1, 2, 3]), np.array([1, 2, 3]), range(1, 4)]
)
def test_integer_sequences_and_tensors_are_accepted(model, prompt_ids):
    decoder = compose({"model": model, "max_new_tokens": 2})
    assert decoder.generate(prompt_ids=prompt_ids).prompt_ids == [1, 2, 3]


def test_numpy_integers_are_taken_wherever_an_int_is(model):
    # prompt_ids took NumPy integers, seed and max_new_tokens refused them: one rule for all (operator.index)
    reference = compose({"model": model, "acceptance": "rejection", "max_new_tokens": 3, "seed": 7, "width": 2})
    expected = reference.generate(prompt_ids=[1, 2]).output_ids
    config = {"acceptance": "rejection", "max_new_tokens": np.int64(3), "seed": np.uint32(7), "width": np.int16(2)}
    decoder = compose({"model": model, **config, "threads": np.int64(1)})
    assert decoder.generate(prompt_ids=np.array([1, 2])).output_ids == expected
    compose({"model": model, "stop": [[np.int64(5), 6]]})  # token-id stop sequences likewise
    per_call = reference.generate(prompt_ids=[1, 2], max_new_tokens=np.int32(3), seed=np.int64(7))
    assert per_call.output_ids == expected and type(per_call.output_ids[0]) is int


@pytest.mark.parametrize("value", [np.bool_(True), True, np.float64(3.0), 3.0])
@pytest.mark.parametrize("key", ["seed", "max_new_tokens"])
def test_numpy_booleans_and_floats_are_still_not_integers(model, key, value):
    with pytest.raises(ConfigError, match=f"{key} must be an integer"):
        compose({"model": model, key: value})
    with pytest.raises(InputError, match=f"{key} must be an integer"):
        compose({"model": model, "max_new_tokens": 2}).generate(prompt_ids=[1, 2], **{key: value})


@pytest.mark.parametrize("prompt", [123, [1, 2], b"text"])
def test_prompt_must_be_text(prompt):
    decoder = compose({"schedule": "ar", "max_new_tokens": 2})
    with pytest.raises(InputError, match="the prompt must be text"):
        decoder.generate(prompt)


# -- 7 and 8. bench output folders ---------------------------------------------------------------------------------
def _bench(tmp_path, out, schedules="ar"):
    return ["bench", "--schedules", schedules, "--limit", "1", "--max-new-tokens", "3", "--warmup", "0",
            "--resamples", "50", "--no-progress", "--out", str(out)]  # fmt: skip


def test_a_run_failing_at_compose_writes_no_run_json_and_the_rerun_works(capsys, tmp_path):
    out = tmp_path / "run"
    code, _, err = _cli(capsys, *_bench(tmp_path, out, "ar,bogus"))
    assert code == 1 and "unknown schedule 'bogus'" in err
    assert not (out / "run.json").exists()
    code, _, err = _cli(capsys, *_bench(tmp_path, out, "ar,packed"))
    assert code == 0, err
    assert json.loads((out / "run.json").read_text())["settings"]["schedules"] == ["ar", "packed"]


def test_unusable_output_folders(capsys, tmp_path):
    a_file = tmp_path / "file"
    a_file.write_text("x")
    for out, message in [
        (a_file, "is an existing file"),
        (a_file / "sub", "cannot be used as the output folder"),
        ("/proc/specframe-out", "cannot be used as the output folder"),
    ]:
        code, _, err = _cli(capsys, *_bench(tmp_path, out))
        assert code == 1 and message in err and "internal error" not in err, err


def test_output_folder_errors_are_output_errors(tmp_path):
    from specframe.bench.records import prepare_folder

    (tmp_path / "file").write_text("x")
    with pytest.raises(OutputError):
        prepare_folder(tmp_path / "file" / "sub")


# -- 10. a plugin factory that fails -------------------------------------------------------------------------------
class _Broken:
    @hookimpl
    def register_acceptance_rules(self, register):
        def raises():
            raise RuntimeError("boom")

        register("raises", raises)
        register("wrong-type", lambda: object())
        register("ok", _Rule)
        register("no-verify", _NoVerify)


class _Rule(AcceptanceRule):
    def propose(self, logits, generator):  # pragma: no cover - never called
        raise NotImplementedError

    def verify(self, drafts, logits, generator):  # pragma: no cover - never called
        raise NotImplementedError


class _NoVerify(AcceptanceRule):
    """A rule that forgot verify(): a bug in the plugin, not in the user's configuration."""

    def propose(self, logits, generator):  # pragma: no cover - never called
        raise NotImplementedError


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("raises", "failed while being built: RuntimeError: boom"),
        ("wrong-type", "returned object"),
        ("no-verify", "class _NoVerify does not implement verify, which every acceptance rule"),
    ],
)
def test_a_failing_plugin_factory_names_the_plugin(model, name, message):
    with plugin_registered(_Broken(), "broken_rules"), pytest.raises(PluginError) as info:
        compose({"model": model, "acceptance": name})
    assert message in str(info.value) and "plugin 'broken_rules'" in str(info.value)


def test_plugin_registered_is_scoped(model):
    # A fixed width: width "auto" with no cached cost model would calibrate by decoding with this rule,
    # which cannot decode (the test then depended on an earlier test having cached the cost model).
    with plugin_registered(_Broken(), "broken_rules"):
        assert isinstance(compose({"model": model, "acceptance": "ok", "width": 4}).rule, _Rule)
    with pytest.raises(Exception, match="unknown acceptance rule 'ok'"):
        compose({"model": model, "acceptance": "ok"})


# -- 9, 11 and load_model(123): checkpoints ------------------------------------------------------------------------
@pytest.mark.parametrize("factor", [-4.0, 0, 0.5, "4", True])
def test_a_bad_yarn_factor_is_refused(tmp_path, factor):
    folder = write_random_checkpoint(
        NEMOTRON, tmp_path / "m", seed=1, tokenizer=False, rope_parameters={"factor": factor}
    )
    with pytest.raises(CheckpointError, match=r"rope factor=.*expected a finite number >= 1"):
        load_model(folder)


class _Payload:
    """Unpickling this calls a function: what a malicious weight file does."""

    def __reduce__(self):
        return (print, ("this must never run",))


@pytest.mark.parametrize("zipped", [True, False])
def test_a_pickle_with_objects_is_refused_as_unsafe(tmp_path, capsys, zipped):
    folder = write_random_checkpoint(NEMOTRON, tmp_path / "m", seed=1, tokenizer=False, weights_format="bin")
    path = folder / "pytorch_model.bin"
    if zipped:
        torch.save({"model.norm.weight": _Payload()}, path)
    else:
        path.write_bytes(pickle.dumps({"model.norm.weight": _Payload()}))
    with warnings.catch_warnings(), pytest.raises(UnsafeWeightsError) as info:
        warnings.simplefilter("ignore")  # torch warns about the pickle protocol of the plain pickle
        load_model(folder)
    message = str(info.value)
    assert "holds Python objects that are not tensors" in message and "for safety" in message
    assert "truncated" not in message
    assert "this must never run" not in capsys.readouterr().out


@pytest.mark.parametrize("source", [123, 1.5, ["nemotron-stdlib-tiny"], b"folder"])
def test_load_model_needs_a_name_or_path(source):
    with pytest.raises(ConfigError, match="the model source must be a Hub repo id, a folder path"):
        load_model(source)


class _BrokenFamily:
    @hookimpl
    def register_model_backends(self, register):
        def explodes(checkpoint):
            raise RuntimeError("cannot read this")

        register("explodes", explodes, model_types=["explodes"])
        register("not-a-model", lambda checkpoint: "a string", model_types=["not_a_model"])


@pytest.mark.parametrize(
    ("family", "message"), [("explodes", "RuntimeError: cannot read this"), ("not-a-model", "returned str")]
)
def test_a_failing_model_loader_names_the_plugin(tmp_path, family, message):
    folder = write_random_checkpoint(NEMOTRON, tmp_path / "m", seed=1, tokenizer=False)
    with plugin_registered(_BrokenFamily(), "broken_family"), pytest.raises(PluginError) as info:
        load_model(folder, family=family)
    assert message in str(info.value) and "plugin 'broken_family'" in str(info.value)


# -- trial 2: prompts that are empty or not UTF-8, revisions of local models, unmarked hook functions ----------
@pytest.fixture(scope="module")
def bundled():
    return compose({"schedule": "ar", "max_new_tokens": 2})


def test_an_empty_prompt_text_is_refused_on_both_families(bundled):
    """Nemotron's BOS used to turn "" into a one-token prompt while SetDLM refused it: both refuse it now."""
    setdlm = compose({"model": "setdlm-stdlib-tiny", "schedule": "ar", "max_new_tokens": 2})
    for decoder in (bundled, setdlm):
        with pytest.raises(InputError, match="the prompt text is empty.*prompt_ids"):
            decoder.generate("")
    bos = bundled.model.bos_token_id
    assert bundled.generate(prompt_ids=[bos]).prompt_ids == [bos]  # the way to start from BOS alone


def test_an_empty_prompt_on_the_command_line(capsys):
    code, out, err = _cli(capsys, "generate", "", "--max-new-tokens", "2")
    assert code == 1 and out == "" and err.startswith("error: the prompt text is empty")


@pytest.mark.parametrize("text", ["ab\udcff", "\ud800x"])
def test_text_with_lone_surrogates_is_an_input_error(bundled, text):
    with pytest.raises(InputError, match="not valid Unicode: character [02] is a lone surrogate"):
        bundled.generate(text)
    with pytest.raises(ConfigError, match="stop string .* lone surrogate"):
        compose({"model": bundled.model, "stop": [text]})


class _Stdin:
    """Standard input whose bytes are given (what a shell redirect from a file provides)."""

    def __init__(self, data: bytes):
        import io

        self.buffer = io.BytesIO(data)


def test_standard_input_that_is_not_utf8(capsys, monkeypatch):
    monkeypatch.setattr("sys.stdin", _Stdin(b"def f\xff(x):"))
    code, out, err = _cli(capsys, "generate", "-", "--max-new-tokens", "2")
    assert code == 1 and out == "" and err.count("\n") == 1
    assert "standard input is not UTF-8 text (byte 0xff at offset 5)" in err and "internal error" not in err


def test_standard_input_with_a_utf8_byte_order_mark_is_the_text_after_it(capsys, monkeypatch, bundled):
    monkeypatch.setattr("sys.stdin", _Stdin("\ufeffdef fé(x):".encode()))
    code, out, err = _cli(capsys, "generate", "-", "--schedule", "ar", "--max-new-tokens", "2", "--json")
    assert code == 0, err
    assert json.loads(out)["prompt_ids"] == bundled.generate("def fé(x):").prompt_ids


def test_a_prompt_argument_that_is_not_utf8(capsys):
    code, _, err = _cli(capsys, "generate", "def f\udcff", "--max-new-tokens", "2")  # argv bytes b"\xff"
    assert code == 1 and err.startswith("error: PROMPT: the text is not valid Unicode")


@pytest.mark.parametrize("value", ["inf", "nan"])
def test_an_infinite_temperature_is_refused(capsys, value):
    code, _, err = _cli(capsys, "generate", "x", "--temperature", value, "--max-new-tokens", "2")
    assert code == 1 and "temperature must be a number > 0 and finite" in err


@pytest.mark.parametrize("value", ["1e-38", "1e-40", "1e-300"])
def test_a_temperature_too_small_for_float32_is_refused(capsys, value):
    """Logits divided by it overflowed: NaN probabilities and a token id past the vocabulary, with exit 0."""
    args = ["generate", "x", "--schedule", "ar", "--temperature", value, "--max-new-tokens", "1", "--json"]
    code, out, err = _cli(capsys, *args)
    assert code == 1 and not out
    assert f"temperature {value} is too small" in err and "--temperature 0" in err


def test_the_smallest_accepted_temperature_samples_within_the_vocabulary(capsys):
    code, out, err = _cli(
        capsys, "generate", "x", "--schedule", "ar", "--temperature", "1e-30", "--max-new-tokens", "3", "--json"
    )
    assert code == 0, err
    vocabulary = compose({"schedule": "ar"}).model.vocab_size
    assert all(0 <= token < vocabulary for token in json.loads(out)["output_ids"])


def test_a_revision_of_a_local_or_bundled_model_is_refused(capsys, tmp_path):
    folder = write_random_checkpoint(NEMOTRON, tmp_path / "m", seed=1, tokenizer=False)
    for source in (folder, str(folder), None, "setdlm-stdlib-tiny"):
        with pytest.raises(ConfigError, match="revision 'main' applies to Hub repo ids only"):
            load_model(source, revision="main")
    code, _, err = _cli(capsys, "generate", "x", "--revision", "v1", "--max-new-tokens", "2")
    assert code == 1 and "revision 'v1' applies to Hub repo ids only" in err and "drop the revision" in err


class _Unmarked:
    def register_schedules(self, register):  # no @hookimpl: pluggy would never call it
        register("never-seen", object)


class _NoHooks:
    def helper(self):  # pragma: no cover - never called
        return None


@pytest.mark.parametrize(
    ("plugin", "message"),
    [
        (_Unmarked(), "register_schedules is not marked with @specframe.hookimpl"),
        (_NoHooks(), "implements none of specframe's hooks"),
    ],
)
def test_a_plugin_that_would_register_nothing_is_refused(plugin, message):
    with pytest.raises(PluginError, match=message), plugin_registered(plugin, "quiet_plugin"):
        pass  # pragma: no cover - registration fails


def test_more_threads_than_cores_is_refused_before_torch_is_asked(capsys):
    """torch.set_num_threads(10**6) ends the process (OpenMP cannot create the threads): refuse it first."""
    from specframe.models.threads import machine_cores

    too_many = str(machine_cores() + 1)
    code, _, err = _cli(capsys, "generate", "x", "--threads", too_many, "--max-new-tokens", "2")
    assert code == 1 and f"threads {too_many} is more than the {machine_cores()} CPU core(s)" in err


def test_integer_weights_are_refused_not_converted(tmp_path):
    from safetensors.torch import load_file, save_file

    folder = write_random_checkpoint(NEMOTRON, tmp_path / "m", seed=1, tokenizer=False)
    tensors = load_file(folder / "model.safetensors")
    name = next(n for n in tensors if n.endswith("embed_tokens.weight"))
    save_file({**tensors, name: tensors[name].to(torch.int32)}, folder / "model.safetensors")
    with pytest.raises(CheckpointError, match=f"weight {name} holds torch.int32 values, not floating-point"):
        load_model(folder)


@pytest.mark.parametrize("width", [2, 8])
def test_a_width_for_ar_is_refused_not_ignored(model, width):
    with pytest.raises(ConfigError, match=f"schedule 'ar' takes no width.*width {width} would be ignored"):
        compose({"model": model, "schedule": "ar", "width": width})


@pytest.mark.parametrize("width", ["auto", 1])
def test_ar_takes_auto_or_its_own_width_of_one(model, width):
    decoder = compose({"model": model, "schedule": "ar", "width": width, "max_new_tokens": 4})
    assert decoder.width == 1  # one-token windows: no cache rows reserved for a draft
    assert decoder.generate(prompt_ids=[1, 2, 3]).metrics.rows_per_call[1:] == [1, 1, 1]


def test_a_plugin_schedule_can_declare_that_it_takes_no_width(model):
    from specframe.schedules.ar import ARSchedule

    class Plain(ARSchedule):
        name = "plain-ar"

    class Plugin:
        @hookimpl
        def register_schedules(self, register):
            register("plain-ar", Plain)

    with plugin_registered(Plugin(), "widthless_schedule"):
        with pytest.raises(ConfigError, match="schedule 'plain-ar' takes no width"):
            compose({"model": model, "schedule": "plain-ar", "width": 3})
        Plain.takes_width = True
        assert compose({"model": model, "schedule": "plain-ar", "width": 3}).width == 3


def test_a_cost_cache_folder_that_is_a_file_is_refused(model, tmp_path, monkeypatch):
    (tmp_path / "file").write_text("x")
    monkeypatch.setenv("SPECFRAME_CACHE_DIR", str(tmp_path / "file"))
    decoder = compose({"model": model, "schedule": "packed", "width": "auto"})  # composing reads no cost model
    with pytest.raises(ConfigError, match="SPECFRAME_CACHE_DIR=.* is a file, so nothing .* can be cached"):
        decoder.generate(prompt_ids=[3, 5, 7], max_new_tokens=4)  # its first use does


# -- trial 3: values that were coerced, defaulted or reported as something else ----------------------------
def _bench_settings(*argv):
    from specframe.bench.cli import settings_from_args

    argv = ("bench", "--out", "unused", *argv)
    return settings_from_args(build_parser(argv).parse_args(argv))


@pytest.mark.parametrize("seed", ["-1", "-5"])
def test_a_negative_bootstrap_seed_is_refused_before_the_run(seed):
    with pytest.raises(ConfigError, match=f"--bootstrap-seed must be an integer >= 0, got {seed}"):
        _bench_settings("--bootstrap-seed", seed)


def test_a_task_file_that_is_a_folder_is_named_as_one(tmp_path):
    from specframe.bench.tasks.files import read_rows
    from specframe.errors import SpecframeError

    with pytest.raises(SpecframeError, match=f"task file {tmp_path} is a folder, not a file"):
        read_rows(tmp_path)


@pytest.mark.parametrize("top_k", [VOCAB + 1, 10**9])
def test_a_top_k_beyond_the_vocabulary_is_refused_not_clamped(model, top_k):
    with pytest.raises(ConfigError, match=f"top_k {top_k} exceeds the vocabulary of model .* \\({VOCAB} tokens\\)"):
        compose({"model": model, "acceptance": {"name": "rejection", "top_k": top_k}})
    assert compose({"model": model, "acceptance": {"name": "rejection", "top_k": VOCAB}}).rule.describe()["top_k"]


@pytest.mark.parametrize("value", ["", " "])
def test_an_empty_device_is_refused_not_read_as_the_cpu(model, value):
    with pytest.raises(ConfigError, match="device is an empty string"):
        compose({"device": value, "max_new_tokens": 2})


@pytest.mark.parametrize(
    ("option", "message"),
    [("--device", "device is an empty string"), ("--acceptance", "--acceptance '' has no plugin name")],
)
def test_empty_options_on_the_command_line_are_refused(capsys, option, message):
    code, out, err = _cli(capsys, "generate", "x", "--max-new-tokens", "2", option, "")
    assert code == 1 and out == "" and message in err and "internal error" not in err, err


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("--prompt-ids", "1,,2", "--prompt-ids '1,,2': entry 2 is empty"),
        ("--prompt-ids", "1,2,", "--prompt-ids '1,2,': entry 3 is empty"),
    ],
)
def test_empty_entries_in_prompt_ids_are_refused(capsys, option, value, message):
    code, _, err = _cli(capsys, "generate", "--max-new-tokens", "2", option, value)
    assert code == 1 and message in err, err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("--widths", ""), "--widths '': entry 1 is empty"),
        (("--widths", "4,"), "--widths '4,': entry 2 is empty"),
        (("--widths", "4,,8"), "--widths '4,,8': entry 2 is empty"),
        (("--schedules", "ar,"), "--schedules 'ar,': entry 2 is empty"),
        (("--schedules", "ar,,packed"), "--schedules 'ar,,packed': entry 2 is empty"),
    ],
)
def test_empty_entries_in_bench_lists_are_refused(argv, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        _bench_settings(*argv)


def _edit_config(folder, edit):
    path = folder / "config.json"
    config = json.loads(path.read_text())
    edit(config)
    path.write_text(json.dumps(config))


@pytest.mark.parametrize("value", ["abc", -1, 1, None])
def test_a_setdlm_tie_word_embeddings_that_is_not_a_boolean_is_refused(tmp_path, value):
    from decoding_helpers import SETDLM

    folder = write_random_checkpoint(SETDLM, tmp_path / "m", seed=1, tokenizer=False)
    _edit_config(folder, lambda c: c["backbone_config"].__setitem__("tie_word_embeddings", value))
    with pytest.raises(CheckpointError, match=f"tie_word_embeddings={value!r} \\(expected true or false\\)"):
        load_model(folder)


@pytest.mark.parametrize("field", ["mask_token_id", "eos_token_id"])
def test_a_special_token_id_that_is_not_an_integer_names_the_file_and_field(tmp_path, field):
    from decoding_helpers import SETDLM

    folder = write_random_checkpoint(SETDLM, tmp_path / "m", seed=1, tokenizer=False)
    _edit_config(folder, lambda c: c.__setitem__(field, "abc"))
    with pytest.raises(CheckpointError, match=f"{folder}/config.json: {field}='abc' is not a token id"):
        load_model(folder)


@pytest.mark.parametrize("value", [99999, ["float32"], True])
def test_a_torch_dtype_that_is_not_a_name_is_refused(tmp_path, value):
    folder = write_random_checkpoint(NEMOTRON, tmp_path / "m", seed=1, tokenizer=False)
    _edit_config(folder, lambda c: c.__setitem__("torch_dtype", value))
    with pytest.raises(CheckpointError, match=re.escape(f"has torch_dtype {value!r}, which is not a dtype")):
        load_model(folder)
    assert load_model(folder, dtype="float32").dtype == torch.float32  # an explicit dtype leaves it unused


@pytest.mark.parametrize(
    ("index", "message"),
    [
        ("{bad", "is not valid JSON"),
        ("[]", "has no 'weight_map' object"),
        ("{}", "has no 'weight_map' object"),
        ('{"weight_map": [1, 2]}', "has no 'weight_map' object"),
        ('{"weight_map": {}}', "has no 'weight_map' object"),
        ('{"weight_map": {"model.norm.weight": 5}}', "model.norm.weight -> 5 is not a shard file name"),
        ('{"weight_map": {"model.norm.weight": "../other/model.safetensors"}}', "is not a shard file name"),
    ],
)
def test_a_damaged_weight_index_is_a_checkpoint_error(tmp_path, index, message):
    folder = write_random_checkpoint(NEMOTRON, tmp_path / "m", seed=1, tokenizer=False, shards=2)
    (folder / "model.safetensors.index.json").write_text(index)
    with pytest.raises(CheckpointError, match=re.escape(message)) as info:
        load_model(folder)
    assert "model.safetensors.index.json" in str(info.value)


@pytest.mark.parametrize("adapter", [5, 1.5, ["linear_spec_lora"]])
def test_an_adapter_that_is_neither_a_flag_nor_a_folder_is_a_config_error(tmp_path, adapter):
    folder = write_random_checkpoint(NEMOTRON, tmp_path / "m", seed=1, tokenizer=False, lora_rank=2)
    with pytest.raises(
        ConfigError,
        match=f"adapter must be True, False, None or an adapter folder path, got {re.escape(repr(adapter))}",
    ):
        load_model(folder, adapter=adapter)


@pytest.mark.parametrize("schedule", ["ar", "packed", "linear", "quadratic", "kbranch", "auto"])
def test_a_stop_string_stops_however_the_model_tokenizes_it(schedule):
    """The bundled Nemotron has one token for a blank line, but writes it as two newline tokens after
    "class Foo:\\n": --stop '\\n\\n' used to match that one token only, so the output ran on to the length limit
    with blank lines in it and stop_reason "length"."""
    base = {"model": "nemotron-stdlib-tiny", "dtype": "float64", "max_new_tokens": 40}
    decoder = compose({**base, "schedule": schedule, "stop": ["\n\n"]})
    assert len(decoder.model.tokenizer.encode("\n\n")) == 1
    result = decoder.generate("class Foo:\n")
    assert result.stop_reason == "stop_sequence" and result.text.endswith("\n\n")
    assert result.text.count("\n\n") == 1 and len(result.output_ids) < 40
    free = compose({**base, "schedule": "ar"}).generate("class Foo:\n")
    assert free.output_ids[: len(result.output_ids)] == result.output_ids  # the AR output, cut where it stops
    streamed = list(decoder.stream("class Foo:\n"))
    assert "".join(piece.text for piece in streamed) == result.text


@pytest.mark.parametrize(
    ("task", "row", "field"),
    [
        ("smoke", {"prompt": 5}, "prompt"),
        ("smoke", {"prompt": {"role": "user", "content": "hi"}}, "prompt"),
        ("humaneval", {"prompt": ["def f():"], "test": "x", "entry_point": "f"}, "prompt"),
        ("humaneval", {"prompt": "def f():", "test": 3, "entry_point": "f"}, "test"),
        ("mbpp", {"text": 7, "test_list": ["assert True"]}, "text"),
        ("gsm8k", {"question": 12, "answer": "#### 4"}, "question"),
        ("math500", {"problem": None, "answer": "4"}, None),
        ("writingbench", {"query": ["a", "b"]}, "query"),
    ],
)
def test_a_task_file_field_that_is_not_text_is_refused_not_coerced(tmp_path, task, row, field):
    from specframe.bench.tasks import get_task
    from specframe.errors import SpecframeError

    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps(row) + "\n")
    message = f"a row's {field!r} is " if field else "a row has no 'problem' field"
    with pytest.raises(SpecframeError, match=re.escape(message)):
        get_task(task).load(path)
    if field:
        with pytest.raises(SpecframeError, match="not text; check that --task-file matches --task"):
            get_task(task).load(path)


def test_a_numeric_answer_in_a_task_file_is_still_read(tmp_path):
    from specframe.bench.tasks import get_task

    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps({"problem": "1 + 3?", "answer": 4}) + "\n")
    assert get_task("math500").load(path)[0].reference == {"answer": "4"}


def test_bench_merge_into_a_file_or_a_system_folder_is_an_output_error(capsys, tmp_path):
    shard = tmp_path / "shard"
    code, _, err = _cli(capsys, *_bench(tmp_path, shard))
    assert code == 0, err
    (tmp_path / "file").write_text("x")
    for out, message in [(tmp_path / "file", "is an existing file"), ("/proc/specframe-merge", "cannot be used")]:
        code, _, err = _cli(capsys, "bench", "merge", str(shard), "--out", str(out))
        assert code == 1 and f"--out {out} {message}" in err and "internal error" not in err, err


def test_convert_refuses_an_empty_out_path_instead_of_using_the_current_folder(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as info:
        main(["convert", "model.gguf", "--out", ""])
    assert info.value.code == 2 and "argument --out: the path is empty" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []
