"""Test-wide settings: isolate the run from whatever plugins are installed in the environment."""

import os

# Entry-point plugins installed in this environment must not leak into tests; tests that exercise
# entry-point discovery build their own plugin host with an explicit selection.
os.environ["SPECFRAME_LOAD_PLUGINS"] = ""
