"""The date tool: weekday of a date, days between two dates, a date plus or minus days, today in a time zone.

`extract_date_question` finds the question in natural text ("how many days between 1 March and 14 April
2024", "what date is 100 days after 2024-01-15", "what day of the week was July 4, 1976", "what is the date
today in Asia/Tokyo"); `answer_date_question` computes it with `datetime` and `zoneinfo`; `date_evidence`
wraps the answer as observable evidence. The primitives (`weekday`, `days_between`, `add_days`, `today_in`,
`parse_date`) are usable on their own.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError, available_timezones

from surprisegate.arms import Evidence
from surprisegate.arms.toolkit import tool_evidence
from surprisegate.errors import InputError

MAX_TEXT_CHARS = 2000  # longer text is cut: the question is a sentence, not a document
MAX_DAY_OFFSET = 1_000_000  # about 2700 years: beyond that "N days after" is not a real question

_WEEKDAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
_MONTHS = {
    "jan": 1,
    "feb": 2,
    "mar": 3,
    "apr": 4,
    "may": 5,
    "jun": 6,
    "jul": 7,
    "aug": 8,
    "sep": 9,
    "oct": 10,
    "nov": 11,
    "dec": 12,
}


# --------------------------------------------------------------------------------------------------
# primitives


def weekday(day: date) -> str:
    """The English weekday name: weekday(date(1976, 7, 4)) == "Sunday"."""
    return _WEEKDAYS[day.weekday()]


def days_between(start: date, end: date) -> int:
    """Days from `start` to `end` (negative when `end` is earlier); 1 March to 14 April 2024 is 44."""
    return (end - start).days


def add_days(day: date, days: int) -> date:
    """`day` moved by `days` (negative: earlier). Raises InputError outside years 1..9999."""
    if not isinstance(days, int) or isinstance(days, bool):
        raise InputError(f"days={days!r} must be a whole number of days")
    if abs(days) > MAX_DAY_OFFSET:
        raise InputError(f"days={days} is too far; keep offsets within {MAX_DAY_OFFSET:,} days")
    try:
        return day + timedelta(days=days)
    except OverflowError:
        raise InputError(f"{format_date(day)} plus {days} days falls outside the years 1 to 9999") from None


def today_in(zone: str, now: datetime | None = None) -> date:
    """Today's date in an IANA time zone ("Asia/Tokyo", "UTC"); `now` (aware) is for tests and replays."""
    moment = now or datetime.now(UTC)
    if moment.tzinfo is None:
        raise InputError(f"now={moment!r} must be timezone-aware, e.g. datetime.now(UTC)")
    return moment.astimezone(_zone_info(zone)).date()


def format_date(day: date) -> str:
    """ "4 July 1976": unambiguous in every English locale, unlike 7/4/1976."""
    return f"{day.day} {day:%B} {day.year}"


# --------------------------------------------------------------------------------------------------
# time zones


@functools.lru_cache(maxsize=1)
def _zone_names() -> dict[str, str]:
    """Lower-cased zone keys and city names ("new york") -> IANA key; ambiguous city names are left out."""
    keys = available_timezones()
    names = {key.lower(): key for key in keys}
    cities: dict[str, set[str]] = {}
    for key in keys:
        if "/" in key:
            cities.setdefault(key.rsplit("/", 1)[1].replace("_", " ").lower(), set()).add(key)
    for city, matches in cities.items():
        if len(matches) == 1 and city not in names:
            names[city] = next(iter(matches))
    names.setdefault("utc", "UTC")
    return names


def resolve_zone(name: str) -> str | None:
    """An IANA key for "Asia/Tokyo", "asia/tokyo", "Tokyo" or "New York"; None when unknown."""
    cleaned = name.strip().strip(".,?!").lower()
    names = _zone_names()
    return names.get(cleaned) or names.get(cleaned.replace(" ", "_"))


def _zone_info(zone: str) -> ZoneInfo:
    key = resolve_zone(zone) if isinstance(zone, str) else None
    if key is None:
        raise InputError(f"time zone {zone!r} is unknown; use an IANA name such as 'Europe/Paris' or 'UTC'")
    try:
        return ZoneInfo(key)
    except (ZoneInfoNotFoundError, ValueError) as err:
        raise InputError(f"time zone {key!r} could not be loaded ({err}); install tzdata: pip install tzdata") from None


# --------------------------------------------------------------------------------------------------
# finding dates in text

