"""What a request may name, checked before anything is queried: pure, no web framework.

Every path or query value that reaches SQL is matched whole against a bounded pattern here and then
travels as a bound parameter; anything else is a `BadRequest` (HTTP 400) with one line saying what.
"""

from __future__ import annotations

import calendar
import datetime as dt
import re
from dataclasses import dataclass

# ASCII only: `\d` and `\w` would accept other scripts' digits and letters.
# Team names as the policy writes them (one DNS label) and as schedulers report them (Slurm accounts, LDAP
# groups): letters, digits, `.`, `_`, `-`, at most 64.
_TEAM = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_PROJECT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")  # producers.projects.PROJECT_ID
_USER = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.@-]{0,63}")
_CLUSTER = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
# Job ids as schedulers print them: 1234, 1234_7, 1234+1, a Kubernetes namespace/name.
_JOB = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+:-]{0,127}(/[A-Za-z0-9][A-Za-z0-9._-]{0,252})?")
_PERIOD = re.compile(r"([0-9]{4})-(0[1-9]|1[0-2])")
_DAY = re.compile(r"([0-9]{4})-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])")
_TABLE = re.compile(r"[a-z][a-z_]{0,31}")
MIN_YEAR, MAX_YEAR = 2000, 2199
MAX_REASON = 500
MAX_PAGE = 10_000


class BadRequest(ValueError):
    """A request value that is not what the page accepts; the message names the value's role, not the value."""


def _match(pattern: re.Pattern[str], value: str | None, what: str) -> str:
    if value is None or len(value) > 300 or not pattern.fullmatch(value):
        raise BadRequest(f"not a valid {what}")
    return value


def team(value: str | None) -> str:
    return _match(_TEAM, value, "team name")


def project(value: str | None) -> str:
    return _match(_PROJECT, value, "project id")


def user(value: str | None) -> str:
    return _match(_USER, value, "user name")


def cluster(value: str | None) -> str:
    return _match(_CLUSTER, value, "cluster name")


def cluster_filter(value: str | None) -> str | None:
    """The optional `?cluster=` of the team page: None when absent or empty (every cluster), else a cluster name.
    A well-formed name the team has no usage on is not an error here: the page says so (the month links carry
    the filter into months where the cluster may hold nothing)."""
    if value is None or value == "":
        return None
    return _match(_CLUSTER, value, "cluster name")


def job_id(value: str | None) -> str:
    return _match(_JOB, value, "job id")


def table_name(value: str | None) -> str:
    return _match(_TABLE, value, "table name")


@dataclass(frozen=True, slots=True)
class Period:
    """A calendar month in UTC, the statement's unit: days [start, end)."""

    year: int
    month: int

    @property
    def text(self) -> str:
        return f"{self.year:04d}-{self.month:02d}"

    @property
    def start(self) -> dt.date:
        return dt.date(self.year, self.month, 1)

    @property
    def end(self) -> dt.date:
        return self.next().start

    @property
    def days(self) -> int:
        return calendar.monthrange(self.year, self.month)[1]

    @property
    def label(self) -> str:
        return f"{self.start:%d %b %Y} to {self.end - dt.timedelta(days=1):%d %b %Y} (UTC)"

    def start_ms(self) -> int:
        return int(dt.datetime(self.year, self.month, 1, tzinfo=dt.UTC).timestamp() * 1000)

    def end_ms(self) -> int:
        return self.next().start_ms()

    def next(self) -> Period:
        return Period(self.year + 1, 1) if self.month == 12 else Period(self.year, self.month + 1)

    def previous(self) -> Period:
        return Period(self.year - 1, 12) if self.month == 1 else Period(self.year, self.month - 1)

    def contains(self, day: dt.date) -> bool:
        return self.start <= day < self.end


def period(value: str | None, now_ms: int) -> Period:
    """`YYYY-MM` exactly (no day, no spaces, no sign), within 2000..2199; absent: the month of `now_ms`."""
    if value is None or value == "":
        today = dt.datetime.fromtimestamp(now_ms / 1000, dt.UTC).date()
        return Period(today.year, today.month)
    match = _PERIOD.fullmatch(value) if len(value) == 7 else None
    if match is None:
        raise BadRequest("period must be a month as YYYY-MM, e.g. 2026-11")
    year, month = int(match.group(1)), int(match.group(2))
    if not MIN_YEAR <= year <= MAX_YEAR:
        raise BadRequest(f"period must be between {MIN_YEAR} and {MAX_YEAR}")
    return Period(year, month)


def day(value: str | None, within: Period) -> dt.date | None:
    """`YYYY-MM-DD` inside the period, or None when absent."""
    if value is None or value == "":
        return None
    match = _DAY.fullmatch(value) if len(value) == 10 else None
    if match is None:
        raise BadRequest("day must be a date as YYYY-MM-DD")
    try:
        parsed = dt.date(int(match.group(1)), int(match.group(2)), int(match.group(3)))
    except ValueError:
        raise BadRequest("day is not a calendar date") from None
    if not within.contains(parsed):
        raise BadRequest("day must lie inside the period")
    return parsed


def page(value: str | None) -> int:
    if value is None or value == "":
        return 1
    if len(value) > 5 or not (value.isascii() and value.isdigit()) or not 1 <= int(value) <= MAX_PAGE:
        raise BadRequest(f"page must be a number from 1 to {MAX_PAGE}")
    return int(value)


def reason(value: str | None) -> str:
    """A correction's reason: required, one paragraph of printable text, at most MAX_REASON characters."""
    text = " ".join((value or "").split())
    if not text:
        raise BadRequest("a reason is required")
    if len(text) > MAX_REASON:
        raise BadRequest(f"the reason is longer than {MAX_REASON} characters")
    if any(not ch.isprintable() for ch in text):
        raise BadRequest("the reason has characters that are not printable")
    return text
