"""Converting GGUF files (llama.cpp's format) that the tests write themselves with ``gguf.GGUFWriter``.

The files follow llama.cpp's conventions: its tensor names, q/k rows permuted for its interleaved RoPE, norms
in F32 and matrices quantized. Covered types: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 (quantized with
``gguf.quants.quantize``), and Q4_K, Q6_K (which the ``gguf`` package cannot quantize: their super-blocks
are built byte by byte and decoded by the tests' own reference decoder). The oracle is transformers' own
GGUF loading (``from_pretrained(..., gguf_file=...)``).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from convert_helpers import (
    CHATML,
    PROMPTS,
    TEXTS,
    permute_rope_rows,
    random_kquant,
    random_weights,
    read_gguf_beside_transformers,
    reference_dequantize,
    reference_greedy,
    specframe_outputs,
    special_id,
    tokenizer,
    write_gguf,
)
from gguf import GGUFValueType
from tokenizers import Tokenizer

from specframe.convert import convert
from specframe.convert.gguf_source import read_gguf
from specframe.models import load_model
from specframe.models.base import ModelCall

#: Types ``gguf.quants.quantize`` writes, with the largest error allowed against the float weights, as a
#: fraction of the largest weight.
QUANTIZED = {
    "F32": 0.0,
    "F16": 1e-3,
    "BF16": 1e-2,
    "Q8_0": 1e-2,
    "Q5_0": 0.05,
    "Q5_1": 0.05,
    "Q4_0": 0.1,
    "Q4_1": 0.1,
}
#: Types whose blocks the tests build by hand.
HAND_BUILT = ("Q4_K", "Q6_K")
LENGTH = 10


class GGUFCase:
    """A GGUF file of one tensor type and what its tensors should read as (transformers names, unpermuted)."""

    def __init__(self, folder: Path, kind: str, tied: bool) -> None:
        self.kind, self.folder = kind, folder
        self.path = folder / f"model-{kind}.gguf"
        weights = random_weights(tied=tied, seed=3)
        if kind in HAND_BUILT:
            matrices = {
                name: random_kquant(*array.shape, kind, seed=index)
                for index, (name, array) in enumerate(weights.items())
                if array.ndim == 2
            }
            self.expected = {
                name: reference_dequantize(matrices[name], kind) if name in matrices else array
                for name, array in weights.items()
            }
            norms = {name: array for name, array in weights.items() if name not in matrices}
            write_gguf(self.path, norms, raw_tensors={name: (blocks, kind) for name, blocks in matrices.items()})
        else:
            self.expected = weights
            write_gguf(self.path, weights, qtype=kind)
        self._reference = None

    def reference(self):
        """transformers' model loaded from the GGUF file (float32)."""
        if self._reference is None:
            from transformers import AutoModelForCausalLM

            self._reference = AutoModelForCausalLM.from_pretrained(self.folder, gguf_file=self.path.name).eval()
        return self._reference


@pytest.fixture(scope="module")
def gguf_case(tmp_path_factory: pytest.TempPathFactory):
    cache: dict[tuple[str, bool], GGUFCase] = {}

    def get(kind: str, tied: bool = False) -> GGUFCase:
        if (kind, tied) not in cache:
            cache[kind, tied] = GGUFCase(tmp_path_factory.mktemp(f"gguf-{kind}-{tied}"), kind, tied)
        return cache[kind, tied]

    return get


def _read(path: Path) -> dict[str, torch.Tensor]:
    return {name: load() for name, load in read_gguf(path).tensors.items()}


@pytest.mark.parametrize("kind", [*QUANTIZED, *HAND_BUILT])
def test_tensors_equal_transformers_gguf_loading(gguf_case, kind):
    case = gguf_case(kind)
    ours = _read(case.path)
    theirs = case.reference().state_dict()
    assert set(ours) == set(theirs)
    for name, tensor in ours.items():
        assert tensor.dtype == torch.float32
        assert torch.equal(tensor, theirs[name]), name


@pytest.mark.parametrize("kind", QUANTIZED)
def test_tensors_are_the_weights_that_were_quantized(gguf_case, kind):
    """Independent of transformers: each tensor is the float weight it was written from, up to the type's
    rounding; q/k rows are back in transformers' order (the permuted order is far off)."""
    case = gguf_case(kind)
    ours = _read(case.path)
    assert set(ours) == set(case.expected)
    scale = max(float(np.abs(a).max()) for a in case.expected.values() if a.ndim == 2)
    for name, tensor in ours.items():
        expected = torch.from_numpy(case.expected[name])
        assert tensor.shape == expected.shape, name
        error = float((tensor - expected).abs().max())
        if kind == "F32" or expected.ndim == 1:
            assert error == 0.0, name
        else:
            assert error <= QUANTIZED[kind] * scale, (name, error)
        if name.endswith(("q_proj.weight", "k_proj.weight")):
            heads = 4 if "q_proj" in name else 2
            as_stored = torch.from_numpy(permute_rope_rows(case.expected[name], heads))
            assert float((tensor - as_stored).abs().max()) > 0.3 * scale > QUANTIZED[kind] * scale, name


