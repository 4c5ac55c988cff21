"""Times and durations as people type them, read in one place: the CLI, the Spark data source's
options, the Python API and the search page all take times through here.

A time is any of:

    epoch milliseconds          1764064800000   (ten digits, epoch seconds as `date +%s` prints
                                them, are refused naming both readings)
    ISO-8601 with a zone        2026-11-25T10:00:00Z   2026-11-25 11:00+01:00   2026-11-25 10:00 UTC
    ISO-8601 without a zone     2026-11-25 10:00   2026-11-25T10:00:00.250   2026-11-25
                                (a wall-clock time: read in the caller's zone, UTC unless said
                                otherwise; Spark reads it in the session's zone)
    relative to now             now   -15m   1h (= 1h ago)   2d ago   now-1h30m   now+5m

A duration is a number with a unit (ms, s, m or min, h, d, w), or several chained (``1h30m``).
Python callers may also pass an ``int`` (epoch ms), a ``datetime`` (one without a zone is read
as above) or a ``date`` (its midnight). The index keeps milliseconds: a time with finer digits
is refused rather than rounded, so a window never silently loses or gains a message.
"""

from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta, timezone, tzinfo
from fractions import Fraction
from numbers import Integral
from typing import Literal

from msgindex.errors import InvalidOptionError

TimeArg = int | str | datetime | date
JAVA_LONG_MIN, JAVA_LONG_MAX = -(2**63), 2**63 - 1
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
DAY_MS = 86_400_000
# Every UTC offset a zone has had is within a day of UTC (tzdb: -15:56 to +15:13 in local mean
# times): a wall-clock bound widened by a day holds its instant in any zone.
WALL_CLOCK_SLACK_MS = DAY_MS

_UNIT_MS = {"ms": 1, "s": 1000, "sec": 1000, "m": 60_000, "min": 60_000, "h": 3_600_000, "hr": 3_600_000,
            "d": DAY_MS, "w": 7 * DAY_MS}
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)\s*(ms|sec|min|hr|s|m|h|d|w)", re.IGNORECASE)
_DURATION = re.compile(r"^(?:\s*\d+(?:\.\d+)?\s*(?:ms|sec|min|hr|s|m|h|d|w))+\s*$", re.IGNORECASE)
_RELATIVE = re.compile(r"^now\s*(?:(?P<sign>[+-])\s*(?P<offset>.+))?$", re.IGNORECASE)
_SIGNED = re.compile(r"^(?P<sign>[+-])\s*(?P<offset>.+)$")
_AGO = re.compile(r"^(?P<offset>.+?)\s+ago$", re.IGNORECASE)
_EPOCH_MS = re.compile(r"^-?\d+$")
_ZONE_WORD = re.compile(r"^(?P<time>.+?)\s*(?:UTC|GMT)$", re.IGNORECASE)
_OFFSET = re.compile(r"^(?:UTC|GMT)?(?P<sign>[+-])(?P<hours>\d{1,2})(?::?(?P<minutes>\d{2}))?$", re.IGNORECASE)

# Ten digits are what `date +%s` prints (epoch seconds, 2001-09-09 .. 2286-11-20); read as epoch ms
# they are days of January-April 1970, a time no Kafka window means: typed, they are refused with
# both readings rather than read as a 1970 bound that silently widens or empties the window.
# (Python ints are not refused: they are epoch ms by type, as begin_ms/end_ms are.)
EPOCH_SECONDS_LOOKALIKE = (1_000_000_000, 10_000_000_000)

TIME_FORMS = "epoch ms, ISO-8601 (2026-11-25 10:00, with or without a zone), or relative: now, -15m, 1h, 2d ago"


def parse_duration_ms(what: str, text: str) -> int:
    """Milliseconds of a duration such as ``7d``, ``12h``, ``1h30m``, ``45s``, ``500ms``; a bare
    number is milliseconds. InvalidOptionError naming `what` otherwise."""
    stripped = text.strip()
    if re.fullmatch(r"\d+", stripped):
        ms = int(stripped)
    elif _DURATION.match(stripped):
        ms = _duration_ms(stripped)
    else:
        raise InvalidOptionError(f"{what} {text!r} is not a duration: use e.g. 7d, 12h, 1h30m, 45s, 500ms")
    if ms >= 2**63:  # past a Java long: the JVM side (and Kafka's retention.ms) could not hold it
        raise InvalidOptionError(f"{what} {text!r} is too large")
    if isinstance(ms, Fraction):
        raise InvalidOptionError(f"{what} {text!r} has sub-millisecond digits; the index keeps milliseconds")
    return ms


def _duration_ms(text: str) -> int | Fraction | float:
    """The duration's milliseconds (exact: a Fraction when they are not whole), or ``inf`` past
    a Java long (callers bound it)."""
    try:
        total = sum(Fraction(number) * _UNIT_MS[unit.lower()] for number, unit in _DURATION_PART.findall(text))
    except ValueError:  # more digits than Python reads as an int (4,300): past any Java long
        return math.inf
    if abs(total) >= 2**63:
        return math.inf
    return int(total) if total.denominator == 1 else total  # (a fraction of a ms: callers refuse it)


