"""Fixtures of the drafter tests: a tiny random Llama, converted once per session."""

from __future__ import annotations

from pathlib import Path

import pytest

from converted_models import convert_tiny_llama, write_tiny_llama


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random transformers Llama folder with a ChatML tokenizer."""
    return write_tiny_llama(tmp_path_factory.mktemp("tiny-llama") / "llama")


@pytest.fixture(scope="session")
def converted(tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Llama converted into a float32 Nemotron-layout folder (treat as read-only: copy to change)."""
    return convert_tiny_llama(tiny_llama, tmp_path_factory.mktemp("converted") / "model")
