"""The self-healing fleet test's deadlines (issue 38, 7): they held at load 8 on 2 cores and one
failed at load 20; they stretch with the load per core beyond that, and the alert's follows the
intervals it waits on."""
from __future__ import annotations

import pytest

from tests.integration.heal import HELD_AT_LOAD_PER_CPU, alert_deadline, stretched


@pytest.mark.parametrize("load,cpus", [(0.0, 2), (1.0, 2), (HELD_AT_LOAD_PER_CPU * 2, 2), (20.0, 16)])
def test_a_deadline_never_shrinks_below_what_held(load, cpus):
    assert stretched(60, load, cpus) == 60


def test_a_deadline_stretches_with_the_load_per_core_beyond_what_held():
    assert stretched(60, 20.0, 2) == pytest.approx(60 * 20.0 / 2 / HELD_AT_LOAD_PER_CPU)
    assert stretched(60, 40.0, 2) == pytest.approx(2 * stretched(60, 20.0, 2))
    assert stretched(60, 40.0, 4) == pytest.approx(stretched(60, 20.0, 2))


@pytest.mark.parametrize("intervals", [(1, 0.9, 1, 1), (15, 10, 15, 120), (60, 10, 60, 300)])
def test_the_alert_deadline_covers_every_interval_the_alert_waits_on(intervals):
    scrape, timeout, evaluation, for_ = intervals
    nominal = scrape + timeout + 2 * evaluation + for_
    assert alert_deadline(*intervals) >= 2 * nominal
    for index in range(4):  # a longer interval, a later deadline, by at least that much
        longer = list(intervals)
        longer[index] += 30
        assert alert_deadline(*longer) - alert_deadline(*intervals) >= 30