@dataclass(frozen=True)
class TimeInput:
    """A time as given, before the two things it may still need are known: the current time
    (``relative``: `ms` is an offset from now) and a zone (``wall``: `ms` is the wall-clock time
    counted as if it were UTC). ``instant``: `ms` is already epoch milliseconds."""

    kind: Literal["instant", "relative", "wall"]
    ms: int
    text: str

    @property
    def needs_zone(self) -> bool:
        return self.kind == "wall"

    def resolve(self, *, now_ms: int | None = None, zone: tzinfo | str | None = None) -> int:
        """Epoch milliseconds: relative to `now_ms` (default: now), a wall-clock time in `zone`
        (a tzinfo or a zone name; default UTC)."""
        if self.kind == "instant":
            return self.ms
        if self.kind == "relative":
            return (now_ms if now_ms is not None else current_ms()) + self.ms
        wall = (EPOCH + timedelta(milliseconds=self.ms)).replace(tzinfo=as_zone(zone))
        return _ms_of(wall)

    def planning_bounds(self) -> tuple[int, int]:
        """(lowest, highest) epoch ms this time can stand for in any zone (a wall-clock time's
        instant is unknown until the zone is); for a time with a zone or relative, itself twice."""
        if self.kind == "wall":
            return self.ms - WALL_CLOCK_SLACK_MS, self.ms + WALL_CLOCK_SLACK_MS
        return self.ms, self.ms


def current_ms() -> int:
    return time.time_ns() // 1_000_000


def read_time(what: str, value: TimeArg) -> TimeInput:
    """`value` (see the module doc) as a TimeInput; InvalidOptionError naming `what` and the
    value when it is none of the forms."""
    if isinstance(value, bool):
        raise _not_a_time(what, value)
    if isinstance(value, Integral):  # numpy's integers too
        return TimeInput("instant", _java_long_ms(what, int(value), value), str(value))
    if isinstance(value, datetime) and value != value:  # pandas' NaT (a datetime that equals nothing)
        raise _not_a_time(what, value)
    nanosecond = getattr(value, "nanosecond", 0)
    if nanosecond and nanosecond == nanosecond:  # a pandas Timestamp's nanoseconds, which datetime drops (NaT: NaN)
        raise _finer_than_ms(what, value)
    if type(value).__name__ == "datetime64":  # numpy's: zone-less, as a datetime without one
        return read_time(what, _numpy_datetime(what, value))
    if isinstance(value, datetime):
        if value.tzinfo is None or value.utcoffset() is None:
            return TimeInput("wall", _ms_of(value.replace(tzinfo=UTC), what, value), str(value))
        return TimeInput("instant", _ms_of(value, what, value), value.isoformat())
    if isinstance(value, date):
        return TimeInput("wall", _ms_of(datetime(value.year, value.month, value.day, tzinfo=UTC)), str(value))
    if not isinstance(value, str):
        raise _not_a_time(what, value)
    text = value.strip()
    if _EPOCH_MS.match(text):
        ms = _java_long_ms(what, int(text), value)
        if EPOCH_SECONDS_LOOKALIKE[0] <= ms < EPOCH_SECONDS_LOOKALIKE[1]:
            raise InvalidOptionError(
                f"option '{what}' = {text!r} reads as epoch ms {format_ms(ms)}; if it is epoch seconds (`date +%s`), "
                f"write {ms * 1000} or {format_ms(ms * 1000)}")
        return TimeInput("instant", ms, text)
    offset = _relative_offset_ms(text)
    if offset is not None:
        if not abs(offset) < 2**62:  # (inf for too many digits) no time a Java long holds is that far from now
            raise InvalidOptionError(f"option '{what}' = {text!r} is too far from now")
        if isinstance(offset, Fraction):
            raise _finer_than_ms(what, text)
        return TimeInput("relative", int(offset), text)
    moment = _iso(text)
    if moment is None:
        raise _not_a_time(what, value)
    if moment.tzinfo is None:
        return TimeInput("wall", _ms_of(moment.replace(tzinfo=UTC), what, value), text)
    return TimeInput("instant", _ms_of(moment, what, value), text)


def to_epoch_ms(what: str, value: TimeArg | None, *, now_ms: int | None = None,
                zone: tzinfo | str | None = None) -> int | None:
    """Epoch milliseconds of `value` (None stays None): relative times from `now_ms` (default
    now), times without a zone in `zone` (default UTC)."""
    if value is None:
        return None
    return read_time(what, value).resolve(now_ms=now_ms, zone=zone)


