"""The units tool: convert a quantity between units with `pint` ("how many kilometres is 26.2 miles",
"convert 100 F to C", "5 feet in cm").

Extraction only knows a curated vocabulary of everyday units (`UNIT_ALIASES`), so it needs no pint and never
reads "in" as inches or "F" as farads; `convert` then does the arithmetic with pint. Input is bounded: short
unit strings, magnitudes up to 1e15.
"""

from __future__ import annotations

import math
import re
import threading
from dataclasses import dataclass
from fractions import Fraction
from typing import TYPE_CHECKING

from surprisegate.arms import Evidence
from surprisegate.arms.calculator import format_number
from surprisegate.arms.toolkit import tool_evidence
from surprisegate.errors import InputError, MissingDependency

if TYPE_CHECKING:
    import pint

MAX_MAGNITUDE = 1e15
MAX_UNIT_CHARS = 60
MAX_TEXT_CHARS = 2000

# pint unit expression -> what people write. Long names match in any case; symbols (SYMBOLS) only as written.
UNIT_ALIASES: dict[str, tuple[str, ...]] = {
    # length
    "kilometer": ("kilometres", "kilometers", "kilometre", "kilometer", "kms", "km"),
    "meter": ("metres", "meters", "metre", "meter", "m"),
    "centimeter": ("centimetres", "centimeters", "centimetre", "centimeter", "cm"),
    "millimeter": ("millimetres", "millimeters", "millimetre", "millimeter", "mm"),
    "mile": ("miles", "mile", "mi"),
    "yard": ("yards", "yard", "yd"),
    "foot": ("feet", "foot", "ft"),
    "inch": ("inches", "inch"),
    "nautical_mile": ("nautical miles", "nautical mile", "nmi"),
    # mass
    "kilogram": ("kilograms", "kilogram", "kilogrammes", "kilos", "kilo", "kg"),
    "gram": ("grams", "gram", "grammes", "g"),
    "milligram": ("milligrams", "milligram", "mg"),
    "pound": ("pounds", "pound", "lbs", "lb"),
    "ounce": ("ounces", "ounce", "oz"),
    "stone": ("stone", "stones"),
    "metric_ton": ("tonnes", "tonne", "metric tons", "metric ton"),
    # volume
    "liter": ("litres", "liters", "litre", "liter", "l", "L"),
    "milliliter": ("millilitres", "milliliters", "millilitre", "milliliter", "ml", "mL"),
    "gallon": ("gallons", "gallon", "gal"),
    "quart": ("quarts", "quart"),
    "pint": ("pints", "pint"),
    "cup": ("cups", "cup"),
    "fluid_ounce": ("fluid ounces", "fluid ounce", "fl oz"),
    "tablespoon": ("tablespoons", "tablespoon", "tbsp"),
    "teaspoon": ("teaspoons", "teaspoon", "tsp"),
    "meter ** 3": ("cubic metres", "cubic meters", "cubic metre", "cubic meter", "m³", "m3"),
    # temperature
    "degree_Celsius": ("degrees celsius", "degree celsius", "celsius", "centigrade", "°C", "ºC", "C"),
    "degree_Fahrenheit": ("degrees fahrenheit", "degree fahrenheit", "fahrenheit", "°F", "ºF", "F"),
    "kelvin": ("kelvins", "kelvin", "K"),
    # time
    "second": ("seconds", "second", "secs", "sec", "s"),
    "minute": ("minutes", "minute", "mins", "min"),
    "hour": ("hours", "hour", "hrs", "hr", "h"),
    "day": ("days", "day"),
    "week": ("weeks", "week"),
    # speed
    "mile / hour": ("miles per hour", "mile per hour", "mph"),
    "kilometer / hour": (
        "kilometres per hour",
        "kilometers per hour",
        "kilometre per hour",
        "kilometer per hour",
        "km/h",
        "kmh",
        "kph",
    ),
    "meter / second": ("metres per second", "meters per second", "metre per second", "meter per second", "m/s"),
    "knot": ("knots", "knot", "kn"),
    # area
    "meter ** 2": ("square metres", "square meters", "square metre", "square meter", "sq m", "m²", "m2"),
    "kilometer ** 2": (
        "square kilometres",
        "square kilometers",
        "square kilometre",
        "square kilometer",
        "sq km",
        "km²",
        "km2",
    ),
    "foot ** 2": ("square feet", "square foot", "sq ft", "ft²", "ft2"),
    "mile ** 2": ("square miles", "square mile", "sq mi", "mi²"),
    "acre": ("acres", "acre"),
    "hectare": ("hectares", "hectare", "ha"),
    # energy, power, pressure
    "joule": ("joules", "joule", "J"),
    "kilojoule": ("kilojoules", "kilojoule", "kJ"),
    "calorie": ("calories", "calorie", "cal"),
    "kilocalorie": ("kilocalories", "kilocalorie", "kcal"),
    "kilowatt_hour": ("kilowatt hours", "kilowatt-hours", "kilowatt hour", "kilowatt-hour", "kWh"),
    "watt": ("watts", "watt", "W"),
    "kilowatt": ("kilowatts", "kilowatt", "kW"),
    "horsepower": ("horsepower", "hp"),
    "pascal": ("pascals", "pascal", "Pa"),
    "kilopascal": ("kilopascals", "kilopascal", "kPa"),
    "bar": ("bars", "bar"),
    "psi": ("psi",),
    "atmosphere": ("atmospheres", "atmosphere", "atm"),
    # data
    "byte": ("bytes", "byte"),
    "kilobyte": ("kilobytes", "kilobyte", "kB", "KB"),
    "megabyte": ("megabytes", "megabyte", "MB"),
    "gigabyte": ("gigabytes", "gigabyte", "GB"),
    "terabyte": ("terabytes", "terabyte", "TB"),
    "kibibyte": ("kibibytes", "kibibyte", "KiB"),
    "mebibyte": ("mebibytes", "mebibyte", "MiB"),
    "gibibyte": ("gibibytes", "gibibyte", "GiB"),
}

