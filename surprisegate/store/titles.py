"""Which of a store's titles a text names: how the memory arm finds the subject of a question, however it
is worded ("Hey, so which city is Burkina Faso's capital?", "capital of burkina faso").

Pure: a `TitleIndex` is built from the titles a store holds and answers `named(text)`. A title is named when
its words appear in the text as consecutive whole words, case and accents folded. In a text that writes
names with capitals, the title's capitals must be written too: "Can you lead me to the capital of France?"
names France, not the element Lead. A text in lower case throughout says nothing by case, so any title counts.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Callable, Iterable

from ..text import WORD, fold, name_tokens

MOST_TITLE_WORDS = 8  # longer titles ("Saint Helena, Ascension and Tristan da Cunha") are rare; all are still named


def title_key(title: str) -> str:
    """The title's words, folded and joined by one space: "Bobo-Dioulasso" -> "bobo dioulasso"."""
    return " ".join(WORD.findall(fold(unicodedata.normalize("NFKC", title))))


def writes_names(text: str) -> bool:
    """Whether `text` capitalises a word inside a sentence (a name, as the store's query terms read names), so
    that case can tell names from words."""
    return any(looks_like_name for _, looks_like_name, _ in name_tokens(text))


class TitleIndex:
    """The distinct titles of a store, by key; `named(text)` lists those a text names, most specific first.

    `passages_naming(title)` (optional) counts the passages whose text holds the title: of two titles named,
    the one fewer passages mention is the subject ("the capital of the U.S. state of Georgia": Georgia, not
    U.S.). Without it, the title of more words goes first, then the later one in the text.
    """

    def __init__(self, titles: Iterable[str], passages_naming: Callable[[str], int] | None = None):
        self._titles: dict[str, str] = {}
        for title in titles:
            key = title_key(title)
            if key and key not in self._titles:
                self._titles[key] = title.strip()
        self.most_words = min(MOST_TITLE_WORDS, max((k.count(" ") + 1 for k in self._titles), default=0))
        self._passages_naming = passages_naming

    def __len__(self) -> int:
        return len(self._titles)

    def named(self, text: str) -> list[str]:
        """The titles `text` names, no two over the same words, most specific first."""
        text = unicodedata.normalize("NFKC", text)
        words = list(WORD.finditer(text))
        folded = [fold(m.group()) for m in words]
        match_case = writes_names(text)
        taken: set[int] = set()
        found: list[tuple[int, int, str]] = []  # (words, position, title)
        for size in range(min(self.most_words, len(words)), 0, -1):  # longest first: "Guinea-Bissau" over "Guinea"
            for start in range(len(words) - size + 1):
                span = range(start, start + size)
                title = self._titles.get(" ".join(folded[start : start + size]))
                if title is None or taken.intersection(span):
                    continue
                if match_case and not _cased_as(title, [words[i].group() for i in span]):
                    continue
                taken.update(span)
                found.append((size, start, title))
        return [title for _, _, title in sorted(found, key=self._specificity)]

    def _specificity(self, item: tuple[int, int, str]) -> tuple[int, int, int]:
        size, start, title = item
        mentions = self._passages_naming(title) if self._passages_naming else 0
        return (mentions, -size, -start)


def _cased_as(title: str, written: list[str]) -> bool:
    """Whether each word of the title that starts with a capital is written with one."""
    title_words = WORD.findall(unicodedata.normalize("NFKC", title))
    if len(title_words) != len(written):  # folding changed the word count (rare ligatures): judge by the text
        return any(w[:1].isupper() for w in written)
    return all(w[:1].isupper() or not t[:1].isupper() for t, w in zip(title_words, written, strict=True))
