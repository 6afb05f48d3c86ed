"""Text rules, one copy each: sentence ends, sentence splitting, words, stopwords and stemming. Pure.

Sentence ends follow the grading rule of the evaluation sets (shared/data/README.md): a sentence ends at
. ! or ? followed by whitespace or the end of the text, but not at a dot after a single capital letter
("U.S.", "J. Smith") or a common abbreviation ("St.", "Inc.", "Jan."). Grading, the rewrite check, the
arms' sentence picking, the stores' name detection and FLARE's look-ahead all use this one rule, so a
passage is not cut at "St. Louis" where a reply is not.
"""

from __future__ import annotations

import re
import sqlite3
import threading
import unicodedata
from collections.abc import Iterator, Sequence
from fractions import Fraction

# --------------------------------------------------------------------------------------------
# words
# --------------------------------------------------------------------------------------------
WORD = re.compile(r"[^\W_]+")  # letters and digits; SQLite FTS5's unicode61 tokenizer splits the same way


def fold(text: str) -> str:
    """Lower-case and strip accents: "Élysée" -> "elysee"."""
    text = unicodedata.normalize("NFKD", text)
    return "".join(c for c in text if not unicodedata.combining(c)).lower()


# --------------------------------------------------------------------------------------------
# sentence ends
# --------------------------------------------------------------------------------------------
# - A single capital is a capital letter that starts a word: "U.S." and "J." do not end a sentence, "USA."
#   and "DNA." do. Capitals: ASCII and Latin-1 ("É. Macron").
# - Abbreviations are whole words, case-sensitive as listed: "No. 5" goes on, "The answer is no." ends;
#   "vs." is lowercase already. "May" is a full month name, not an abbreviation: "born in May." ends.
# - Only the dot has exceptions: "!" and "?" do not abbreviate, so "Is it H? No." ends at "?".
ABBREVIATIONS = (
    "St",
    "Mt",
    "Dr",
    "Mr",
    "Mrs",
    "Ms",
    "Jr",
    "Sr",
    "vs",
    "Inc",
    "Ltd",
    "Co",
    "Corp",
    "No",
    "Jan",
    "Feb",
    "Mar",
    "Apr",
    "Jun",
    "Jul",
    "Aug",
    "Sep",
    "Sept",
    "Oct",
    "Nov",
    "Dec",
)
# Python's look-behinds are fixed width: one per abbreviation length.
_NOT_AFTER_ABBREVIATION = "".join(
    r"(?<!\b(?:" + "|".join(w for w in ABBREVIATIONS if len(w) == n) + "))"
    for n in sorted({len(w) for w in ABBREVIATIONS})
)
_NOT_AFTER_SINGLE_CAPITAL = r"(?<!\b[A-ZÀ-ÖØ-Þ])"  # \b before a letter: no letter or digit precedes it
# The stop character that can end a sentence (look-behinds only before it); what must follow it depends on
# the reader below.
SENTENCE_STOP = r"(?:[!?]|" + _NOT_AFTER_ABBREVIATION + _NOT_AFTER_SINGLE_CAPITAL + r"\.)"
_STOP = re.compile(SENTENCE_STOP)
# Finished text: the stop is followed by whitespace or the end.
_END = re.compile(SENTENCE_STOP + r"(?=\s|$)")
# Text still being written: "3." may become "3.14", so only whitespace after the stop (or a line break) ends it.
_END_WHILE_WRITING = re.compile(SENTENCE_STOP + r"(?=\s)|\n")
_STOP_CHARACTERS = (".", "!", "?", "\n")  # every end _END_WHILE_WRITING finds is one of these
# Text that has reached a sentence end, however much whitespace follows it.
_ENDS_HERE = re.compile(r"(?:" + SENTENCE_STOP + r"|\n)\s*$")
# Splitting prose: a stop, whitespace, and a next sentence that opens as one: a capital, perhaps after a
# quote or bracket. A lower-case word or a digit after a stop means an abbreviation the list lacks
# ("e.g. the", "ca. 1959", "Supp. 2d": in the web corpus and the fact passages every stop before a digit is one).
# Paragraphs glued without a space are two sentences too: "...in 1844.First for Women is ...", and
# "...and actor.H. Bruce ..." before an initial (two lower-case letters first, so "Ph.D." stays whole).
_BREAK = re.compile(
    r"(?P<stop>" + SENTENCE_STOP + r")\s+(?=[\"'“(\[]?[A-Z])"
    r"|(?<=[a-z0-9)\]\"'])(?P<glued>" + SENTENCE_STOP + r")(?=[A-Z][a-z]|(?<=[a-z]{2}.)[A-Z]\.)"
)


