"""Fixtures of the training tests: the plugin registered, one torch thread, and a tiny converted Llama."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import specframe_training

from specframe.testing.plugins import registered_fixture, torch_threads

# The helpers that write a tiny random transformers Llama and convert it live in the specframe repository's
# tests/ folder (shared with its conversion tests), which these tests run from.
sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tests"))

from converted_models import convert_tiny_llama, write_tiny_llama  # noqa: E402

# `specframe train` and `specframe train-drafter` come from this plugin: registered for the whole session
# unless its entry point already is (see SPECFRAME_LOAD_PLUGINS).
training_registered = registered_fixture(specframe_training, "training")


@pytest.fixture(autouse=True, scope="session")
def one_thread():
    """Tiny models run fastest on one thread; several threads on a busy machine are many times slower."""
    with torch_threads(1):
        yield


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random transformers Llama folder with a ChatML tokenizer."""
    return write_tiny_llama(tmp_path_factory.mktemp("tiny-llama") / "llama")


@pytest.fixture(scope="session")
def converted(tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Llama converted into a float32 Nemotron-layout folder (treat as read-only: copy to change)."""
    return convert_tiny_llama(tiny_llama, tmp_path_factory.mktemp("converted") / "model")
