"""Spend windows follow the zone's calendar: days of 23 and 25 hours across DST, weeks from Monday, and a day
whose midnight the clocks skip."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from satgate_mcp.policy.spend_windows import Window, window_bounds


def at(text: str) -> float:
    return datetime.fromisoformat(text).astimezone(UTC).timestamp()


@pytest.mark.parametrize(("window", "tz", "now", "start", "end", "hours"), [
    pytest.param("day", "America/New_York", "2026-06-10T12:00:00-04:00",
                 "2026-06-10T00:00:00-04:00", "2026-06-11T00:00:00-04:00", 24, id="summer-day"),
    pytest.param("day", "America/New_York", "2026-03-08T12:00:00-04:00",
                 "2026-03-08T00:00:00-05:00", "2026-03-09T00:00:00-04:00", 23, id="spring-forward-day-is-23h"),
    pytest.param("day", "America/New_York", "2026-11-01T01:30:00-05:00",
                 "2026-11-01T00:00:00-04:00", "2026-11-02T00:00:00-05:00", 25, id="fall-back-day-is-25h"),
    pytest.param("day", "America/New_York", "2026-03-09T03:59:59+00:00",
                 "2026-03-08T00:00:00-05:00", "2026-03-09T00:00:00-04:00", 23, id="last-second-of-the-short-day"),
    pytest.param("day", "America/New_York", "2026-03-09T04:00:00+00:00",
                 "2026-03-09T00:00:00-04:00", "2026-03-10T00:00:00-04:00", 24, id="first-second-of-the-next-day"),
    pytest.param("day", "UTC", "2026-03-08T23:59:59+00:00",
                 "2026-03-08T00:00:00+00:00", "2026-03-09T00:00:00+00:00", 24, id="utc"),
    pytest.param("day", "Asia/Kolkata", "2026-01-01T20:00:00+00:00",
                 "2026-01-02T00:00:00+05:30", "2026-01-03T00:00:00+05:30", 24, id="half-hour-zone-next-date"),
    pytest.param("day", "America/Santiago", "2026-09-06T12:00:00-03:00",
                 "2026-09-06T01:00:00-03:00", "2026-09-07T00:00:00-03:00", 23, id="midnight-skipped"),
    pytest.param("week", "America/New_York", "2026-03-11T09:00:00-04:00",
                 "2026-03-09T00:00:00-04:00", "2026-03-16T00:00:00-04:00", 168, id="week-from-monday"),
    pytest.param("week", "America/New_York", "2026-03-08T23:00:00-04:00",
                 "2026-03-02T00:00:00-05:00", "2026-03-09T00:00:00-04:00", 167, id="week-with-spring-forward"),
    pytest.param("week", "America/New_York", "2026-03-09T00:00:00-04:00",
                 "2026-03-09T00:00:00-04:00", "2026-03-16T00:00:00-04:00", 168, id="monday-midnight-starts-a-week"),
    pytest.param("week", "Europe/Berlin", "2026-10-25T12:00:00+01:00",
                 "2026-10-19T00:00:00+02:00", "2026-10-26T00:00:00+01:00", 169, id="week-with-fall-back"),
])
def test_window_bounds(window: Window, tz: str, now: str, start: str, end: str, hours: int) -> None:
    bounds = window_bounds(window, tz, at(now))
    assert bounds.start.isoformat() == start
    assert bounds.end.isoformat() == end
    # Elapsed time, not wall-clock difference (which, within one zone, ignores the DST change).
    assert bounds.end.timestamp() - bounds.start.timestamp() == hours * 3600
    assert bounds.start.timestamp() <= at(now) < bounds.end.timestamp()
