"""``tokenizer.json`` files, read with the ``tokenizers`` package, and their fit to a model."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from tokenizers import Tokenizer

from specframe.errors import CheckpointError, InputError

TOKENIZER_NAME = "tokenizer.json"


class HubTokenizer:
    """A Hugging Face ``tokenizer.json`` tokenizer (implements :class:`~specframe.models.base.TextTokenizer`).

    Args:
        tokenizer: The loaded ``tokenizers.Tokenizer``.
        chat_template: The model's Jinja chat template, if it has one (see :mod:`specframe.models.chat`).
    """

    def __init__(self, tokenizer: Tokenizer, chat_template: str | None = None) -> None:
        self.backend = tokenizer
        self.chat_template = chat_template
        vocab = tokenizer.get_vocab(with_added_tokens=True)
        self._size = max(vocab.values(), default=-1) + 1

    @classmethod
    def from_file(cls, path: Path) -> HubTokenizer:
        """Read ``path``.

        Raises:
            CheckpointError: If the file cannot be parsed, saying whether it is not JSON at all or JSON that is
                not a tokenizer (``tokenizers`` words both as a syntax error).
        """
        try:
            return cls(Tokenizer.from_file(str(path)))
        except Exception as exc:  # tokenizers raises a bare Exception for malformed files
            raise CheckpointError(f"{_tokenizer_problem(path, exc)}; restore or re-download it") from exc

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` without special tokens added.

        Raises:
            InputError: If ``text`` is not valid Unicode (it holds a lone surrogate, which is what Python
                makes of bytes that are not UTF-8 in a command-line argument or a file read leniently).
        """
        try:
            return self.backend.encode(text, add_special_tokens=False).ids
        except TypeError:
            problem = unicode_problem(text) if isinstance(text, str) else None
            if problem:
                raise InputError(f"{problem}; give UTF-8 text (or token ids)") from None
            raise

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
    from specframe.models.chat import read_chat_template

    tokenizer = HubTokenizer.from_file(path)
    tokenizer.chat_template = read_chat_template(folder)
    if tokenizer.vocab_size > vocab_size:
        raise CheckpointError(
            f"tokenizer {path} produces ids up to {tokenizer.vocab_size - 1} but the model's vocabulary has "
            f"only {vocab_size} entries (vocab_size in config.json): the tokenizer belongs to another model; "
            "replace tokenizer.json with the model's own"
        )
    return tokenizer


def _tokenizer_problem(path: Path, exc: Exception) -> str:
    """Why ``tokenizers`` could not read ``path``: unreadable, not JSON, or JSON that is not a tokenizer."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError):
        return f"cannot read tokenizer {path} ({exc})"
    except ValueError as syntax:
        return f"tokenizer {path} is not valid JSON ({syntax})"
    if not isinstance(data, dict) or not isinstance(data.get("model"), dict):
        return (
            f"{path} is JSON but not a tokenizer.json (no 'model' object: it is not a file saved by the Hugging Face "
            "tokenizers library)"
        )
    return f"tokenizer {path} is not a valid tokenizer.json ({exc})"


def unicode_problem(text: str) -> str | None:
    """Why ``text`` cannot be encoded as UTF-8 (a lone surrogate, from undecodable bytes), or ``None``."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return (
            f"the text is not valid Unicode: character {exc.start} is a lone surrogate ({text[exc.start]!r}), "
            "which is what bytes that are not UTF-8 turn into"
        )
    return None