def first_sentence(text: str) -> str:
    """The first sentence of `text`, stripped (the whole text when no sentence ends)."""
    text = text.strip()
    m = _END.search(text)
    return text[: m.end()] if m else text


def sentence_end(text: str, start: int = 0) -> int | None:
    """Index just past the first sentence end at or after `start` in text still being written, or None while
    the sentence is open: the stop needs whitespace after it ("3." may become "3.14"); a line break ends one."""
    m = _END_WHILE_WRITING.search(text, start)
    return m.end() if m else None


def sentence_end_after(text: str, searched: int) -> int | None:
    """sentence_end(text) for text whose first `searched` characters held no end when searched: an end the
    new characters make is a stop at or after character searched - 1 (a stop whose whitespace just came),
    and the look-behinds still see the characters before it. Token by token this searches a few characters,
    not the whole open sentence again, and none at all where no stop or line break came."""
    start = max(0, searched - 1)
    if not any(stop in text[start:] for stop in _STOP_CHARACTERS):
        return None
    return sentence_end(text, start)


def sentence_start(text: str, index: int) -> int:
    """Index where the sentence holding `text[index]` begins (just past the previous sentence end)."""
    start = 0
    for m in _END_WHILE_WRITING.finditer(text):
        if m.end() > index:
            break
        start = m.end()
    return start + (len(text[start:]) - len(text[start:].lstrip()))


def current_sentence(text: str) -> str:
    """The sentence a reply is writing, stripped: the last one, even when it has just ended."""
    written = len(text.rstrip())
    start = 0
    for m in _END.finditer(text):
        if m.end() < written:
            start = m.end()
    return text[start:].strip()


def ends_sentence(text: str) -> bool:
    """Whether `text` (a look-ahead being decoded) has reached a sentence end: "It is in St." has not."""
    return _ENDS_HERE.search(text) is not None


def stops_between(text: str, start: int, end: int) -> bool:
    """Whether a sentence stop stands in `text[start:end]` (the gap between two words), judged with the
    words before it: the gap after "St" in "St. Louis" holds none, the gap after "end" in "end. Then" does."""
    return _STOP.search(text, start, end) is not None


def name_tokens(text: str) -> Iterator[tuple[str, bool, bool]]:
    """Yield (token, looks_like_name, follows_previous_word) for each word of `text`.

    A name is capitalised inside a sentence; `follows_previous_word` is true when only spaces or a
    hyphen separate it from the word before ("Burkina Faso", "Bobo-Dioulasso").
    """
    text = unicodedata.normalize("NFKC", text)
    previous_end = None
    for match in WORD.finditer(text):
        token = match.group()
        between = "." if previous_end is None else text[previous_end : match.start()]
        # After a stop that ends no sentence a capital is a name ("Louis" in "St. Louis", "Virgin" in "U.S. Virgin
        # Islands"); a letter glued on by a dot alone is part of the abbreviation ("S" in "U.S."), as before.
        sentence_start = previous_end is None or between == "." or stops_between(text, previous_end, match.start())
        previous_end = match.end()
        yield token, token[0].isupper() and not sentence_start, between.strip() in ("", "-")


def first_stop(text: str, stops: Sequence[str], start: int = 0) -> int | None:
    """Index of the earliest stop string (a request's `stop`) in `text` at or after `start` (None: none)."""
    hits = [i for i in (text.find(s, start) for s in stops) if i >= 0]
    return min(hits) if hits else None


def split_sentences(text: str) -> list[str]:
    """The sentences of a passage, in order, each a stripped piece of it; none for blank text."""
    text = text.strip()
    sentences, start = [], 0
    for m in _BREAK.finditer(text):
        sentences.append(text[start : m.end("stop") if m.group("stop") else m.end("glued")])
        start = m.end()
    sentences.append(text[start:])
    return [s for s in sentences if s]


# A sentence repeats another when both have this many distinct words and share this much of their union
# (the repetition guard's and the unsaid items' rule, gate/repetition.py and gate/rewrite.py).
MIN_WORDS = 5
OVERLAP = 0.7


def repeats(sentence: str, earlier: Sequence[str], min_words: int = MIN_WORDS, overlap: float = OVERLAP) -> int | None:
    """Index of the first of `earlier` that `sentence` repeats (their distinct words, case folded, overlap by
    at least `overlap` of their union, both having `min_words`); None when it repeats none."""
    words = set(WORD.findall(fold(sentence)))
    if len(words) < min_words:
        return None
    for i, other in enumerate(earlier):
        seen = set(WORD.findall(fold(other)))
        if len(seen) >= min_words and len(words & seen) >= overlap * len(words | seen):
            return i
    return None


