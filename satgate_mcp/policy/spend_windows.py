"""Calendar windows of spend limits: where the day or ISO week that holds an instant begins and ends in a zone.

Pure: a zone name and an instant (Unix seconds, from an injected clock) in, aware datetimes out. Windows follow
the zone's calendar, so a day is 23 or 25 hours across a DST change and a week starts at Monday's first
instant. Where a day's midnight does not exist (a zone that springs forward at 00:00), the day begins at the
transition; where it exists twice, at the first.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from functools import lru_cache
from typing import Literal
from zoneinfo import ZoneInfo

Window = Literal["day", "week"]


@dataclass(frozen=True, slots=True)
class Bounds:
    """One window: from ``start`` (included) to ``end`` (excluded), aware, in the window's zone."""

    start: datetime
    end: datetime

    @property
    def label(self) -> str:
        """The window's name in keys: its first local date."""
        return self.start.date().isoformat()


@lru_cache(maxsize=256)
def zone(name: str) -> ZoneInfo:
    return ZoneInfo(name)


def day_start(day: date, tz: ZoneInfo) -> datetime:
    """The first instant of the local date ``day``: local midnight, or the end of a gap that swallowed it."""
    midnight = datetime.combine(day, time(0), tzinfo=tz)  # fold=0: a gap takes the offset before the jump
    return midnight.astimezone(UTC).astimezone(tz)


def window_bounds(window: Window, tz_name: str, now: float) -> Bounds:
    """The ``day`` or ISO ``week`` (Monday first) in zone ``tz_name`` that holds the instant ``now``."""
    tz = zone(tz_name)
    first = datetime.fromtimestamp(now, tz).date()
    days = 1
    if window == "week":
        first -= timedelta(days=first.weekday())
        days = 7
    return Bounds(day_start(first, tz), day_start(first + timedelta(days=days), tz))
