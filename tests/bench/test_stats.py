import numpy as np
import pytest

from specframe.bench.stats import PairedBootstrap, bootstrap_sums, percentile_interval, resample_counts


def test_resample_counts_rows_sum_to_n_and_are_reproducible():
    chunks = list(resample_counts(7, 50, seed=3))
    counts = np.concatenate(chunks)
    assert counts.shape == (50, 7)
    assert (counts.sum(axis=1) == 7).all()
    assert np.array_equal(counts, np.concatenate(list(resample_counts(7, 50, seed=3))))
    assert not np.array_equal(counts, np.concatenate(list(resample_counts(7, 50, seed=4))))


def test_bootstrap_sums_match_explicit_index_resampling():
    rng = np.random.default_rng(0)
    columns = rng.random((9, 3))
    sums = bootstrap_sums(columns, 200, seed=5)
    indices = np.random.default_rng(5).integers(0, 9, size=(200, 9))  # the same draws, written out
    expected = columns[indices].sum(axis=1)
    np.testing.assert_allclose(sums, expected, rtol=1e-12)


def test_constant_ratio_gives_zero_width_interval_at_the_ratio():
    rng = np.random.default_rng(1)
    tokens = rng.integers(50, 500, size=40).astype(float)
    wall = rng.random(40) + 0.1
    boot = PairedBootstrap({"t_a": tokens, "w_a": wall, "t_b": tokens, "w_b": 2 * wall}, resamples=2000, seed=0)
    ratio = boot.estimate(lambda s: (s["t_a"] / s["w_a"]) / (s["t_b"] / s["w_b"]))
    assert ratio.estimate == pytest.approx(2.0)
    assert ratio.low == pytest.approx(2.0, abs=1e-12)
    assert ratio.high == pytest.approx(2.0, abs=1e-12)


def test_identical_methods_see_the_same_indices():
    rng = np.random.default_rng(2)
    x = rng.random(30) * 10
    boot = PairedBootstrap({"a": x, "b": x.copy(), "n": np.ones(30)}, resamples=1000, seed=9)
    assert np.array_equal(boot.draws("a"), boot.draws("b"))
    diff = boot.estimate(lambda s: s["a"] / s["n"] - s["b"] / s["n"])
    assert (diff.estimate, diff.low, diff.high) == (0.0, 0.0, 0.0)


def test_known_paired_shift_is_recovered():
    rng = np.random.default_rng(3)
    base = rng.lognormal(0.0, 1.0, size=200)  # widely varying prompts: unpaired intervals would be wide
    shift = 0.25 + 0.01 * rng.standard_normal(200)
    boot = PairedBootstrap({"m": base + shift, "b": base, "n": np.ones(200)}, resamples=4000, seed=0)
    diff = boot.estimate(lambda s: (s["m"] - s["b"]) / s["n"])
    assert diff.estimate == pytest.approx(shift.mean())
    assert diff.contains(0.25)
    assert diff.high - diff.low < 0.01  # pairing removes the prompt-to-prompt variance


def test_undefined_resamples_are_left_out():
    assert percentile_interval(np.array([np.nan, np.inf, 1.0, 3.0]), 0.5) == (1.5, 2.5)
    low, high = percentile_interval(np.array([np.nan, np.nan]))
    assert np.isnan(low) and np.isnan(high)


def test_bootstrap_of_a_ratio_over_hundreds_of_prompts_covers_the_population_value():
    # 40 quantities x 500 prompts x 20,000 resamples at once (the size of a full paper-protocol summary).
    rng = np.random.default_rng(4)
    quantities = {f"q{i}": rng.random(500) + (1.0 if i == 0 else 0.5) for i in range(40)}
    boot = PairedBootstrap(quantities, resamples=20_000, seed=0)
    assert boot.draws("q0").shape == (20_000,)
    ratio = boot.estimate(lambda s: s["q0"] / s["q1"])  # population ratio of means: 1.5 / 1.0
    assert ratio.low < 1.5 < ratio.high
    assert ratio.low < ratio.estimate < ratio.high and ratio.high - ratio.low < 0.15