# Symbols are case-sensitive ("m" metre, "M" nothing; "F" Fahrenheit only in capitals); words are not.
_ALIAS_TO_UNIT: dict[str, str] = {}
_SYMBOL_TO_UNIT: dict[str, str] = {}
for _unit, _aliases in UNIT_ALIASES.items():
    for _alias in _aliases:
        is_word = len(_alias) > 3 and _alias.replace(" ", "").replace("-", "").isalpha()
        (_ALIAS_TO_UNIT if is_word else _SYMBOL_TO_UNIT)[_alias.lower() if is_word else _alias] = _unit


def _alternation(names: list[str]) -> str:
    # Longest first, so "square metres" wins over "metres" and "km/h" over "km".
    return "|".join(re.escape(name).replace(r"\ ", r"\s+") for name in sorted(names, key=len, reverse=True))


_UNIT = (
    r"(?:(?i:degrees?\s+)?(?:(?i:"
    + _alternation(list(_ALIAS_TO_UNIT))
    + r")"
    + r"|"
    + _alternation(list(_SYMBOL_TO_UNIT))
    + r"))(?![\w°²³/])"
)
_NUMBER = r"-?\d{1,15}(?:,\d{3})*(?:\.\d+)?"
_AMOUNT = rf"(?:(?P<value>{_NUMBER})\s*|(?P<one>(?i:an?|one))\s+)"  # "26.2 miles", "26.2mi", "a day"
_CONVERSIONS = [
    # convert 100 F to C; convert 26.2 miles into km
    re.compile(rf"(?i:\bconvert)\s+(?P<value>{_NUMBER})\s*(?P<source>{_UNIT})\s+(?i:to|into|in)\s+(?P<target>{_UNIT})"),
    # how many kilometres is 26.2 miles; how many seconds are there in a day
    re.compile(
        rf"(?i:\bhow\s+many)\s+(?P<target>{_UNIT})\s+(?i:(?:is|are|make|makes)(?:\s+there)?(?:\s+in)?|in)\s+"
        rf"{_AMOUNT}(?P<source>{_UNIT})"
    ),
    # 26.2 miles in km; what is 100 °F in °C; 5 feet to metres
    re.compile(
        rf"(?<![\w.])(?P<value>{_NUMBER})\s*(?P<source>{_UNIT})\s+(?i:in|to|into|as|in\s+terms\s+of)\s+"
        rf"(?P<target>{_UNIT})"
    ),
]