_MONTH = (
    r"(?P<month>jan(?:uary)?|feb(?:ruary)?|mar(?:ch)?|apr(?:il)?|may|june?|july?|aug(?:ust)?"
    r"|sep(?:t(?:ember)?)?|oct(?:ober)?|nov(?:ember)?|dec(?:ember)?)\.?"
)
_DAY = r"(?P<day>\d{1,2})(?:st|nd|rd|th)?"
_YEAR = r"(?:,?\s+(?P<year>\d{4})\b)?"
_DATE_FORMS = [
    re.compile(r"\b(?P<year>\d{4})-(?P<month>\d{1,2})-(?P<day>\d{1,2})\b"),  # 2024-01-15
    re.compile(rf"\b{_DAY}\s+(?:of\s+)?{_MONTH}\b{_YEAR}", re.IGNORECASE),  # 1 March 2024, 1st of March
    re.compile(rf"\b{_MONTH}\s+{_DAY}\b{_YEAR}", re.IGNORECASE),  # March 1, 2024
    re.compile(r"\b(?P<relative>today|tomorrow|yesterday|now)\b", re.IGNORECASE),
    re.compile(
        r"\b(?P<holiday>christmas(?:\s+day)?|xmas|new\s+year'?s?\s+day|new\s+year'?s\s+eve|halloween)\b",
        re.IGNORECASE,
    ),
]
# Fixed-date holidays, keyed by a word their names contain: (month, day).
_HOLIDAYS = {"christmas": (12, 25), "xmas": (12, 25), "eve": (12, 31), "day": (1, 1), "halloween": (10, 31)}


@dataclass(frozen=True)
class DateMention:
    """A date as written. `year` None means the text left it out; `relative` is "today", "tomorrow", ..."""

    text: str
    start: int
    end: int
    year: int | None = None
    month: int | None = None
    day: int | None = None
    relative: str | None = None


def find_dates(text: str) -> list[DateMention]:
    """Every date phrase in `text`, in order, without overlaps; a year left out is filled from a neighbour.

    "between 1 March and 14 April 2024": both mentions get 2024, the way people write ranges.
    """
    text = text[:MAX_TEXT_CHARS]
    found: list[DateMention] = []
    for pattern in _DATE_FORMS:
        for match in pattern.finditer(text):
            mention = _mention(match)
            if mention is not None:
                found.append(mention)
    found.sort(key=lambda m: (m.start, -(m.end - m.start)))
    kept: list[DateMention] = []
    for mention in found:
        if not kept or mention.start >= kept[-1].end:
            kept.append(mention)
    return _share_years(kept)


def _mention(match: re.Match[str]) -> DateMention | None:
    groups = match.groupdict()
    common: dict[str, Any] = {"text": match.group(), "start": match.start(), "end": match.end()}
    if groups.get("relative"):
        return DateMention(relative=groups["relative"].lower(), **common)
    if groups.get("holiday"):
        words = groups["holiday"].lower()
        # First match wins: "christmas day" is Christmas; "new year's eve" before "new year's day".
        month, day = next(date for key, date in _HOLIDAYS.items() if key in words)
        return DateMention(month=month, day=day, **common)
    month_text = groups["month"]
    # "may" is a month only when capitalised: "it may 10 times" is not the 10th of May.
    if month_text.lower() == "may" and month_text != "May":
        return None
    month = int(month_text) if month_text.isdigit() else _MONTHS[month_text[:3].lower()]
    year = int(groups["year"]) if groups.get("year") else None
    return DateMention(year=year, month=month, day=int(groups["day"]), **common)


def _share_years(mentions: list[DateMention]) -> list[DateMention]:
    shared = []
    for i, mention in enumerate(mentions):
        if mention.year is None and mention.month is not None and mention.relative is None:
            later = next((m.year for m in mentions[i + 1 :] if m.year is not None), None)
            earlier = next((m.year for m in reversed(mentions[:i]) if m.year is not None), None)
            year = later if later is not None else earlier
            if year is not None:
                mention = DateMention(mention.text, mention.start, mention.end, year, mention.month, mention.day)
        shared.append(mention)
    return shared


