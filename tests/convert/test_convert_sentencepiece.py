"""SentencePiece GGUF tokenizers (``tokenizer.ggml.model`` ``llama``, Llama 2's): rebuilt as a ``tokenizer.json``.

The GGUF holds a Llama-2-style vocabulary the test makes up: ``<unk>``, ``<s>``, ``</s>``, a spare control
token, the 256 byte pieces, then text pieces (spaces written ``▁``) by falling score. The oracle is
SentencePiece's BPE as llama.cpp runs it, written out here from its description: the text gets a leading space,
spaces become ``▁``, then the adjacent pair whose joined piece is in the vocabulary with the highest score is
merged (the leftmost on a tie) until none is, and a piece not in the vocabulary falls back to its UTF-8 bytes.
"""

from __future__ import annotations

import functools
import json
import random
from collections import Counter

import pytest
from convert_helpers import TEXTS, random_weights, write_gguf
from gguf import GGUFValueType
from tokenizers import Tokenizer

from specframe.convert import convert
from specframe.convert.gguf_source import read_gguf
from specframe.errors import CheckpointError
from specframe.models import load_model

SPACE = "\u2581"
NORMAL, UNKNOWN, CONTROL, BYTE = 1, 2, 3, 6
SAMPLES = [*TEXTS, "Zürich: naïve café 😀", "  two  spaces\tand a tab\nand a newline", "jumps jumps"]


@functools.lru_cache(maxsize=1)
def vocabulary() -> tuple[list[str], list[float], list[int]]:
    """``(tokens, scores, types)``: the 150 commonest 2-5 character pieces of the test texts (overlapping, so
    that which pair merges first matters), scored at random above the single characters."""
    words = [SPACE + word for text in TEXTS for word in text.split()]
    counts = Counter(w[i : i + n] for w in words for n in range(2, 6) for i in range(len(w) - n + 1))
    merged = [piece for piece, _ in sorted(counts.items(), key=lambda item: (-item[1], item[0]))[:150]]
    characters = sorted({c for word in words for c in word} | set("Tq"))
    pieces = merged + characters
    tokens = ["<unk>", "<s>", "</s>", "<spare>", *(f"<0x{b:02X}>" for b in range(256)), *pieces]
    types = [UNKNOWN, CONTROL, CONTROL, CONTROL, *[BYTE] * 256, *[NORMAL] * len(pieces)]
    ranks = [*random.Random(0).sample(range(len(merged)), len(merged)), *range(len(merged), len(pieces))]
    scores = [0.0] * (4 + 256) + [-float(rank) for rank in ranks]
    return tokens, scores, types


def sentencepiece_ids(text: str, prefix: bool = True) -> list[int]:
    tokens, scores, types = vocabulary()
    ids = {token: index for index, token in enumerate(tokens)}
    symbols = list((SPACE if prefix else "") + text.replace(" ", SPACE))
    while True:
        best = None
        for i in range(len(symbols) - 1):
            joined = ids.get(symbols[i] + symbols[i + 1])
            if joined is not None and types[joined] == NORMAL and (best is None or scores[joined] > best[0]):
                best = (scores[joined], i)
        if best is None:
            break
        i = best[1]
        symbols[i : i + 2] = [symbols[i] + symbols[i + 1]]
    out = []
    for symbol in symbols:
        out += [ids[symbol]] if symbol in ids else [ids[f"<0x{b:02X}>"] for b in symbol.encode()]
    return out


def _gguf(path, **changes):
    tokens, scores, types = vocabulary()
    metadata = {
        "llama.vocab_size": (len(tokens), GGUFValueType.UINT32),
        "tokenizer.ggml.model": ("llama", GGUFValueType.STRING),
        "tokenizer.ggml.pre": None,
        "tokenizer.ggml.merges": None,
        "tokenizer.ggml.tokens": (tokens, GGUFValueType.ARRAY),
        "tokenizer.ggml.scores": (scores, GGUFValueType.ARRAY),
        "tokenizer.ggml.token_type": (types, GGUFValueType.ARRAY),
        "tokenizer.ggml.bos_token_id": (1, GGUFValueType.UINT32),
        "tokenizer.ggml.eos_token_id": (2, GGUFValueType.UINT32),
        "tokenizer.ggml.unknown_token_id": (0, GGUFValueType.UINT32),
        "tokenizer.chat_template": None,
        **changes,
    }
    weights = random_weights(seed=8, dims={"vocab_size": len(tokens)})
    return write_gguf(path, weights, metadata=metadata)


@pytest.fixture(scope="module")
def spm_gguf(tmp_path_factory):
    return _gguf(tmp_path_factory.mktemp("spm") / "llama2.gguf")


def test_vocabulary_is_llama_2_like():
    tokens, _, _ = vocabulary()
    assert len([t for t in tokens if len(t) > 1 and not t.startswith("<")]) == 150  # merged pieces to rank
    assert any(t.startswith(SPACE) and len(t) > 2 for t in tokens)
    ids = sentencepiece_ids(SAMPLES[3])
    assert any(tokens[i].startswith("<0x") for i in ids)  # ü, ï, é and the emoji fall back to bytes
    lengths = [len(tokens[i]) for text in SAMPLES for i in sentencepiece_ids(text)]
    assert max(lengths) > 2 and sum(n > 1 for n in lengths) > 20  # text pieces, not single characters


@pytest.mark.parametrize("text", SAMPLES)
def test_rebuilt_tokenizer_encodes_as_sentencepiece_and_decodes_back(spm_gguf, text):
    rebuilt = Tokenizer.from_str(json.dumps(read_gguf(spm_gguf).tokenizer_json))
    ids = rebuilt.encode(text, add_special_tokens=False).ids
    assert ids == sentencepiece_ids(text)
    assert rebuilt.decode(ids, skip_special_tokens=False) == text


def test_converted_model_prepends_bos_and_keeps_the_specials(spm_gguf, tmp_path):
    source = read_gguf(spm_gguf)
    assert source.add_bos is True  # llama.cpp's default for SentencePiece vocabularies
    assert source.special == {"bos_token_id": 1, "eos_token_id": 2, "unk_token_id": 0}
    assert sorted(source.control_tokens) == [1, 2, 3]
    model = load_model(convert(source, tmp_path / "out", dtype="float32"), dtype="float64")
    assert model.mask_token_id == 3 and model.eos_token_ids == (2,) and model.bos_token_id == 1
    assert model.encode_prompt(TEXTS[0]) == [1, *sentencepiece_ids(TEXTS[0])]
    assert model.tokenizer.decode(sentencepiece_ids(TEXTS[1])) == TEXTS[1]


def test_without_the_space_prefix(tmp_path):
    path = _gguf(tmp_path / "m.gguf", **{"tokenizer.ggml.add_space_prefix": (False, GGUFValueType.BOOL)})
    rebuilt = Tokenizer.from_str(json.dumps(read_gguf(path).tokenizer_json))
    text = "over the lazy dog"
    ids = rebuilt.encode(text, add_special_tokens=False).ids
    assert ids == sentencepiece_ids(text, prefix=False) != sentencepiece_ids(text)
    assert rebuilt.decode(ids) == text


def test_scores_must_match_the_tokens(tmp_path):
    path = _gguf(tmp_path / "m.gguf", **{"tokenizer.ggml.scores": ([0.0, 1.0], GGUFValueType.ARRAY)})
    with pytest.raises(CheckpointError, match="tokenizer.ggml.scores has not one score per token"):
        read_gguf(path)
