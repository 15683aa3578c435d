import pytest
import specframe_ablation_orders

from specframe.cli import main
from specframe.plugins import plugin_registered


@pytest.fixture(autouse=True)
def registered():
    with plugin_registered(specframe_ablation_orders, "ablation_orders"):
        yield


def test_the_command_prints_the_verification_order(capsys):
    assert main(["ablation-order", "7", "5", "6", "--score", "5=0.9", "--score", "6=0.1"]) == 0
    assert capsys.readouterr().out == "6 5 7\n"


def test_help_lists_the_command(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "ablation-order" in capsys.readouterr().out


def test_a_malformed_score_is_a_one_line_error(capsys):
    assert main(["ablation-order", "5", "--score", "5:0.9"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: --score takes POSITION=SCORE") and err.count("\n") == 1
