"""Make sure the plugin is registered with specframe's process-wide plugin host, whatever loaded it."""

from __future__ import annotations

import pytest
import specframe_adaptive_packed

from specframe.plugin_testing import torch_threads
from specframe.plugins import plugin_registered


# --8<-- [start:registered]
@pytest.fixture(autouse=True)
def adaptive_packed_registered():
    """The plugin module, registered for each test unless its entry point already did (see SPECFRAME_LOAD_PLUGINS)."""
    with plugin_registered(specframe_adaptive_packed, "adaptive_packed"):
        yield


# --8<-- [end:registered]


@pytest.fixture(autouse=True, scope="session")
def one_thread():
    """Tiny models run fastest on one thread; several threads on a busy machine are many times slower."""
    with torch_threads(1):
        yield