@dataclass(frozen=True)
class Conversion:
    """A conversion found in text: `value` `source` -> `target` (pint unit expressions)."""

    value: Fraction
    source: str
    target: str
    text: str  # the phrase as written, e.g. "26.2 miles in km"

    def describe(self) -> str:
        return f"{format_number(self.value)} {self.source} -> {self.target}"


def unit_for(alias: str) -> str | None:
    """The pint unit expression for a written unit ("kilometres" -> "kilometer", "F" -> "degree_Fahrenheit")."""
    words = re.sub(r"\s+", " ", alias.strip())
    # "degrees F" is "F"; but "degrees celsius" is itself an alias, so try the words as written first.
    for candidate in (words, re.sub(r"^degrees? ", "", words, flags=re.IGNORECASE)):
        unit = _ALIAS_TO_UNIT.get(candidate.lower()) or _SYMBOL_TO_UNIT.get(candidate)
        if unit is not None:
            return unit
    return None


def looks_like_conversion(text: str) -> bool:
    """Cheap check (no pint) for the router: does the text ask for a unit conversion?"""
    return extract_conversion(text) is not None


def extract_conversion(text: str) -> Conversion | None:
    """The conversion asked for in `text`, or None: "How many kilometres is 26.2 miles?" -> 26.2 mile -> km."""
    if not text or not text.strip():
        return None
    text = text[:MAX_TEXT_CHARS]
    for pattern in _CONVERSIONS:
        for match in pattern.finditer(text):
            source, target = unit_for(match.group("source")), unit_for(match.group("target"))
            if source is None or target is None or source == target:
                continue
            raw = match.group("value")
            value = Fraction(raw.replace(",", "")) if raw else Fraction(1)  # "a day" is one day
            return Conversion(value, source, target, match.group().strip())
    return None


# --------------------------------------------------------------------------------------------------
# pint

_registry: pint.UnitRegistry | None = None
_registry_lock = threading.Lock()


def unit_registry():
    """pint's registry, built once (about a second) and shared; MissingDependency without pint."""
    global _registry
    with _registry_lock:
        if _registry is None:
            try:
                import pint
            except ImportError:
                raise MissingDependency("unit conversion needs pint: pip install 'pint>=0.23'") from None
            _registry = pint.UnitRegistry()
        return _registry


def warm_up() -> threading.Thread:
    """Build the registry in a daemon thread, so the first conversion does not spend a round's deadline on it."""
    thread = threading.Thread(target=_warm, daemon=True, name="surprisegate-pint")
    thread.start()
    return thread


def _warm() -> None:
    try:
        unit_registry()
    except MissingDependency:
        pass  # reported when a conversion is actually asked for


@dataclass(frozen=True)
class ConversionResult:
    conversion: Conversion
    result: float
    source_symbol: str  # "mi"
    target_symbol: str  # "km"
    shown: str  # the result rounded for people: "42.1648"
    exact: bool  # False when `shown` is rounded

    @property
    def claim(self) -> str:
        return f"{format_number(self.conversion.value)} {self.source_symbol} = {self.shown} {self.target_symbol}"


# Where pint's abbreviation reads oddly ("d", "cp", "t"), people's words instead: (singular, plural).
_SPELLED_OUT = {
    "day": ("day", "days"),
    "week": ("week", "weeks"),
    "stone": ("stone", "stone"),
    "metric_ton": ("tonne", "tonnes"),
    "quart": ("quart", "quarts"),
    "pint": ("pint", "pints"),
    "cup": ("cup", "cups"),
    "acre": ("acre", "acres"),
    "knot": ("knot", "knots"),
    "fluid_ounce": ("fl oz", "fl oz"),
    "mile / hour": ("mph", "mph"),
}


def _symbol(unit: str, quantity, amount: float) -> str:
    if unit in _SPELLED_OUT:
        singular, plural = _SPELLED_OUT[unit]
        return singular if amount == 1 else plural
    return f"{quantity.units:~P}"


