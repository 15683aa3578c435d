"""Test-wide settings: isolate the run from whatever plugins are installed in the environment."""

import os
import pathlib
import sys
import tempfile

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
