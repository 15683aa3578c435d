"""Environment switches (SPECFRAME_DEBUG, SPECFRAME_CPU_TUNING) read one way: on, off, unset, or a named error."""

from __future__ import annotations

import pytest

from specframe.envflags import env_flag
from specframe.errors import ConfigError
from specframe.models import cpu

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


def test_cpu_tuning_is_turned_off_only_by_an_off_value_and_refuses_a_typo(monkeypatch):
    monkeypatch.delenv(cpu.SWITCH, raising=False)
    assert cpu.enabled() is True
    for value in ("", "1", "on"):
        monkeypatch.setenv(cpu.SWITCH, value)
        assert cpu.enabled() is True, value
    for value in ("0", "off", "false", "NO"):
        monkeypatch.setenv(cpu.SWITCH, value)
        assert cpu.enabled() is False, value
        assert cpu.enabled(True) is True  # an explicit choice wins
    monkeypatch.setenv(cpu.SWITCH, "abc")
    with pytest.raises(ConfigError, match="SPECFRAME_CPU_TUNING='abc' is not a switch"):
        cpu.enabled()
