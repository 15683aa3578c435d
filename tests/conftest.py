"""Test-wide settings: isolate the run from whatever plugins are installed in the environment."""

import os
import pathlib
import sys
import tempfile

import pytest
import torch

# Entry-point plugins installed in this environment must not leak into tests; tests that exercise
# entry-point discovery build their own plugin host with an explicit selection.
os.environ["SPECFRAME_LOAD_PLUGINS"] = ""

# Cost models calibrated by tests (width "auto" without an injected cost) go to a throw-away folder, not
# the user's cache; subprocesses inherit it.
os.environ["SPECFRAME_CACHE_DIR"] = tempfile.mkdtemp(prefix="specframe-test-cache-")

# Test helpers (oracle models, fixtures) live beside the tests.
sys.path.insert(0, str(pathlib.Path(__file__).parent))

# The test models are tiny: one thread avoids oversubscribing small CI machines (and is faster here).
torch.set_num_threads(1)


@pytest.fixture
def no_network(monkeypatch):
    """The Hub is unreachable (a closed local port), and offline mode is not set: a machine without network.

    Returns the ``local_files_only`` argument of every ``hf_hub_download`` and ``snapshot_download`` call made.
    """
    import huggingface_hub

    for name in ("HF_HUB_OFFLINE", "HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)  # as read when first imported
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    calls = []

    def recorded(real):
        def call(*args, **kwargs):
            calls.append(kwargs.get("local_files_only"))
            return real(*args, **kwargs)

        return call

    for name in ("hf_hub_download", "snapshot_download"):
        monkeypatch.setattr(huggingface_hub, name, recorded(getattr(huggingface_hub, name)))
    return calls