def _relative_offset_ms(text: str) -> int | Fraction | float | None:
    """Offset from now of `now`, `now-1h`, `-15m`, `+5m`, `1h` (ago), `2d ago`; None if not relative."""
    match = _RELATIVE.match(text)
    if match:
        if match.group("offset") is None:
            return 0
        offset = match.group("offset")
        if not _DURATION.match(offset):
            return None
        return _duration_ms(offset) * (-1 if match.group("sign") == "-" else 1)
    match = _SIGNED.match(text)
    if match and _DURATION.match(match.group("offset")):
        return _duration_ms(match.group("offset")) * (-1 if match.group("sign") == "-" else 1)
    match = _AGO.match(text)
    if match and _DURATION.match(match.group("offset")):
        return -_duration_ms(match.group("offset"))
    if _DURATION.match(text):
        return -_duration_ms(text)  # a bare duration is that long ago (as in `--since 1h`)
    return None


def _iso(text: str) -> datetime | None:
    zone: tzinfo | None = None
    worded = _ZONE_WORD.match(text)
    if worded:  # "... UTC" / "... GMT"
        text, zone = worded.group("time"), UTC
    try:
        moment = datetime.fromisoformat(text[:-1] + "Z" if text.endswith("z") else text)
    except ValueError:
        return None
    if zone is not None:
        if moment.tzinfo is not None:
            return None  # two zones
        moment = moment.replace(tzinfo=zone)
    return moment


def _numpy_datetime(what: str, value: object) -> datetime:
    """A numpy datetime64 as a datetime without a zone (refused with finer than millisecond digits)."""
    import numpy as np

    if np.isnat(value):
        raise _not_a_time(what, value)
    unit, count = np.datetime_data(value.dtype)
    finer = {"us": 10**3, "ns": 10**6, "ps": 10**9, "fs": 10**12, "as": 10**15}.get(unit)
    if finer is not None and int(value.astype(np.int64)) * count % finer:  # (in its own unit: no wrap-around)
        raise _finer_than_ms(what, value)
    return datetime(1970, 1, 1) + timedelta(milliseconds=int(value.astype("datetime64[ms]").astype(np.int64)))


def _java_long_ms(what: str, ms: int, value: object) -> int:
    """`ms` when a Kafka timestamp (a Java long) can hold it: any such bound is a window's end
    (Long.MAX_VALUE is a common "no end"), a number beyond none."""
    if not JAVA_LONG_MIN <= ms <= JAVA_LONG_MAX:
        raise InvalidOptionError(f"option '{what}' = {str(value)!r} is beyond any time a Kafka timestamp holds "
                                 f"(epoch ms in a Java long: {JAVA_LONG_MIN} .. {JAVA_LONG_MAX})")
    return ms


def _ms_of(moment: datetime, what: str = "", value: object = None) -> int:
    micros = micros_since_epoch(moment)
    if micros % 1000:
        raise _finer_than_ms(what, value)
    return micros // 1000


def micros_since_epoch(moment: datetime) -> int:
    """Exact microseconds since the epoch of an aware datetime (``timestamp()`` is a float and
    loses microseconds far from 1970)."""
    delta = moment - EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def _finer_than_ms(what: str, value: object) -> InvalidOptionError:
    return InvalidOptionError(f"option '{what}' = {str(value)!r} has sub-millisecond digits; the index keeps milliseconds")


def _not_a_time(what: str, value: object) -> InvalidOptionError:
    return InvalidOptionError(f"option '{what}' = {str(value)!r} is not a time: give {TIME_FORMS}")


def as_zone(zone: tzinfo | str | None) -> tzinfo:
    """A tzinfo for `zone`: a tzinfo as is, None as UTC, or a name as Spark's session zone takes
    it: a region (``Europe/Paris``), ``UTC``/``GMT``/``Z``, or an offset (``+01:00``,
    ``UTC-5``, ``GMT+05:30``)."""
    if zone is None:
        return UTC
    if isinstance(zone, tzinfo):
        return zone
    name = zone.strip()
    if name.upper() in ("UTC", "GMT", "Z", "ETC/UTC", "ETC/GMT"):
        return UTC
    offset = _OFFSET.match(name)
    if offset:
        minutes = int(offset.group("hours")) * 60 + int(offset.group("minutes") or 0)
        return timezone(timedelta(minutes=-minutes if offset.group("sign") == "-" else minutes))
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise InvalidOptionError(f"time zone {zone!r} is unknown: use a region such as Europe/Paris, UTC, "
                                 f"or an offset such as +01:00") from None


def format_ms(ms: int | None) -> str:
    """An epoch-millisecond time as ISO-8601 in UTC with its zone (``2026-11-25T10:00:00.000Z``);
    what msgindex prints, and what any time option takes back."""
    if ms is None:
        return "-"
    try:
        return (EPOCH + timedelta(milliseconds=ms)).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    except OverflowError:  # beyond years 1..9999 (a bound such as Long.MAX_VALUE): epoch ms, taken back as is
        return str(ms)


def format_window(begin_ms: int | None, end_ms: int | None) -> str:
    """``2026-11-25T09:00:00.000Z .. 2026-11-25T10:00:00.000Z`` (an open side as ``any time``)."""
    return f"{format_ms(begin_ms) if begin_ms is not None else 'any time'} .. " \
           f"{format_ms(end_ms) if end_ms is not None else 'any time'}"
