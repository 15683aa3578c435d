"""Shared fixtures: small random checkpoints of both families, written once per test session."""

from __future__ import annotations

from pathlib import Path

import pytest

from specframe.models import load_model
from specframe.testing.models import NEMOTRON, SETDLM, write_random_checkpoint


@pytest.fixture(scope="session")
def nemotron_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_random_checkpoint(NEMOTRON, tmp_path_factory.mktemp("nemotron"), seed=1, lora_rank=4)


@pytest.fixture(scope="session")
def nemotron_mlp_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``nemotron_dir``'s weights and ``o_proj`` adapter, plus a rank-6 ``down_proj`` adapter (``rank_pattern``)."""
    folder = tmp_path_factory.mktemp("nemotron-mlp")
    return write_random_checkpoint(NEMOTRON, folder, seed=1, lora_rank=4, lora_mlp_rank=6)


@pytest.fixture(scope="session")
def setdlm_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_random_checkpoint(SETDLM, tmp_path_factory.mktemp("setdlm"), seed=2)


@pytest.fixture(scope="session")
def nemotron64(nemotron_dir: Path):
    return load_model(nemotron_dir, dtype="float64")


@pytest.fixture(scope="session")
def setdlm64(setdlm_dir: Path):
    return load_model(setdlm_dir, dtype="float64")


@pytest.fixture(params=["nemotron", "setdlm"])
def model64(request: pytest.FixtureRequest):
    return request.getfixturevalue(f"{request.param}64")
