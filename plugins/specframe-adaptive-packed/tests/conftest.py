"""Make sure the plugin is registered with specframe's process-wide plugin host, whatever loaded it."""

from __future__ import annotations

import pytest
import specframe_adaptive_packed

from specframe.testing.plugins import registered_fixture, torch_threads

# --8<-- [start:registered]
# The plugin module, registered for the whole session (so module-scoped fixtures see it too) unless its entry
# point already did (see SPECFRAME_LOAD_PLUGINS).
adaptive_packed_registered = registered_fixture(specframe_adaptive_packed, "adaptive_packed")
# --8<-- [end:registered]


@pytest.fixture(autouse=True, scope="session")
def one_thread():
    """Tiny models run fastest on one thread; several threads on a busy machine are many times slower."""
    with torch_threads(1):
        yield
