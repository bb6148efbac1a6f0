"""A log line's time: ISO 8601 with the host's UTC offset of that moment,
across the offset's changes (daylight saving time)."""

import datetime
import logging
import os
import time

import pytest

from everystep.observe import logs


@pytest.fixture
def host_zone():
    """Set the host's zone (``TZ``) for the test; the old one comes back after."""
    before = os.environ.get("TZ")

    def set_zone(name):
        os.environ["TZ"] = name
        time.tzset()

    yield set_zone
    if before is None:
        os.environ.pop("TZ", None)
    else:
        os.environ["TZ"] = before
    time.tzset()


@pytest.mark.parametrize(
    ("zone", "change"),
    [
        ("Europe/Paris", datetime.datetime(2024, 3, 31, 1, tzinfo=datetime.UTC)),  # +01 → +02
        ("America/New_York", datetime.datetime(2024, 11, 3, 6, tzinfo=datetime.UTC)),  # -04 → -05
        ("Asia/Kolkata", datetime.datetime(2024, 6, 1, tzinfo=datetime.UTC)),  # +05:30, no change
    ],
)
def test_each_line_shows_the_offset_of_its_own_moment_across_a_change(host_zone, zone, change):
    host_zone(zone)
    formatter = logs.TextFormatter()
    record = logging.LogRecord("everystep", logging.INFO, __file__, 1, "a line", (), None)
    shown = []
    for seconds in (-3600, -61, -1, -0.001, 0, 0.5, 59.999, 60, 3600):
        record.created = change.timestamp() + seconds
        local = datetime.datetime.fromtimestamp(record.created).astimezone()
        assert formatter.formatTime(record) == local.isoformat(timespec="milliseconds")
        shown.append(formatter.formatTime(record)[-6:])
    if zone != "Asia/Kolkata":
        assert shown[3] != shown[4], "the offset changed at the moment it changes"
