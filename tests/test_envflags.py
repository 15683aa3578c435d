"""Environment switches (SPECFRAME_DEBUG, SPECFRAME_PREPACK) read one way: on, off, unset, or a named error."""

from __future__ import annotations

import pytest
import torch
from specframe.models.kernels import prepack_allowed

from specframe.envflags import env_flag
from specframe.errors import ConfigError

VARIABLE = "SPECFRAME_TEST_SWITCH"


@pytest.mark.parametrize("value", ["1", "true", "True", "YES", "on", " On "])
def test_on_values(monkeypatch, value):
    monkeypatch.setenv(VARIABLE, value)
    assert env_flag(VARIABLE) is True and env_flag(VARIABLE, default=True) is True


@pytest.mark.parametrize("value", ["0", "false", "FALSE", "no", "Off", " 0 "])
def test_off_values(monkeypatch, value):
    monkeypatch.setenv(VARIABLE, value)
    assert env_flag(VARIABLE) is False and env_flag(VARIABLE, default=True) is False


@pytest.mark.parametrize("value", [None, "", "  "])
def test_unset_or_empty_is_the_default(monkeypatch, value):
    if value is None:
        monkeypatch.delenv(VARIABLE, raising=False)
    else:
        monkeypatch.setenv(VARIABLE, value)
    assert env_flag(VARIABLE) is False and env_flag(VARIABLE, default=True) is True


@pytest.mark.parametrize("value", ["abc", "2", "-1", "y", "enabled", "0x1"])
def test_anything_else_is_an_error_naming_the_variable(monkeypatch, value):
    monkeypatch.setenv(VARIABLE, value)
    with pytest.raises(ConfigError, match=rf"environment variable {VARIABLE}='{value}' is not a switch; set it to 1"):
        env_flag(VARIABLE)


def test_prepack_is_turned_off_only_by_an_off_value_and_refuses_a_typo(monkeypatch):
    cpu, small = torch.device("cpu"), 1024
    monkeypatch.delenv("SPECFRAME_PREPACK", raising=False)
    default = prepack_allowed(small, cpu, torch.float32)  # on where oneDNN is available
    for value in ("", "1", "on"):
        monkeypatch.setenv("SPECFRAME_PREPACK", value)
        assert prepack_allowed(small, cpu, torch.float32) == default, value
    for value in ("0", "off", "false", "NO"):
        monkeypatch.setenv("SPECFRAME_PREPACK", value)
        assert prepack_allowed(small, cpu, torch.float32) is False, value
    monkeypatch.setenv("SPECFRAME_PREPACK", "abc")  # used to be read as on
    with pytest.raises(ConfigError, match="SPECFRAME_PREPACK='abc' is not a switch"):
        prepack_allowed(small, cpu, torch.float32)
