"""The date tool: primitives, finding date questions in text, answers and evidence."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from surprisegate.arms.dates import (
    add_days,
    answer_date_question,
    date_evidence,
    days_between,
    extract_date_question,
    find_dates,
    parse_date,
    resolve_zone,
    today_in,
    weekday,
)
from surprisegate.errors import InputError

# A fixed "now" so answers about today do not depend on when the tests run: 10 June 2025, 20:00 UTC.
NOW = datetime(2025, 6, 10, 20, 0, tzinfo=UTC)


def test_weekday():
    assert weekday(date(1976, 7, 4)) == "Sunday"
    assert weekday(date(2024, 2, 29)) == "Thursday"


def test_days_between_and_add_days():
    assert days_between(date(2024, 3, 1), date(2024, 4, 14)) == 44
    assert days_between(date(2024, 4, 14), date(2024, 3, 1)) == -44
    assert add_days(date(2024, 1, 15), 100) == date(2024, 4, 24)
    assert add_days(date(2024, 3, 1), -1) == date(2024, 2, 29)


@given(st.dates(min_value=date(1, 1, 1), max_value=date(9000, 1, 1)), st.integers(-100_000, 100_000))
def test_add_days_matches_timedelta(day, days):
    try:
        expected = day + timedelta(days=days)
    except OverflowError:
        with pytest.raises(InputError):
            add_days(day, days)
        return
    assert add_days(day, days) == expected
    assert days_between(day, expected) == days


def test_add_days_is_bounded():
    with pytest.raises(InputError, match="outside the years"):
        add_days(date(9999, 12, 31), 1)
    with pytest.raises(InputError, match="too far"):
        add_days(date(2024, 1, 1), 10**9)
    with pytest.raises(InputError):
        add_days(date(2024, 1, 1), 1.5)  # type: ignore[arg-type]


def test_today_in_a_zone():
    # 20:00 UTC on 10 June is already 11 June in Tokyo and still 10 June in New York.
    assert today_in("Asia/Tokyo", NOW) == date(2025, 6, 11)
    assert today_in("America/New_York", NOW) == date(2025, 6, 10)
    assert today_in("UTC", NOW) == date(2025, 6, 10)


def test_today_in_refuses_unknown_zones_and_naive_times():
    with pytest.raises(InputError, match="IANA"):
        today_in("Mars/Olympus_Mons", NOW)
    with pytest.raises(InputError, match="timezone-aware"):
        today_in("UTC", datetime(2025, 6, 10))


@pytest.mark.parametrize(
    ("name", "key"),
    [
        ("Asia/Tokyo", "Asia/Tokyo"),
        ("asia/tokyo", "Asia/Tokyo"),
        ("Tokyo", "Asia/Tokyo"),
        ("New York", "America/New_York"),
        ("UTC", "UTC"),
        ("Springfield", None),
    ],
)
def test_resolve_zone(name, key):
    assert resolve_zone(name) == key


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2024-01-15", date(2024, 1, 15)),
        ("1 March 2024", date(2024, 3, 1)),
        ("1st of March 2024", date(2024, 3, 1)),
        ("March 1, 2024", date(2024, 3, 1)),
        ("March 1st 2024", date(2024, 3, 1)),
        ("Sept. 3, 1999", date(1999, 9, 3)),
        ("on 4 Jul 1976 they", date(1976, 7, 4)),
    ],
)
def test_parse_date(text, expected):
    assert parse_date(text) == expected


def test_parse_date_refuses_missing_and_impossible_dates():
    with pytest.raises(InputError, match="no year"):
        parse_date("March 3")
    assert parse_date("March 3", default_year=2020) == date(2020, 3, 3)
    with pytest.raises(InputError, match="does not exist"):
        parse_date("31 April 2024")
    with pytest.raises(InputError, match="exactly one"):
        parse_date("1 March 2024 and 2 March 2024")


def test_find_dates_shares_a_year_across_a_range():
    mentions = find_dates("between 1 March and 14 April 2024")
    assert [(m.year, m.month, m.day) for m in mentions] == [(2024, 3, 1), (2024, 4, 14)]


def test_may_is_a_month_only_when_capitalised():
    assert find_dates("it may 10 times") == []
    assert [(m.month, m.day) for m in find_dates("on May 10")] == [(5, 10)]


# (text, expected answer value, expected sentence fragment)
DATE_QUESTIONS = [
    ("How many days between 1 March and 14 April 2024?", "44", "From 1 March 2024 to 14 April 2024 is 44 days."),
    ("days between 1 March 2024 and 1 March 2025", "365", "365 days"),
    (
        "What date is 100 days after 2024-01-15?",
        "2024-04-24",
        "100 days after 15 January 2024 is Wednesday, 24 April 2024.",
    ),
    ("What was the date 3 days before March 1st, 2024?", "2024-02-27", "3 days before 1 March 2024"),
    ("two weeks after 1 Jan 2024", "2024-01-15", "14 days after"),
    ("2024-01-15 plus 10 days", "2024-01-25", "10 days after"),
    ("What day of the week was July 4, 1976?", "Sunday", "4 July 1976 is a Sunday."),
    ("Which weekday is 2024-02-29?", "Thursday", "Thursday"),
    ("What is the date today in Asia/Tokyo?", "2025-06-11", "Today in Asia/Tokyo is Wednesday, 11 June 2025."),
    ("What day is it in New York City?", "2025-06-10", "America/New_York"),
    ("What is today's date?", "2025-06-10", "Today in UTC"),
    ("What date will it be in 100 days?", "2025-09-18", "100 days after today"),
    ("How many days until Christmas?", "198", "From today to 25 December 2025 is 198 days"),
    ("How many days since 1 March 2025?", "101", "From 1 March 2025 to today is 101 days."),
    ("How many days are there between March 3 and May 1?", "59", "year 2025 assumed"),
]


@pytest.mark.parametrize(("text", "value", "fragment"), DATE_QUESTIONS, ids=[q[0][:30] for q in DATE_QUESTIONS])
def test_date_questions(text, value, fragment):
    question = extract_date_question(text)
    assert question is not None
    answer = answer_date_question(question, now=NOW)
    assert answer.value == value
    assert fragment in date_evidence(answer).evidence


@pytest.mark.parametrize(
    "text",
    [
        "",
        "What is 37 times 48?",
        "He was born on 2024-01-05.",
        "What is the capital of France?",
        "3 days after the meeting",
        "What is the date today in Springfield?",
        "It may 10 times",
    ],
)
def test_no_date_question(text):
    assert extract_date_question(text) is None


def test_impossible_dates_are_refused_when_answered():
    question = extract_date_question("What day of the week will 31 April 2024 be?")
    with pytest.raises(InputError, match="does not exist"):
        answer_date_question(question, now=NOW)


def test_leap_day_without_a_year_counts_to_the_next_one():
    question = extract_date_question("How many days until 29 February?")
    answer = answer_date_question(question, now=NOW)
    assert answer.dates[-1] == "2028-02-29"


def test_date_evidence_shape():
    question = extract_date_question("How many days between 1 March and 14 April 2024?")
    evidence = date_evidence(answer_date_question(question, now=NOW), "question")
    assert evidence.source == "tool:dates"
    assert evidence.observable == 1.0
    assert evidence.confidence == 1.0
    assert evidence.detail["tool"] == "dates"
    assert evidence.detail["input"] == "days_between(1 March, 14 April 2024)"
    assert evidence.detail["output"] == "44"
    assert evidence.detail["sandbox"] == "none"
    assert evidence.detail["field"] == "question"
    assert evidence.claim == "days(2024-03-01, 2024-04-14) = 44"
