"""The units tool: finding conversions in text (no pint needed) and converting them with pint."""

from __future__ import annotations

import importlib.util
from fractions import Fraction

import pytest

from surprisegate.arms.units import (
    conversion_evidence,
    convert,
    convert_conversion,
    extract_conversion,
    looks_like_conversion,
    unit_for,
)
from surprisegate.errors import InputError


@pytest.mark.parametrize(
    ("written", "unit"),
    [
        ("kilometres", "kilometer"),
        ("KM", None),
        ("km", "kilometer"),
        ("Miles", "mile"),
        ("F", "degree_Fahrenheit"),
        ("f", None),
        ("°C", "degree_Celsius"),
        ("degrees F", "degree_Fahrenheit"),
        ("degrees Celsius", "degree_Celsius"),
        ("in", None),
        ("mph", "mile / hour"),
        ("square feet", "foot ** 2"),
        ("apples", None),
    ],
)
def test_unit_for(written, unit):
    # Symbols are case-sensitive ("F" is Fahrenheit, "f" nothing) and "in" is never inches.
    assert unit_for(written) == unit


@pytest.mark.parametrize(
    ("text", "value", "source", "target"),
    [
        ("How many kilometres is 26.2 miles?", "26.2", "mile", "kilometer"),
        ("convert 100 F to C", "100", "degree_Fahrenheit", "degree_Celsius"),
        ("Convert 100 degrees F to degrees C", "100", "degree_Fahrenheit", "degree_Celsius"),
        ("What is 100 °F in °C?", "100", "degree_Fahrenheit", "degree_Celsius"),
        ("5 feet in cm", "5", "foot", "centimeter"),
        ("How many seconds are there in a day?", "1", "day", "second"),
        ("how many ounces in a pound", "1", "pound", "ounce"),
        ("1,000 m to ft", "1000", "meter", "foot"),
        ("-40 F to C", "-40", "degree_Fahrenheit", "degree_Celsius"),
        ("60 mph in km/h", "60", "mile / hour", "kilometer / hour"),
    ],
)
def test_extract_conversion(text, value, source, target):
    conversion = extract_conversion(text)
    assert conversion is not None
    assert (conversion.value, conversion.source, conversion.target) == (Fraction(value), source, target)
    assert looks_like_conversion(text)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "What is 37 times 48?",
        "I ran 5 km in 30 minutes",
        "convert 3 apples to pears",
        "He is 6 ft to the core",
        "from 9 am to 5 pm",
        "How many feet tall is the Eiffel tower?",
        "Is port 8080 open?",
        "5 km in km",
    ],
)
def test_no_conversion(text):
    assert extract_conversion(text) is None
    assert not looks_like_conversion(text)


# pint does the converting; extraction above works without it.
needs_pint = pytest.mark.skipif(importlib.util.find_spec("pint") is None, reason="pint is not installed")


@needs_pint
@pytest.mark.parametrize(
    ("text", "shown", "exact", "sentence"),
    [
        ("How many kilometres is 26.2 miles?", "42.1648", False, "26.2 mi is about 42.1648 km."),
        ("convert 100 F to C", "37.7778", False, "100 °F is about 37.7778 °C."),
        ("-40 F to C", "-40", True, "-40 °F is -40 °C."),
        ("5 feet in cm", "152.4", True, "5 ft is 152.4 cm."),
        ("1 foot in metres", "0.3048", True, "1 ft is 0.3048 m."),  # float noise is not "about"
        ("How many seconds are there in a day?", "86400", True, "1 day is 86400 s."),
        ("How many days are in 3 weeks?", "21", True, "3 weeks is 21 days."),
        ("1 GB in MB", "1000", True, "1 GB is 1000 MB."),
    ],
)
def test_conversions(text, shown, exact, sentence):
    result = convert_conversion(extract_conversion(text))
    assert result.shown == shown
    assert result.exact is exact
    assert conversion_evidence(result).evidence == sentence


@needs_pint
def test_convert_accepts_people_units_and_pint_expressions():
    assert convert(26.2, "miles", "km").shown == "42.1648"
    assert convert("1,000", "mile / hour", "km/h").shown == "1609.34"
    assert convert(0, "degC", "kelvin").shown == "273.15"


@needs_pint
@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        ((5, "miles", "kg"), "cannot convert"),
        ((1e20, "m", "km"), "too large"),
        ((float("nan"), "m", "km"), "not a number"),
        (("twelve", "m", "km"), "not a number"),
        ((1, "__import__('os')", "m"), "characters a unit never has"),
        ((1, "m" * 100, "km"), "short unit name"),
        ((1, "frobnitz", "m"), "unknown"),
        ((1, "", "m"), "short unit name"),
    ],
)
def test_convert_refuses_bad_input(args, fragment):
    with pytest.raises(InputError, match=fragment):
        convert(*args)


@needs_pint
def test_conversion_evidence_shape():
    evidence = conversion_evidence(
        convert_conversion(extract_conversion("How many kilometres is 26.2 miles?")), "question"
    )
    assert evidence.source == "tool:units"
    assert evidence.observable == 1.0
    assert evidence.claim == "26.2 mi = 42.1648 km"
    assert evidence.detail == {
        "tool": "units",
        "input": "26.2 mile -> kilometer",
        "output": "42.1648 km",
        "sandbox": "none",
        "exact": False,
        "field": "question",
    }
