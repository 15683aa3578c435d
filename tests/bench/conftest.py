"""Fixtures of the bench tests: a tiny random checkpoint per family, loaded once, on one CPU thread."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from specframe.models import load_model
from specframe.testing.models import NEMOTRON, SETDLM, write_random_checkpoint

# The bench tests time nothing that matters; one thread avoids oversubscribing shared CI machines.
torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tiny_setdlm_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_random_checkpoint(SETDLM, tmp_path_factory.mktemp("bench-setdlm"), seed=3)


@pytest.fixture(scope="session")
def tiny_nemotron_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_random_checkpoint(NEMOTRON, tmp_path_factory.mktemp("bench-nemotron"), seed=4)


@pytest.fixture(scope="session")
def tiny_setdlm(tiny_setdlm_dir: Path):
    return load_model(tiny_setdlm_dir)