@pytest.mark.parametrize("kind", HAND_BUILT)
def test_k_quants_decode_as_their_blocks_say(gguf_case, kind):
    case = gguf_case(kind)
    ours = _read(case.path)
    for name, tensor in ours.items():
        assert torch.equal(tensor, torch.from_numpy(case.expected[name])), name
    q = ours["model.layers.0.self_attn.q_proj.weight"]
    assert 0.05 < float(q.abs().max()) < 0.5 and len(q.unique()) > 1000  # varied, moderate values


@pytest.mark.parametrize(("kind", "tied"), [("F32", False), ("Q8_0", True), ("Q4_1", False), ("Q4_K", False)])
def test_greedy_equals_transformers_on_the_gguf(gguf_case, tmp_path, kind, tied):
    case = gguf_case(kind, tied)
    source = read_gguf(case.path)
    assert source.config["tie_word_embeddings"] is tied
    assert source.architecture == "LlamaForCausalLM"
    folder = convert(source, tmp_path / "converted", dtype="float32")
    model = load_model(folder, dtype="float64")
    for prompt in PROMPTS:
        expected = reference_greedy(case.reference(), prompt, LENGTH)
        assert len(set(expected)) > 3  # not a degenerate repetition
        assert specframe_outputs(model, prompt, LENGTH) == {"ar": expected, "packed": expected, "linear": expected}


def test_tokenizer_is_rebuilt_from_the_gguf_vocabulary(gguf_case, tmp_path):
    source = read_gguf(gguf_case("F32").path)
    rebuilt = Tokenizer.from_str(json.dumps(source.tokenizer_json))
    original = tokenizer()
    texts = [*TEXTS, "<|im_start|>user\nWhat is 2+2?<|im_end|>\n", "  spaces\tand\ttabs\n\n  and 007"]
    for text in texts:
        assert rebuilt.encode(text).ids == original.encode(text).ids, text
        assert rebuilt.decode(rebuilt.encode(text).ids, skip_special_tokens=False) == text
    assert source.special == {"bos_token_id": special_id("<|im_start|>"), "eos_token_id": special_id("<|endoftext|>")}
    specials = ("<|endoftext|>", "<|unused|>", "<|im_start|>", "<|im_end|>")
    assert sorted(source.control_tokens) == sorted(special_id(t) for t in specials)
    assert source.chat_template == CHATML
    model = load_model(convert(source, tmp_path / "converted", dtype="float32"), dtype="float64")
    assert model.mask_token_id == special_id("<|unused|>")
    assert set(model.eos_token_ids) == {special_id("<|endoftext|>"), special_id("<|im_end|>")}
    assert model.bos_token_id is None  # the file names a BOS but does not ask for it (no add_bos_token)
    assert model.encode_prompt(TEXTS[1]) == original.encode(TEXTS[1]).ids


@pytest.mark.parametrize(
    ("add_bos", "pre", "adds"), [(True, "smollm", True), (False, "smollm", False), (None, "smollm", False),
                                 (None, "llama-bpe", True), (False, "llama-bpe", False)],
)  # fmt: skip
def test_prompts_get_the_bos_as_llama_cpp_adds_it(tmp_path, add_bos, pre, adds):
    """``tokenizer.ggml.add_bos_token`` decides; without it llama.cpp adds BOS only for Llama 3's tokenizer."""
    metadata = {} if add_bos is None else {"tokenizer.ggml.add_bos_token": (add_bos, GGUFValueType.BOOL)}
    path = write_gguf(tmp_path / "model.gguf", random_weights(seed=4), metadata=metadata, pre=pre)
    source = read_gguf(path)
    assert source.add_bos is adds
    model = load_model(convert(source, tmp_path / "out", dtype="float32"), dtype="float64")
    bos = special_id("<|im_start|>")
    assert model.bos_token_id == (bos if adds else None)
    assert (model.encode_prompt("Hello")[0] == bos) is adds


def test_qwen3_gguf_keeps_its_row_order_and_qk_norms(tmp_path):
    """llama.cpp does not permute Qwen3's q/k rows (NeoX RoPE); its q/k norms come through, and its head size
    (attention.key_length, 128 as in the released models, not hidden / heads) is read."""
    dims = {"head_dim": 128}
    weights = random_weights(seed=6, qk_norm=True, dims=dims)
    path = write_gguf(tmp_path / "qwen3.gguf", weights, qtype="Q8_0", arch="qwen3", dims=dims)
    source, ours, reference = read_gguf_beside_transformers(path, weights)
    assert source.architecture == "Qwen3ForCausalLM" and source.family == "nemotron-labs-diffusion"
    assert source.config["head_dim"] == 128
    for name, tensor in ours.items():
        assert float((tensor - torch.from_numpy(weights[name])).abs().max()) < 0.02, name  # unpermuted
    model = load_model(convert(source, tmp_path / "out", dtype="float32"), dtype="float64")
    assert model.family == "nemotron-labs-diffusion" and model.mask_token_id == special_id("<|unused|>")
    ids = PROMPTS[2]  # clean rows under a causal mask: the AR model's next-token logits
    rows = len(ids)
    got = model.forward(
        model.new_cache(16),
        ModelCall(torch.tensor(ids), torch.arange(rows), torch.ones(rows, rows, dtype=torch.bool).tril()),
    )
    with torch.no_grad():
        expected = reference.double()(torch.tensor([ids])).logits[0]
    assert (got - expected).abs().max() < 1e-5 < expected.abs().max()