# --------------------------------------------------------------------------------------------
# stopwords: each set serves one purpose; its comment says which
# --------------------------------------------------------------------------------------------
# English function words: they carry no topic. The local web index drops them from documents and queries,
# which keeps "which magazine was started first" about magazines.
STOPWORDS = frozenset(
    """a about above after again against all am an and any are as at be because been before being
    below between both but by can could did do does doing down during each few for from further had
    has have having he her here hers herself him himself his how i if in into is it its itself just
    me more most my myself no nor not now of off on once only or other our ours ourselves out over own
    same she should so some such than that the their theirs them themselves then there these they
    this those through to too under until up very was we were what when where which while who whom
    whose why will with would you your yours yourself yourselves s t d ll m re ve""".split()
)
# A question's words that never pick a memory passage: function words, request words, and arithmetic
# operators ("What is 2 times 2?" is about no passage). Only for queries: a document's "Times" is a name.
QUERY_STOPWORDS = STOPWORDS | frozenset("tell please one plus minus times multiplied divided".split())
# Words whose repetition does not show that a rewrite used its evidence: function words, and the glue of
# every templated evidence sentence ("also", "includes"). Narrower than STOPWORDS: "same", "before", "more"
# can be the evidence's answer.
EVIDENCE_STOPWORDS = frozenset(
    "a an and are as at be been by for from has have he her his in is it its of on or she that the their "
    "there they this to was were which who with about also include includes including".split()
)
# Words that never decide a question's kind: question words, articles and the cloze prompt's
# "complete the sentence", so that "What is the capital of X?" is of kind "capital".
KIND_STOPWORDS = frozenset(
    "what which who whom whose where when why how is are was were the a an of in on at to did does do for from "
    "by with as and or its it this that there be become became complete sentence".split()
)
# Capitalised words that name nothing: sentence openers, pronouns, question words, courtesy. The router's
# test for a named entity skips them.
NOT_NAMES = frozenset(
    """a an the i i'm i've i'd it it's its this that these those there here he she they we you my your his her our
    their in on at of for to by from with as and or but if so yes no not sure well however also then thus
    therefore what who whom whose when where which why how is are was were be been do does did can could will
    would should may might must shall has have had am let okay ok hello hi thanks thank please note first second
    finally answer
    """.split()
)


# --------------------------------------------------------------------------------------------
# stemming
# --------------------------------------------------------------------------------------------
def light_stem(word: str) -> str:
    """Fold case, accents and common English endings so "borders" meets "border" and "churches" "church".

    For comparing words outside an index (sentence picking, the local web index). Light on purpose: it
    never merges two different words a fact question tells apart, as a full stemmer can.
    """
    word = fold(word)
    if len(word) > 4 and word.endswith("ies"):
        return word[:-3] + "y"
    if len(word) > 4 and word.endswith(("ches", "shes", "sses", "xes", "zes")):
        return word[:-2]
    if len(word) > 3 and word.endswith("s") and not word.endswith("ss"):
        return word[:-1]
    if len(word) > 4 and word.endswith("ed"):
        return word[:-2]
    if len(word) > 5 and word.endswith("ing"):
        return word[:-3]
    return word


def stems(text: str) -> set[str]:
    """The light stems of the words of `text`."""
    return {light_stem(word) for word in WORD.findall(text)}


# The memory store's index tokenizer (SQLite FTS5: porter stemming, case and accent folding). A store that
# keeps its own index (Milvus) must cut words exactly as FTS5 does, so that one relevance floor fits both.
FTS_TOKENIZER = "porter unicode61 remove_diacritics 2"


class IndexStemmer:
    """SQLite FTS5's tokenizer as a function: text in, stems out, in order.

    Rows go into an in-memory FTS5 table, their tokens come back through `fts5vocab`, and the
    transaction is rolled back, so the scratch table stays empty. Thread-safe.
    """

    CACHE_LIMIT = 100_000

    def __init__(self) -> None:
        self._conn = sqlite3.connect(":memory:", check_same_thread=False, isolation_level=None)
        self._conn.executescript(
            f"""CREATE VIRTUAL TABLE scratch USING fts5(title, text, tokenize='{FTS_TOKENIZER}');
                CREATE VIRTUAL TABLE scratch_tokens USING fts5vocab(scratch, 'instance');"""
        )
        self._lock = threading.Lock()
        self._word_stems: dict[str, tuple[str, ...]] = {}

    def passages(self, rows: list[tuple[str, str]]) -> list[tuple[list[str], list[str]]]:
        """(title stems, text stems) for each (title, text)."""
        tokens: list[tuple[list, list]] = [([], []) for _ in rows]
        with self._lock:
            self._conn.execute("BEGIN")
            try:
                self._conn.executemany(
                    "INSERT INTO scratch(rowid, title, text) VALUES (?, ?, ?)",
                    ((doc, title, text) for doc, (title, text) in enumerate(rows)),
                )
                for doc, column, offset, term in self._conn.execute(
                    "SELECT doc, col, offset, term FROM scratch_tokens"
                ):
                    tokens[doc][column == "text"].append((offset, term))
            finally:
                self._conn.execute("ROLLBACK")
        return [([term for _, term in sorted(title)], [term for _, term in sorted(text)]) for title, text in tokens]

    def stems(self, word: str) -> tuple[str, ...]:
        """The stems of one query word: usually one ("capitals" -> "capit"), none for punctuation."""
        cached = self._word_stems.get(word)
        if cached is None:
            cached = tuple(self.passages([("", word)])[0][1])
            with self._lock:
                if len(self._word_stems) >= self.CACHE_LIMIT:  # bound the cache in long-lived processes
                    self._word_stems.clear()
                self._word_stems[word] = cached
        return cached


