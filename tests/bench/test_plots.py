"""The comparison plots: readable names, no bare-line panels, a figure that is not a strip."""

from __future__ import annotations

import pytest

from specframe.bench.plots import plot_comparisons, tick_label

LONG = "adaptive-packed:cooldown=4,min_width=2,patience=2"


def estimate(value, low, high):
    return {"estimate": value, "low": low, "high": high}


def summary(accuracy=(0.0, 0.0, 0.0)):
    methods = [{"method": "ar", "schedule": "ar", "width": None}]
    comparisons = []
    for schedule in ("packed", "kbranch:k=3", LONG):
        for width in (2, 4):
            method = f"{schedule}/w{width}"
            methods.append({"method": method, "schedule": schedule, "width": width})
            comparisons.append(
                {
                    "method": method,
                    "baseline": "ar",
                    "throughput_ratio": estimate(1.2, 1.1, 1.3),
                    "tokens_per_nfe_ratio": estimate(1.4, 1.3, 1.5),
                    "time_per_nfe_ratio": estimate(1.1, 1.0, 1.2),
                    "wall_diff_s": estimate(-0.01, -0.02, 0.0),
                    "accuracy_diff_points": estimate(*accuracy),
                }
            )
    return {"baseline": "ar", "methods": methods, "comparisons": comparisons}


def test_long_names_are_wrapped_at_their_options():
    assert tick_label("packed") == "packed"
    lines = tick_label(LONG).splitlines()
    assert "".join(lines) == LONG and len(lines) > 1 and max(map(len, lines)) <= 17


def test_a_panel_with_no_difference_anywhere_is_left_out(tmp_path):
    written = plot_comparisons(summary(), tmp_path)
    assert tmp_path / "plots" / "accuracy_diff_points.png" not in written
    assert tmp_path / "plots" / "throughput_ratio.png" in written
    assert tmp_path / "plots" / "accuracy_diff_points.png" in plot_comparisons(summary((5.0, 0.0, 10.0)), tmp_path)


@pytest.mark.parametrize("accuracy", [(0.0, 0.0, 0.0), (5.0, 0.0, 10.0)])
def test_the_combined_figure_is_a_grid_not_a_strip(tmp_path, accuracy):
    from PIL import Image

    plot_comparisons(summary(accuracy), tmp_path)
    width, height = Image.open(tmp_path / "comparison.png").size
    assert width / height < 2.5  # five panels in a row made a 2160x408 strip
