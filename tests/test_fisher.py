"""probes.fisher: the Fisher separation F(t) of classes on U against closed forms, its crossing, and the
reason it exists (anisotropic spread that a linear read-out ignores)."""

import math
from statistics import NormalDist

import numpy as np
import pytest

from probes.fisher import FISHER_LEVEL, READOUT_LEVEL, fisher_curve, fisher_tcross, readout_tcross, separation


def test_level_is_where_a_gaussian_pair_is_read_ninety_percent_right():
    assert FISHER_LEVEL == pytest.approx(2.5631, abs=1e-4) and NormalDist().cdf(-FISHER_LEVEL / 2) == pytest.approx(0.1)


def test_curve_matches_the_closed_form_of_two_classes_drifting_apart_in_whitened_units():
    """Two classes at distance 2 along x; the within-class spread grows along x as s(t) (sd) and is 100x larger
    along y, which separates nothing: F(t) = 2 / s(t) exactly in expectation, whatever the y spread."""
    rng = np.random.default_rng(0)
    n, steps = 20000, 5
    labels = np.tile(np.arange(2), n // 2)[:, None].repeat(steps, 1)                  # [N, T]
    sd = np.array([0.2, 0.5, 1.0, 2.0, 4.0])
    coords = np.stack([2.0 * labels + sd * rng.standard_normal((n, steps)),
                       100.0 * rng.standard_normal((n, steps))], -1)                   # [N, T, 2]
    curve = fisher_curve(coords, labels)
    np.testing.assert_allclose(curve, 2.0 / sd, rtol=0.05)
    crossed = fisher_tcross(curve)
    assert crossed.value == 3 and crossed.index == 2 and not crossed.estimated   # 2 / 1.0 < 2.563 first at step 3
    assert math.isinf(fisher_tcross(curve[:2]).value)


def test_absent_classes_are_skipped_and_a_lone_class_or_no_spread_gives_nan():
    labels = np.array([[0, 0, 0], [1, 0, 1], [2, 0, 2], [0, 0, 0], [1, 0, 1], [2, 0, 2]])
    coords = np.random.default_rng(1).standard_normal((6, 3, 3))
    coords[:, 2] = np.eye(3)[labels[:, 2]]           # step 3: each class one point, no within-class spread
    curve = fisher_curve(coords, labels)
    assert np.isfinite(curve[0]) and np.isnan(curve[1]) and np.isnan(curve[2])


def test_separation_sees_what_the_isotropic_ratio_misses():
    """Three classes on a line (separation 2): with spread 0.1 read exactly; with a large spread along an axis that
    separates nothing the isotropic ratio overstates the confusion, the Fisher separation does not; identical class
    distributions: chance."""
    rng = np.random.default_rng(0)
    labels = np.repeat(np.arange(3), 300)
    centres = np.stack([2.0 * labels, np.zeros(900)], 1)
    tight = separation(centres + 0.1 * rng.standard_normal((900, 2)), labels)
    assert tight["nearest_centroid_accuracy"] == 1.0 and tight["spread_over_separation"] < 0.1
    stretched = separation(centres + np.stack([0.1 * rng.standard_normal(900), 10.0 * rng.standard_normal(900)], 1),
                           labels)
    assert stretched["spread_over_separation"] > 3 and stretched["fisher_separation"] > 15
    assert 0.45 < stretched["nearest_centroid_accuracy"] < 0.9   # nearest centroid pays for the long axis; Fisher does not
    blur = separation(rng.standard_normal((900, 2)), labels)
    assert blur["nearest_centroid_accuracy"] < 0.45 and blur["fisher_separation"] < 0.5


@pytest.mark.parametrize("coords, labels, match", [
    (np.zeros((4, 3)), np.zeros(4, dtype=int), "coords must be"),
    (np.zeros((4, 2, 3)), np.zeros((4, 2)), "non-negative integer"),
    (np.zeros((4, 2, 3)), -np.ones((4, 2), dtype=int), "non-negative integer"),
])
def test_bad_shapes_and_labels_are_refused(coords, labels, match):
    with pytest.raises(ValueError, match=match):
        fisher_curve(coords, labels)


def test_readout_crossing_is_the_first_step_below_ninety_percent_after_the_burn_in():
    """The control reading: A(t) below READOUT_LEVEL, steps inside the burn-in not searched."""
    curve = np.array([1.0, 0.5, 0.95, 0.92, 0.89, 0.7])
    assert READOUT_LEVEL == 0.9
    assert readout_tcross(curve).value == 2 and readout_tcross(curve, burn_in=2).value == 5
    assert readout_tcross(curve, burn_in=2).index == 4 and readout_tcross(curve).tau == READOUT_LEVEL
    assert math.isinf(readout_tcross(curve[:4], burn_in=2).value)