# --------------------------------------------------------------------------------------------
# normalised words and parsed numbers: what grading and the rewrite checks compare
# --------------------------------------------------------------------------------------------
_ARTICLES = ("the ", "a ", "an ")
_LEADING_ARTICLES = re.compile("^(?:" + "|".join(_ARTICLES) + ")+")
_NUMBER = re.compile(
    r"(?<![\w.])[-+−]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:/\d+)?(?![\w])"
    r"(?:\s+(hundred|thousand|million|billion)\b)?",
    re.IGNORECASE,
)

_UNITS = {
    w: i
    for i, w in enumerate(
        "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen "
        "seventeen eighteen nineteen".split()
    )
}
_TENS = {
    w: 10 * i for i, w in enumerate("_ _ twenty thirty forty fifty sixty seventy eighty ninety".split()) if w != "_"
}
_SCALES = {"hundred": 100, "thousand": 1_000, "million": 1_000_000, "billion": 1_000_000_000}
_NUMBER_WORDS = set(_UNITS) | set(_TENS) | set(_SCALES)


def normalise(text: str) -> str:
    """Lower-case, strip accents and punctuation, collapse whitespace, drop leading articles.

    All of them ("A: a 0" -> "0"), so that normalising twice changes nothing.
    """
    text = fold(text)
    text = re.sub(r"[^\w\s]|_", " ", text)
    text = " ".join(text.split())
    return _LEADING_ARTICLES.sub("", text)


def _words_to_numbers(text: str) -> str:
    """Replace runs of English number words ("twenty-one", "two hundred five") with digits."""
    pieces = re.findall(r"[A-Za-z]+|[^A-Za-z]+", text)
    out: list[str] = []
    i = 0
    while i < len(pieces):
        if pieces[i].lower() in _NUMBER_WORDS and not (pieces[i].lower() in _SCALES and not _after_digit(out)):
            # Extend the run over number words joined by spaces or hyphens.
            j = i + 1
            while (
                j + 1 < len(pieces) and pieces[j].strip() in ("", "-", "and") and pieces[j + 1].lower() in _NUMBER_WORDS
            ):
                j += 2
            words = [pieces[k].lower() for k in range(i, j, 2)]
            value = _word_run_value(words)
            out.append(str(value) if value is not None else "".join(pieces[i:j]))
            i = j
        else:
            out.append(pieces[i])
            i += 1
    return "".join(out)


def _after_digit(out: list[str]) -> bool:
    # "9.5 million" is handled as a scaled number, not as the word run "million".
    return not ("".join(out[-2:]).rstrip()[-1:].isdigit() if out else False)


def _word_run_value(words: list[str]) -> int | None:
    total, current = 0, 0
    seen = False
    for w in words:
        if w in _UNITS:
            current += _UNITS[w]
        elif w in _TENS:
            current += _TENS[w]
        elif w in _SCALES:
            scale = _SCALES[w]
            if scale == 100:
                current = max(current, 1) * 100
            else:
                total += max(current, 1) * scale
                current = 0
        else:
            return None
        seen = True
    return total + current if seen else None


def parse_numbers(text: str) -> list[Fraction]:
    """Every number in `text`, in order: "1,234", "3.5", "-7", "1/2", "twelve"."""
    text = _words_to_numbers(text).replace("−", "-")
    out: list[Fraction] = []
    for m in _NUMBER.finditer(text):
        raw = m.group().split()[0].replace(",", "").lstrip("+")
        try:
            value = Fraction(raw)
        except (ValueError, ZeroDivisionError):
            continue
        out.append(value * _SCALES[m.group(1).lower()] if m.group(1) else value)
    return out