_UNIT_EXPRESSION = re.compile(r"^[A-Za-z_ °º²³/*^0-9.]+$")


def convert(value: float | Fraction | str, source: str, target: str) -> ConversionResult:
    """Convert `value` `source` units to `target` units: convert(26.2, "mile", "kilometer").shown == "42.1648".

    Units may be written as people write them ("miles", "°F") or as pint expressions ("mile / hour").
    Raises InputError for unknown or incompatible units and for magnitudes beyond 1e15.
    """
    try:
        magnitude = Fraction(str(value).replace(",", "")) if isinstance(value, str) else Fraction(value)
    except (ValueError, ZeroDivisionError, TypeError):
        raise InputError(f"value {value!r} is not a number; give e.g. 26.2") from None
    if abs(magnitude) > MAX_MAGNITUDE:
        raise InputError(f"value {value!r} is too large; keep magnitudes within {MAX_MAGNITUDE:g}")
    source_unit, target_unit = _pint_unit(source), _pint_unit(target)
    registry = unit_registry()
    import pint  # present: unit_registry() succeeded

    try:
        quantity = registry.Quantity(float(magnitude), source_unit)  # Quantity(): offset units (°F) need it
        converted = quantity.to(target_unit)
    except pint.DimensionalityError:
        raise InputError(
            f"cannot convert {source!r} to {target!r}: {registry.parse_units(source_unit).dimensionality} "
            f"is not {registry.parse_units(target_unit).dimensionality}"
        ) from None
    except (pint.PintError, ValueError, TypeError, AttributeError) as err:
        raise InputError(f"cannot convert {source!r} to {target!r}: {err}") from None
    result = float(converted.magnitude)
    if not math.isfinite(result):
        raise InputError(f"converting {value!r} {source!r} to {target!r} overflows")
    shown = format_number(result)
    # Rounding that only hides float noise (0.30479999999999996 -> 0.3048) still counts as exact.
    exact = abs(float(Fraction(shown)) - result) <= 1e-9 * max(abs(result), 1e-300)
    conversion = Conversion(magnitude, source_unit, target_unit, f"{value} {source} -> {target}")
    return ConversionResult(
        conversion,
        result,
        _symbol(source_unit, quantity, float(magnitude)),
        _symbol(target_unit, converted, result),
        shown,
        exact,
    )


def _pint_unit(written: str) -> str:
    if not isinstance(written, str) or not written.strip() or len(written) > MAX_UNIT_CHARS:
        raise InputError(f"unit {written!r} must be a short unit name such as 'km' or 'miles'")
    known = unit_for(written)
    if known is not None:
        return known
    # Anything else goes to pint's own unit parser (never eval), restricted to plain unit characters.
    if not _UNIT_EXPRESSION.match(written):
        raise InputError(f"unit {written!r} has characters a unit never has; use e.g. 'km', 'mile / hour'")
    registry = unit_registry()
    try:
        registry.parse_units(written)
    except Exception as err:  # noqa: BLE001 - pint raises several types for unparseable units
        raise InputError(f"unit {written!r} is unknown ({type(err).__name__}); use e.g. 'km', 'lb', 'degF'") from None
    return written


def convert_conversion(conversion: Conversion) -> ConversionResult:
    """Run a conversion found by `extract_conversion`, keeping the phrase it came from."""
    result = convert(conversion.value, conversion.source, conversion.target)
    return ConversionResult(
        conversion, result.result, result.source_symbol, result.target_symbol, result.shown, result.exact
    )


def conversion_evidence(result: ConversionResult, field_name: str = "") -> Evidence:
    verb = "is" if result.exact else "is about"
    amount = format_number(result.conversion.value)
    return tool_evidence(
        "units",
        claim=result.claim,
        evidence=f"{amount} {result.source_symbol} {verb} {result.shown} {result.target_symbol}.",
        tool_input=result.conversion.describe(),
        output=f"{result.shown} {result.target_symbol}",
        sandbox="none",
        exact=result.exact,
        field=field_name,
    )
