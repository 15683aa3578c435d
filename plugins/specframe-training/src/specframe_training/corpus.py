"""The offline training corpus: the CPython standard-library source, split by file, and its BPE tokenizers.

The corpus is every ``.py`` file under ``sysconfig.get_paths()["stdlib"]`` except installed third-party
packages (``site-packages``), the test suites (``test``, ``tests``, ``idle_test`` folders), the code-page
tables of ``encodings`` (data, not code), machine-generated ``_sysconfigdata*`` files, files that are not
UTF-8 and files over :data:`MAX_FILE_BYTES`. A file is held out when the SHA-256 of its path relative to the
standard-library folder falls in the first :data:`HELDOUT_PERCENT` percent, so the split is the same on
every machine and for every Python version (files one version lacks are simply absent).

Each family gets its own byte-level BPE tokenizer, trained with ``tokenizers`` on the training files only,
with the family's special tokens where its real tokenizer puts them: Nemotron-Labs-Diffusion reserves a
block of special ids first (``<s>`` 1, ``</s>`` 2, ``<|im_end|>`` 11, ``[MASK]`` 100, as Mistral's tekken
does), SetDLM appends Qwen3's special tokens after the BPE vocabulary (``<|endoftext|>``, ...,
``<|fim_middle|>``, ...).
"""

from __future__ import annotations

import hashlib
import sysconfig
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from specframe.errors import ConfigError
from specframe.models import nemotron, setdlm

HELDOUT_PERCENT = 5
MAX_FILE_BYTES = 400_000
EXCLUDED_FOLDERS = frozenset({"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"})
EXCLUDED_PREFIXES = ("encodings/", "_sysconfigdata")


def stdlib_root() -> Path:
    """The folder of the running interpreter's standard library."""
    return Path(sysconfig.get_paths()["stdlib"])


def is_heldout(relative: str) -> bool:
    """Whether the file at ``relative`` (a POSIX path inside the standard library) is held out."""
    digest = hashlib.sha256(relative.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") % 100 < HELDOUT_PERCENT


@dataclass(frozen=True)
class SourceFile:
    """One corpus file.

    Attributes:
        relative: POSIX path relative to the standard-library folder.
        text: File contents.
    """

    relative: str
    text: str

    @property
    def heldout(self) -> bool:
        """Whether this file belongs to the held-out split."""
        return is_heldout(self.relative)


def corpus_files(root: Path | None = None) -> list[SourceFile]:
    """Every corpus file under ``root`` (default: :func:`stdlib_root`), sorted by relative path."""
    root = root or stdlib_root()
    files = []
    for path in sorted(root.rglob("*.py")):
        relative = path.relative_to(root).as_posix()
        if EXCLUDED_FOLDERS.intersection(relative.split("/")[:-1]) or relative.startswith(EXCLUDED_PREFIXES):
            continue
        try:
            if path.stat().st_size > MAX_FILE_BYTES:
                continue
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        if text.strip():
            files.append(SourceFile(relative, text))
    return files


def split_files(files: Iterable[SourceFile]) -> tuple[list[SourceFile], list[SourceFile]]:
    """``(train, heldout)`` by :func:`is_heldout`."""
    train, heldout = [], []
    for file in files:
        (heldout if file.heldout else train).append(file)
    return train, heldout


#: Learned BPE entries every tokenizer has at least: the 256-byte alphabet and as many merges.
MIN_BPE_ENTRIES = 512


def smallest_vocab(family: str) -> int:
    """The smallest ``vocab_size`` :func:`train_tokenizer` accepts for ``family``: its special ids plus the BPE entries.

    Raises:
        ValueError: For an unknown family.
    """
    if family == nemotron.FAMILY:
        return nemotron.RESERVED_IDS + MIN_BPE_ENTRIES
    if family == setdlm.FAMILY:
        return len(setdlm.SPECIAL_TOKENS) + MIN_BPE_ENTRIES
    raise ValueError(f"unknown family {family!r}")


def train_tokenizer(family: str, texts: Sequence[str], vocab_size: int) -> Tokenizer:
    """A byte-level BPE tokenizer of exactly ``vocab_size`` ids with ``family``'s special-token layout.

    Args:
        family: ``"nemotron-labs-diffusion"`` or ``"setdlm"``.
        texts: Training texts.
        vocab_size: Total ids, special tokens included.

    Raises:
        ValueError: For an unknown family or a vocabulary too small for the byte alphabet.
    """
    if family == nemotron.FAMILY:
        specials = [nemotron.SPECIAL_TOKENS.get(i, f"<SPECIAL_{i}>") for i in range(nemotron.RESERVED_IDS)]
        bpe_size = vocab_size
    elif family == setdlm.FAMILY:
        specials, bpe_size = [], vocab_size - len(setdlm.SPECIAL_TOKENS)
    else:
        raise ValueError(f"unknown family {family!r}")
    if vocab_size < smallest_vocab(family):
        raise ValueError(
            f"vocab_size {vocab_size} leaves too few BPE entries: {family} needs vocab_size >= {smallest_vocab(family)}"
        )
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=bpe_size,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer, length=len(texts))
    if family == setdlm.FAMILY:
        tokenizer.add_special_tokens(list(setdlm.SPECIAL_TOKENS))
    size = tokenizer.get_vocab_size(with_added_tokens=True)
    if size != vocab_size:  # a corpus too small to fill the vocabulary
        raise ConfigError(
            f"vocab_size {vocab_size}: the training corpus yields a tokenizer of only {size} ids; give a vocab_size "
            f"of at most {size}"
        )
    return tokenizer


def encode_documents(
    tokenizer: Tokenizer, texts: Sequence[str], *, bos: int | None, eos: int, batch: int = 256
) -> list[torch.Tensor]:
    """Each text as ``[bos?] + tokens + [eos]`` (int32 tensors)."""
    documents = []
    for start in range(0, len(texts), batch):
        for encoding in tokenizer.encode_batch(list(texts[start : start + batch]), add_special_tokens=False):
            ids = ([bos] if bos is not None else []) + encoding.ids + [eos]
            documents.append(torch.tensor(ids, dtype=torch.int32))
    return documents


def spread_windows(stream: torch.Tensor, length: int, count: int | None = None) -> torch.Tensor:
    """Non-overlapping ``[N, length]`` windows of a 1-D token stream (the tail shorter than a window is dropped).

    With ``count``, only ``count`` windows spread evenly over the stream (deterministic).
    """
    total = stream.numel() // length
    windows = stream[: total * length].view(total, length)
    if count is not None and count < total:
        windows = windows[torch.linspace(0, total - 1, count).round().long()]
    return windows
