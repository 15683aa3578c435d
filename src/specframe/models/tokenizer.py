"""``tokenizer.json`` files, read with the ``tokenizers`` package, and their fit to a model."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from tokenizers import Tokenizer

from specframe.errors import CheckpointError

TOKENIZER_NAME = "tokenizer.json"


class HubTokenizer:
    """A Hugging Face ``tokenizer.json`` tokenizer (implements :class:`~specframe.models.base.TextTokenizer`).

    Args:
        tokenizer: The loaded ``tokenizers.Tokenizer``.
    """

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.backend = tokenizer
        vocab = tokenizer.get_vocab(with_added_tokens=True)
        self._size = max(vocab.values(), default=-1) + 1

    @classmethod
    def from_file(cls, path: Path) -> HubTokenizer:
        """Read ``path``.

        Raises:
            CheckpointError: If the file cannot be parsed.
        """
        try:
            return cls(Tokenizer.from_file(str(path)))
        except Exception as exc:  # tokenizers raises a bare Exception for malformed files
            raise CheckpointError(f"cannot read tokenizer {path} ({exc}); restore or re-download it") from exc

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` without special tokens added."""
        return self.backend.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ``ids``, special tokens included."""
        return self.backend.decode(list(ids), skip_special_tokens=False)

    @property
    def vocab_size(self) -> int:
        """One more than the largest id the tokenizer can produce (added tokens included)."""
        return self._size

    def token_to_id(self, token: str) -> int | None:
        """The id of ``token``, or ``None`` if the vocabulary lacks it."""
        return self.backend.token_to_id(token)


def load_tokenizer(folder: Path, vocab_size: int) -> HubTokenizer | None:
    """The folder's ``tokenizer.json``, checked against the model's vocabulary; ``None`` if there is none.

    Raises:
        CheckpointError: If the tokenizer can produce ids the model has no embedding for.
    """
    path = folder / TOKENIZER_NAME
    if not path.is_file():
        return None
    tokenizer = HubTokenizer.from_file(path)
    if tokenizer.vocab_size > vocab_size:
        raise CheckpointError(
            f"tokenizer {path} produces ids up to {tokenizer.vocab_size - 1} but the model's vocabulary has "
            f"only {vocab_size} entries (vocab_size in config.json): the tokenizer belongs to another model; "
            "replace tokenizer.json with the model's own"
        )
    return tokenizer
