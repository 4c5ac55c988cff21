"""``msgindex.times``: every form of time people type, read one way for the CLI, the data source,
the Python API and the search page."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta, timezone

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from msgindex.errors import InvalidOptionError
from msgindex.times import (
    WALL_CLOCK_SLACK_MS,
    as_zone,
    format_ms,
    format_window,
    parse_duration_ms,
    read_time,
    to_epoch_ms,
)

NOW = 1_795_600_800_000  # 2026-11-25T10:00:00Z
MINUTE, HOUR, DAY = 60_000, 3_600_000, 86_400_000


@pytest.mark.parametrize(("text", "expected"), [
    ("1795600800000", NOW),
    ("2026-11-25T10:00:00Z", NOW),
    ("2026-11-25T10:00:00.000z", NOW),
    ("2026-11-25 11:00+01:00", NOW),
    ("2026-11-25T05:00:00-05:00", NOW),
    ("2026-11-25 10:00 UTC", NOW),
    ("2026-11-25 10:00:00.250 GMT", NOW + 250),
    ("2026-11-25 10:00", NOW),               # no zone: UTC unless the caller says otherwise
    ("2026-11-25T10:00:00.5", NOW + 500),
    ("2026-11-25", NOW - 10 * HOUR),
    ("now", NOW),
    ("-15m", NOW - 15 * MINUTE),
    ("1h", NOW - HOUR),                      # a bare duration is that long ago
    ("2d ago", NOW - 2 * DAY),
    ("now-1h30m", NOW - 90 * MINUTE),
    ("now - 1h", NOW - HOUR),
    ("now+5m", NOW + 5 * MINUTE),
    ("+5m", NOW + 5 * MINUTE),
    ("1.5h", NOW - 90 * MINUTE),
    ("  -30s ", NOW - 30_000),
    ("-1700", -1700),                        # a negative integer is epoch ms before 1970
])
def test_forms(text, expected):
    assert to_epoch_ms("begin", text, now_ms=NOW) == expected


@pytest.mark.parametrize("text", ["noon", "5 o'clock", "1h foo", "now-", "now - soon", "2026-11-25T10:00+01:00 UTC",
                                  "2026-13-01", "", "10:00", "1 hour"])
def test_not_a_time_names_the_option_and_the_forms(text):
    with pytest.raises(InvalidOptionError, match=r"option '--begin' = .* is not a time: give epoch ms, ISO-8601"):
        read_time("--begin", text)


def test_sub_millisecond_digits_are_refused_not_rounded():
    with pytest.raises(InvalidOptionError, match="sub-millisecond"):
        read_time("end", "2026-11-25T10:00:00.0001Z")
    with pytest.raises(InvalidOptionError, match="sub-millisecond"):
        read_time("end", datetime(2026, 11, 25, 10, 0, 0, 1, tzinfo=UTC))


def test_finer_digits_of_pandas_numpy_and_durations_are_refused_too():
    """Found by an attack run: a pandas Timestamp's nanoseconds were dropped, numpy's datetime64
    was 'not a time', and a duration of 1.0005 s became 1000 ms."""
    import pandas as pd

    with pytest.raises(InvalidOptionError, match="option 'b' .* sub-millisecond"):
        read_time("b", pd.Timestamp("2026-11-25T10:00:00.000000001Z"))
    assert to_epoch_ms("b", pd.Timestamp("2026-11-25T10:00:00.001Z")) == NOW + 1
    assert to_epoch_ms("b", np.datetime64("2026-11-25T10:00:00.001")) == NOW + 1  # zone-less: UTC by default
    assert to_epoch_ms("b", np.datetime64("2026-11-25"), zone="+01:00") == NOW - 11 * HOUR
    with pytest.raises(InvalidOptionError, match="option 'b' .* sub-millisecond"):
        read_time("b", np.datetime64("2026-11-25T10:00:00.0000001"))
    with pytest.raises(InvalidOptionError, match="is not a time"):
        read_time("b", np.datetime64("NaT"))
    for text in ("1.0005s", "now-0.5ms"):
        with pytest.raises(InvalidOptionError, match="option 'b' .* sub-millisecond"):
            read_time("b", text)
    with pytest.raises(InvalidOptionError, match="--max-age '1.0005s' has sub-millisecond"):
        parse_duration_ms("--max-age", "1.0005s")
    assert parse_duration_ms("--max-age", "1.5s") == 1500 and to_epoch_ms("b", "-1.5s", now_ms=NOW) == NOW - 1500
    # (a review: numpy's nanoseconds wrap around outside 1678-2262; pandas' NaT; 5,000 digits)
    assert to_epoch_ms("b", np.datetime64("2300-01-01T00:00:00.001")) == 10_413_792_000_001
    with pytest.raises(InvalidOptionError, match="is not a time"):
        read_time("b", pd.NaT)
    with pytest.raises(InvalidOptionError, match="too far from now"):
        read_time("b", "1" * 5000 + "d")


@pytest.mark.parametrize("bound", [2**63 - 1, -(2**63), "9223372036854775807"])
def test_any_java_long_is_a_bound_and_is_shown(bound):
    assert to_epoch_ms("b", bound) == int(bound)
    assert format_ms(int(bound)) == str(int(bound))  # past years 1..9999: epoch ms, read back as they are


@pytest.mark.parametrize("bound", [2**63, "99999999999999999999", "-9223372036854775809"])
def test_a_number_beyond_a_java_long_is_refused(bound):
    with pytest.raises(InvalidOptionError, match="option 'b' .* beyond any time a Kafka timestamp holds"):
        read_time("b", bound)


def test_python_values():
    assert to_epoch_ms("b", NOW) == NOW
    assert to_epoch_ms("b", np.int64(NOW)) == NOW
    assert to_epoch_ms("b", datetime(2026, 11, 25, 11, tzinfo=timezone(timedelta(hours=1)))) == NOW
    assert to_epoch_ms("b", datetime(2026, 11, 25, 10)) == NOW  # naive: UTC by default
    assert to_epoch_ms("b", date(2026, 11, 25)) == NOW - 10 * HOUR
    assert to_epoch_ms("b", None) is None
    for bad in (True, 1.5, object()):
        with pytest.raises(InvalidOptionError, match="option 'b'"):
            read_time("b", bad)


def test_a_time_without_a_zone_is_read_in_the_zone_given():
    wall = read_time("begin", "2026-11-25 10:00")
    assert wall.needs_zone
    assert wall.resolve(zone="Europe/Paris") == NOW - HOUR  # CET is UTC+1 in November
    assert wall.resolve(zone="America/New_York") == NOW + 5 * HOUR
    assert wall.resolve(zone="+05:30") == NOW - 330 * MINUTE
    assert wall.resolve(zone="GMT-3") == NOW + 3 * HOUR
    assert wall.resolve(zone=None) == wall.resolve(zone="UTC") == NOW
    summer = read_time("begin", "2026-07-01 10:00").resolve(zone="Europe/Paris")
    assert summer == to_epoch_ms("b", "2026-07-01T08:00:00Z")  # CEST: UTC+2
    low, high = wall.planning_bounds()
    assert low <= wall.resolve(zone="Pacific/Kiritimati") and wall.resolve(zone="Pacific/Niue") <= high
    assert (low, high) == (NOW - WALL_CLOCK_SLACK_MS, NOW + WALL_CLOCK_SLACK_MS)
    # a time with a zone, or relative, is exact whatever zone is given
    assert read_time("b", "2026-11-25T10:00:00Z").resolve(zone="Asia/Tokyo") == NOW
    with pytest.raises(InvalidOptionError, match="time zone 'Mars/Olympus' is unknown"):
        as_zone("Mars/Olympus")


@given(st.integers(min_value=-62_135_596_800_000, max_value=253_402_300_799_999))
def test_what_is_shown_reads_back_to_the_same_millisecond(ms):
    shown = format_ms(ms)
    assert shown.endswith("Z") and to_epoch_ms("b", shown) == ms


def test_windows_are_shown_with_dates_and_zone():
    assert format_window(NOW - HOUR, None) == "2026-11-25T09:00:00.000Z .. any time"
    assert format_window(None, NOW) == "any time .. 2026-11-25T10:00:00.000Z"


@pytest.mark.parametrize(("text", "ms"), [("7d", 604_800_000), ("12h", 43_200_000), ("1h30m", 5_400_000),
                                          ("45s", 45_000), ("500ms", 500), ("60000", 60_000), ("2w", 1_209_600_000)])
def test_durations(text, ms):
    assert parse_duration_ms("--max-age", text) == ms


@pytest.mark.parametrize("text", ["soon", "-1d", "1 parsec", ""])
def test_bad_durations(text):
    with pytest.raises(InvalidOptionError, match="--max-age .* is not a duration"):
        parse_duration_ms("--max-age", text)


@pytest.mark.parametrize("text", ["1764150000", " 1000000000", "9999999999"])
def test_epoch_seconds_typed_are_refused_naming_both_readings(text):
    """`date +%s` prints ten digits; as epoch ms they are a day of early 1970, a bound that would
    silently widen (since) or empty (until) the window."""
    seconds = int(text)
    with pytest.raises(InvalidOptionError) as refused:
        read_time("--since", text)
    message = str(refused.value)
    assert message == (f"option '--since' = '{text.strip()}' reads as epoch ms {format_ms(seconds)}; if it is epoch "
                       f"seconds (`date +%s`), write {seconds * 1000} or {format_ms(seconds * 1000)}")
    assert to_epoch_ms("b", seconds) == seconds  # an int is epoch ms by type


@pytest.mark.parametrize("text", ["999999999", "10000000000", "0", "1764150000000"])
def test_other_digit_counts_stay_epoch_ms(text):
    assert to_epoch_ms("b", text) == int(text)