def parse_date(text: str, default_year: int | None = None) -> date:
    """The single date in `text` ("1 March 2024", "2024-03-01", "March 1st, 2024"); InputError otherwise."""
    mentions = [m for m in find_dates(text or "") if m.relative is None]
    if len(mentions) != 1:
        raise InputError(f"text {text[:80]!r} holds {len(mentions)} dates; give exactly one, e.g. '1 March 2024'")
    mention = mentions[0]
    year = mention.year if mention.year is not None else default_year
    if year is None:
        raise InputError(f"date {mention.text!r} has no year; add one, e.g. '{mention.text} 2024'")
    return _make_date(year, mention.month or 0, mention.day or 0, mention.text)


def _make_date(year: int, month: int, day: int, shown: str) -> date:
    try:
        return date(year, month, day)
    except ValueError as err:
        raise InputError(f"date {shown!r} does not exist ({err})") from None


# --------------------------------------------------------------------------------------------------
# the question

_ASKS_TODAY = re.compile(
    r"\b(?:what(?:'s|\s+is)\s+(?:the\s+)?(?:date|day)(?:\s+(?:today|now|right\s+now))|today'?s\s+date"
    r"|what\s+(?:date|day)\s+is\s+it|(?:the\s+)?current\s+date|what\s+is\s+today)\b",
    re.IGNORECASE,
)
_ZONE_PHRASE = re.compile(
    r"\bin\s+(?P<zone>[A-Za-z][A-Za-z_+\-]*/[A-Za-z_+\-0-9]+(?:/[A-Za-z_+\-0-9]+)?"  # Asia/Tokyo
    r"|UTC|GMT|[A-Z][a-z]+(?:\s+[A-Z][a-z]+){0,2})"  # Tokyo, New York, Los Angeles
)
_COUNT_WORDS = {
    word: n for n, word in enumerate("a two three four five six seven eight nine ten eleven twelve".split(), start=1)
}
_COUNT_WORDS.update(an=1, one=1)
_COUNT = rf"(?P<count>\d{{1,7}}|{'|'.join(_COUNT_WORDS)})"
_OFFSET = re.compile(
    rf"\b{_COUNT}\s+(?P<unit>days?|weeks?)\s+"
    r"(?P<direction>after|before|from|later\s+than|earlier\s+than|prior\s+to|since)\s+",
    re.IGNORECASE,
)
_IN_DAYS = re.compile(
    r"\bin\s+(?P<count>\d{1,7})\s+(?P<unit>days?|weeks?)\b(?!\s+(?:after|before|from))", re.IGNORECASE
)
_PLUS_DAYS = re.compile(r"\s*(?P<sign>plus|\+|minus|-)\s*(?P<count>\d{1,7})\s+(?P<unit>days?|weeks?)\b", re.IGNORECASE)
_ASKS_SPAN = re.compile(
    r"\bhow\s+(?:many|much)\s+(?:days|weeks|time)\b|\bnumber\s+of\s+days\b|\bhow\s+long\b"
    r"|\bdays?\s+(?:are\s+there\s+|is\s+it\s+|left\s+)?(?:between|from|until|till|since|to)\b",
    re.IGNORECASE,
)
_TOWARDS = re.compile(r"\b(?:until|till|to|before)\s+$", re.IGNORECASE)
_SINCE = re.compile(r"\b(?:since|after|from)\s+$", re.IGNORECASE)
_ASKS_WEEKDAY = re.compile(
    r"\b(?:what|which)\s+day\s+of\s+the\s+week\b|\b(?:what|which)\s+weekday\b|\bday\s+of\s+the\s+week\b"
    r"|\bwhat\s+day\s+(?:is|was|will|did|does|falls?)\b",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class DateQuestion:
    """A date question found in text. `dates` are mentions as written; years are resolved when answered."""

    kind: str  # "weekday" | "days_between" | "add_days" | "today"
    text: str  # the text it was found in (cut to MAX_TEXT_CHARS), for the receipt
    dates: tuple[DateMention, ...] = ()
    days: int = 0  # add_days: the signed offset
    zone: str | None = None  # today: the IANA key asked about (None: the tool's default zone)

    def describe(self) -> str:
        """A short canonical form for receipts: "days_between(1 March, 14 April 2024)"."""
        shown = ", ".join(m.text for m in self.dates)
        if self.kind == "add_days":
            shown += f", {self.days:+d} days"
        if self.zone:
            shown = (shown + ", " if shown else "") + self.zone
        return f"{self.kind}({shown})"


def extract_date_question(text: str) -> DateQuestion | None:
    """The date question stated in `text`, or None. Checked in order: offsets, spans, weekdays, today."""
    if not text or not text.strip():
        return None
    text = text[:MAX_TEXT_CHARS]
    mentions = find_dates(text)
    return (
        _offset_question(text, mentions)
        or _span_question(text, mentions)
        or _weekday_question(text, mentions)
        or _today_question(text, mentions)
    )


def _count(word: str, unit: str) -> int:
    number = _COUNT_WORDS[word.lower()] if word.lower() in _COUNT_WORDS else int(word)
    return number * 7 if unit.lower().startswith("week") else number


def _offset_question(text: str, mentions: list[DateMention]) -> DateQuestion | None:
    for match in _OFFSET.finditer(text):
        anchor = next((m for m in mentions if m.start == match.end()), None)
        if anchor is None:  # "3 days after the meeting": no date to count from
            continue
        days = _count(match.group("count"), match.group("unit"))
        if match.group("direction").lower() in ("before", "earlier than", "prior to"):
            days = -days
        return DateQuestion("add_days", text, (anchor,), days=days)
    for mention in mentions:  # "2024-01-15 plus 100 days"
        plus = _PLUS_DAYS.match(text, mention.end)
        if plus:
            days = _count(plus.group("count"), plus.group("unit"))
            return DateQuestion(
                "add_days", text, (mention,), days=-days if plus.group("sign") in ("minus", "-") else days
            )
    moved = _IN_DAYS.search(text)  # "what date will it be in 100 days"
    if moved and re.search(r"\b(?:date|day)\b", text, re.IGNORECASE):
        today = DateMention("today", moved.start(), moved.start(), relative="today")
        return DateQuestion("add_days", text, (today,), days=_count(moved.group("count"), moved.group("unit")))
    return None


def _span_question(text: str, mentions: list[DateMention]) -> DateQuestion | None:
    if not _ASKS_SPAN.search(text):
        return None
    if len(mentions) >= 2:
        return DateQuestion("days_between", text, (mentions[0], mentions[1]))
    if len(mentions) == 1:
        before = text[: mentions[0].start]
        mention = mentions[0]
        if mention.relative:
            return None
        today = DateMention("today", 0, 0, relative="today")
        if _TOWARDS.search(before):  # "how many days until Christmas": from today onwards
            return DateQuestion("days_between", text, (today, mention))
        if _SINCE.search(before) or re.search(r"\bago\b", text, re.IGNORECASE):
            return DateQuestion("days_between", text, (mention, today))
    return None


def _weekday_question(text: str, mentions: list[DateMention]) -> DateQuestion | None:
    if not _ASKS_WEEKDAY.search(text):
        return None
    absolute = [m for m in mentions if m.relative is None]
    if len(absolute) == 1:
        return DateQuestion("weekday", text, (absolute[0],))
    if not absolute and mentions and mentions[0].relative in ("today", "tomorrow", "yesterday"):
        return _today_question(text, mentions, force=True)
    return None


def _today_question(text: str, mentions: list[DateMention], force: bool = False) -> DateQuestion | None:
    if not force and not _ASKS_TODAY.search(text):
        return None
    if any(m.relative is None for m in mentions):  # "what is today's date minus 1 March": not ours
        return None
    zone = None
    phrase = _ZONE_PHRASE.search(text)
    if phrase:
        words = phrase.group("zone").split()
        # "New York City" -> "New York": the longest leading words that name a zone.
        zone = next(
            (resolve_zone(" ".join(words[:n])) for n in range(len(words), 0, -1) if resolve_zone(" ".join(words[:n]))),
            None,
        )
        if zone is None:  # a place we cannot map to a zone: a wrong "today" is worse than none
            return None
    relative = next((m for m in mentions if m.relative in ("tomorrow", "yesterday")), None)
    return DateQuestion("today", text, (relative,) if relative else (), zone=zone)


# --------------------------------------------------------------------------------------------------
# the answer


@dataclass(frozen=True)
class DateAnswer:
    question: DateQuestion
    value: str  # "Sunday", "44", "2024-04-24"
    claim: str  # "weekday(4 July 1976) = Sunday"
    sentence: str  # "4 July 1976 was a Sunday."
    dates: tuple[str, ...]  # the resolved dates, ISO
    assumptions: tuple[str, ...] = field(default=())  # e.g. "year 2025 assumed for 'March 3'"


def answer_date_question(question: DateQuestion, now: datetime | None = None, default_zone: str = "UTC") -> DateAnswer:
    """Compute the answer. `now` (aware) fixes "today" for tests; `default_zone` is where "today" is."""
    zone = question.zone or default_zone
    today = today_in(zone, now)
    assumptions: list[str] = []
    if question.kind == "today":
        shift = {"tomorrow": 1, "yesterday": -1}.get(question.dates[0].relative or "", 0) if question.dates else 0
        day = add_days(today, shift)
        label = {1: "Tomorrow", -1: "Yesterday"}.get(shift, "Today")
        verb = "was" if shift < 0 else "is"
        return DateAnswer(
            question,
            day.isoformat(),
            f"today({zone}) = {day.isoformat()}",
            f"{label} in {zone} {verb} {weekday(day)}, {format_date(day)}.",
            (day.isoformat(),),
        )
    if question.kind == "weekday":
        day = _resolve(question.dates[0], today, assumptions)
        return DateAnswer(
            question,
            weekday(day),
            f"weekday({day.isoformat()}) = {weekday(day)}",
            f"{format_date(day)} is a {weekday(day)}.",
            (day.isoformat(),),
            tuple(assumptions),
        )
    if question.kind == "add_days":
        start = _resolve(question.dates[0], today, assumptions)
        end = add_days(start, question.days)
        direction = "after" if question.days >= 0 else "before"
        anchor = "today" if question.dates[0].relative in ("today", "now") else format_date(start)
        return DateAnswer(
            question,
            end.isoformat(),
            f"{start.isoformat()} {question.days:+d} days = {end.isoformat()}",
            f"{abs(question.days)} days {direction} {anchor} is {weekday(end)}, {format_date(end)}.",
            (start.isoformat(), end.isoformat()),
            tuple(assumptions),
        )
    if question.kind == "days_between":
        first, second = question.dates
        # A date without a year, counted from today, is its next (or, counted to today, its last) occurrence.
        start = _resolve(first, today, assumptions, upcoming=False if second.relative == "today" else None)
        end = _resolve(second, today, assumptions, upcoming=True if first.relative == "today" else None)
        count = days_between(start, end)
        shown_start = "today" if first.relative == "today" else format_date(start)
        shown_end = "today" if second.relative == "today" else format_date(end)
        sentence = f"From {shown_start} to {shown_end} is {abs(count)} day{'s' if abs(count) != 1 else ''}"
        sentence += " (the second date is earlier)." if count < 0 else "."
        return DateAnswer(
            question,
            str(abs(count)),
            f"days({start.isoformat()}, {end.isoformat()}) = {count}",
            sentence,
            (start.isoformat(), end.isoformat()),
            tuple(assumptions),
        )
    raise InputError(f"date question kind {question.kind!r} is unknown")


_RELATIVE_SHIFT = {"today": 0, "now": 0, "tomorrow": 1, "yesterday": -1}


def _resolve(mention: DateMention, today: date, assumptions: list[str], upcoming: bool | None = None) -> date:
    """The date a mention means. A missing year is this year, or with `upcoming` True/False the next/last
    occurrence counted from today ("days until Christmas"); the assumption is recorded for the evidence."""
    if mention.relative:
        return add_days(today, _RELATIVE_SHIFT.get(mention.relative, 0))
    month, day_of_month = mention.month or 0, mention.day or 0
    if mention.year is not None:
        return _make_date(mention.year, month, day_of_month, mention.text)
    _make_date(2000, month, day_of_month, mention.text)  # 2000 was a leap year: refuses only 31 April and such
    step = 0 if upcoming is None else (1 if upcoming else -1)
    for offset in range(9):  # 29 February recurs within 8 years
        year = today.year + step * offset
        try:
            candidate = date(year, month, day_of_month)
        except ValueError:
            candidate = None
        if candidate is not None and (step == 0 or (candidate - today).days * step >= 0):
            assumptions.append(f"year {year} assumed for {mention.text!r}")
            return candidate
        if step == 0:
            break
    raise InputError(f"date {mention.text!r} does not exist in {today.year}; add a year, e.g. '{mention.text} 2024'")


def date_evidence(answer: DateAnswer, field_name: str = "") -> Evidence:
    sentence = answer.sentence
    if answer.assumptions:
        sentence = f"{sentence[:-1]} ({'; '.join(answer.assumptions)})."
    return tool_evidence(
        "dates",
        claim=answer.claim,
        evidence=sentence,
        tool_input=answer.question.describe(),
        output=answer.value,
        sandbox="none",
        dates=list(answer.dates),
        assumptions=list(answer.assumptions),
        field=field_name,
    )
