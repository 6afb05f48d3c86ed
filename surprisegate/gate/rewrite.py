"""The rewrite check: a rewrite stands only once its sentence shows it used its evidence and answers the
question (rewrite_checks.py); until then nothing of it is shown. One that fails is tried once more, the
evidence still in context; one that fails again is dropped for the reply written without it. So an
intervention may fail to help, but it never makes the reply worse. In a paragraph, a failed rewrite is first
tried as its first clause and the model's own later clause (`spliced_reply`), and a paragraph a rewrite
changed that ends owing an asked item goes on (`UnsaidItems`).

The loop opens a check on every rewind (`opened`), asks it after every token (`check`) and at the end of
the turn (`end_of_turn`), and hands it a backend fault (`on_fault`).
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from fractions import Fraction
from typing import cast

from ..arms import Query
from ..backends import Backend, LocalBackend, SteerableBackend
from ..backends.capabilities import VocabSize
from ..config import Config
from ..text import repeats, sentence_end, sentence_start, split_sentences, stems
from .claims import asked_parts, distinct_parts, kind_stems
from .events import Event, Rewind
from .receipts import ConvergenceRecord
from .reply import PARAGRAPH_END, Context, Decoding, Emitter, Reply, Snapshot
from .rewrite_checks import (
    UNUSED_EVIDENCE,
    answer_tail,
    claims_from_evidence,
    clause_break,
    computed_answer,
    cut_short,
    dropped_claim,
    rewrite_problem,
    states_evidence_claim,
    unsaid_evidence_words,
)

# How often a tail after a computed answer is cut and written again before the sentence stands as it is.
ANSWER_LAST_TRIES = 2


@dataclass
class Unchecked:
    """A rewrite that has not yet shown it used its evidence: where to go back to, and where to retry from."""

    before: Snapshot  # at the trigger: the reply without its triggering token, which was never fed
    span_start: int  # reply index where the first unchecked rewrite begins; nothing from here is shown
    first_round: int  # index in `rounds` of the first round it covers
    check_from: int = 0  # reply index of the latest rewind: its sentence is the one checked
    evidence: list[str] = field(default_factory=list)
    after_injection: Snapshot | None = None  # right after the latest injection: a retry starts here
    tried_again: bool = False  # one more try per rewrite, then it is dropped
    answer: Fraction | None = None  # a tool's computed value: it ends its claim (config.answer_last)
    tail_cuts: int = 0  # tails cut after it so far
    tail_banned: tuple[int, frozenset[int]] = (-1, frozenset())  # (reply index, tokens banned there)
    claim: Query | None = None  # sentence scope: what the arms were asked about the sentence it replaces
    reply_went_on: bool = False  # sentence scope: the reply went on after the sentence it replaces
    own_sentence: list[int] = field(default_factory=list)  # sentence scope: the model's tokens it replaces
    written: Reply | None = None  # sentence scope: the reply as the model wrote it, up to the round
    # A round for an unsaid item: `before` is the whole reply, and a revert goes on past where it was pushed on
    # (its end of turn, or a repeat's first token, banned), as it would have without the round.
    pushed_past: frozenset[int] = frozenset()

    @property
    def item(self) -> str:
        """A round for an unsaid item: the question's words for it ("its currency"), what its arms were asked."""
        return self.claim.sentence if self.claim is not None and self.claim.asked_item else ""

    def replaces(self, own_sentence: list[int], reply_went_on: bool, written: Reply | None = None) -> None:
        """Sentence scope: the model's own tokens this rewrite replaces, whether its reply went on after them, and
        the reply they end (`written`: with their signals, for a splice)."""
        self.own_sentence, self.reply_went_on, self.written = list(own_sentence), reply_went_on, written


class EvidenceOpeners:
    """config.retry_opens_evidence: a failed rewrite's one more try starts with a word of its evidence that neither
    the sentence so far nor the question holds. Its first step bans every other token: "Its capital is Malaita."
    ignored "… is Palikir." twice; the retry may only open "Federated", "States" or "Palikir". In process only,
    where banning most of the vocabulary for one step is one masked copy of the logits."""

    def __init__(
        self, tokenize: Callable[[str], list[int]], n_vocab: int, token_bytes: Callable[[int], bytes] | None = None
    ) -> None:
        self.tokenize, self.n_vocab, self.token_bytes = tokenize, n_vocab, token_bytes
        # A vocabulary that joins a space to the word after it ("▁the") writes a bare space only before what it
        # splits (SmolLM2: " 1889" is " " + digits): there a bare space opens no word, and a retry let open so wrote
        # " \n". One that writes every space apart (bytes) opens every word so.
        self.spaces_apart = not self._holds_text(tokenize(" the")[0])

    def _holds_text(self, token: int) -> bool:
        """Whether the token holds more than whitespace (unknown without the backend's token_bytes: it does)."""
        return self.token_bytes is None or bool(self.token_bytes(token).strip())

    @classmethod
    def of(cls, backend: Backend, config: Config) -> EvidenceOpeners | None:
        n_vocab = backend.n_vocab if isinstance(backend, VocabSize) else None
        local = isinstance(backend, LocalBackend) and isinstance(backend, SteerableBackend)
        if not ((config.retry_opens_evidence or config.item_retry_opens_evidence) and local and n_vocab):
            return None
        steerable = cast(SteerableBackend, backend)
        return cls(steerable.tokenize, n_vocab, steerable.token_bytes)

    def openers(self, evidence: list[str], said: str, like: str = "", spaced: bool = False) -> frozenset[int]:
        """The first tokens of the evidence's unsaid words (of the shape of `like`, the doubted words), with and
        without the space before them; `spaced`: with it only (the text before ends in a word or a stop, and an
        item's sentence opened "Lilongwe" glued onto "(MWK).")."""
        words = unsaid_evidence_words(evidence, said, like) or unsaid_evidence_words(evidence, said)
        forms = [" " + word for word in words] + ([] if spaced else words)
        firsts = (ids[0] for text in forms if (ids := self.tokenize(text)))
        return frozenset(token for token in firsts if self.spaces_apart or self._holds_text(token))

    def bans(self, evidence: list[str], said: str, like: str = "", spaced: bool = False) -> frozenset[int]:
        """Every token but the openers (none banned when the evidence has no word left to open with)."""
        openers = self.openers(evidence, said, like, spaced)
        return frozenset(range(self.n_vocab)) - openers if openers else frozenset()


def needs_space(text: str) -> bool:
    """Whether a word written after `text` must open with a space: it ends in a letter, digit or stop."""
    return bool(text) and (text[-1].isalnum() or text[-1] in ".!?,;:")


def checked_sentence(reply: Reply, unchecked: Unchecked, final: bool) -> tuple[int, str] | None:
    """(where it starts in the reply text, the sentence) holding the latest rewrite; None while it is open."""
    text = reply.text()
    at = len(reply.text(unchecked.check_from))
    end = sentence_end(text, at)
    if end is None and not final:
        return None
    start = sentence_start(text, at)
    return start, text[start:end]


def rewrite_verdict(
    reply: Reply, unchecked: Unchecked, question: str, final: bool, keeps_asked: bool = False
) -> tuple[bool, str | None]:
    """(checked, problem) for the sentence holding the latest rewrite: (False, None) while it is open;
    once finished, the reason it must be dropped (`rewrite_problem`) or None when it stands. A rewritten
    sentence of a paragraph is checked against what it was asked about, and must still state its claim."""
    checked = checked_sentence(reply, unchecked, final)
    if checked is None:
        return False, None
    claim = unchecked.claim
    if claim is None:
        return True, rewrite_problem(checked[1], unchecked.evidence, question)
    problem = rewrite_problem(checked[1], unchecked.evidence, claim.question)
    problem = problem or item_unstated(checked[1], unchecked, reply.text()[: checked[0]])
    # The words before the rewind, in both sentences; with keeps_asked, the asked-for items past them are checked.
    kept = len(reply.text(unchecked.check_from)) - checked[0] if keeps_asked else None
    return True, problem or dropped_claim(claim.sentence, checked[1], unchecked.evidence, question, kept)


def item_unstated(sentence: str, unchecked: Unchecked, said_before: str = "") -> str | None:
    """Why an item round's sentence must be dropped: it states no name or number its evidence gives ("The country's
    international appeal …" stood on Canada's continent evidence through the word "country"), none that the reply
    before it (`said_before`) had not already said where the evidence names more; None otherwise."""
    claim = unchecked.claim
    if not unchecked.item or claim is None:
        return None
    if states_evidence_claim(sentence, unchecked.evidence, claim.question, said_before):
        return None
    return f"states nothing its evidence gives of {unchecked.item!r}"


def spliced_reply(reply: Reply, unchecked: Unchecked, question: str) -> tuple[int, Reply] | None:
    """(where the rewrite's first clause ends, the reply with the model's own later clause of the sentence it
    replaces after it): "… Andorra la Vella" + ", and its official language is French." None when either has
    no clause to cut at on a token boundary, the model's own words are not the reply it had written, the first
    clause states no name or number of its evidence (it is not the fix), or the splice gives the model's own
    words back unchanged."""
    start, own, before = unchecked.check_from, unchecked.own_sentence, unchecked.written
    if not own or before is None or before.tokens[start : start + len(own)] != own:
        return None
    own_break = clause_break(before.between(start, start + len(own)))
    own_at = None if own_break is None else before.token_starting_at(len(before.text(start)) + own_break)
    head = _first_clause_end(reply, start)
    if own_at is None or head is None or not _head_is_a_fix(reply, start, head, unchecked.evidence, question):
        return None
    spliced = reply.copy(head)
    spliced.extend(before, own_at, start + len(own))
    # The model's own sentence again ("Madrid" for "Madrid"): nothing fixed; the revert feeds it back exactly.
    return None if spliced.tokens[start:] == own else (head, spliced)


def _head_is_a_fix(reply: Reply, start: int, head: int, evidence: list[str], question: str) -> bool:
    """Whether the rewrite's words [start, head) state a name or number of its evidence, read in their sentence
    (a retry with its first token banned writes "the capital of Spain" or a name of its own: no fix)."""
    text, at = reply.text(head), len(reply.text(start))
    opens = sentence_start(text, at)
    return claims_from_evidence(text[opens:], at - opens, evidence, question)


def _first_clause_end(reply: Reply, start: int) -> int | None:
    """Reply index where the rewrite from `start` ends its first clause: its first clause break, else its
    sentence's stop; None when that is no token boundary past `start`, or the sentence has no stop."""
    text, at = reply.text(), len(reply.text(start))
    rewrite = text[at : sentence_end(text, at) or len(text)].rstrip()
    cut = clause_break(rewrite)
    if cut is None and rewrite[-1:] in (".", "!", "?"):
        cut = len(rewrite) - 1
    index = None if cut is None else reply.token_starting_at(at + cut)
    return index if index is not None and index > start else None


def _saying_words(item: frozenset[str], kinds: set[str]) -> frozenset[str]:
    """The words of an asked item that say it in a reply: of several, those not of the subject's kind (kind_stems;
    "It is a landlocked country" does not say "the countries it borders"), all of them where none is left."""
    return (item - kinds if len(item) > 1 else item) or item


class UnsaidItems:
    """config.unsaid_items_go_on: a paragraph whose course a rewrite changed may end before the items the model
    was going to write ("… the most populous country in the Americas." and the turn ends, where off went on to
    the capital and the calling code). Ending with an item the question asks for unsaid, it goes on, its end of
    turn banned, at most `times` times a reply. What it writes so is held back until the reply ends, and cut at
    its first sentence that repeats an earlier one (the model with nothing left to say loops)."""

    def __init__(self, question: str, times: int) -> None:
        self.parts, self.left = (distinct_parts(asked_parts(question)) if times else {}), times  # item -> its words
        self.question = question
        self.asking: str | None = None  # the question's words for the item it just went on for
        self.from_token: int | None = None  # reply index where it first went on: held back from here
        self.open_from: int | None = None  # while it may go on from a loop: the open sentence, held back

    def owes(self, reply: Reply, rounds: list[ConvergenceRecord], at: int | None = None) -> bool:
        """Whether the reply goes on once more (from reply index `at`, its end by default): a rewrite stands in
        it and an asked item is unsaid (the latest rewrite's round records the items it goes on for)."""
        unsaid = self._unsaid(reply, rounds)
        if not unsaid:
            return False
        self.left -= 1
        at = len(reply.tokens) if at is None else at
        self.from_token = at if self.from_token is None else min(self.from_token, at)
        [r for r in rounds if r.action == "rewound"][-1].went_on_for.append(" ".join(sorted(unsaid[0])))
        self.asking = self.parts[unsaid[0]]
        return True

    def _unsaid(self, reply: Reply, rounds: list[ConvergenceRecord]) -> list[frozenset[str]]:
        """The asked items the reply has not said, where it may still go on for them (a rewrite stands)."""
        if self.left <= 0 or not self.parts or not any(r.action == "rewound" for r in rounds):
            return []
        text = reply.text()
        said, kinds = stems(text), kind_stems(text, self.question)
        return [item for item in self.parts if not _saying_words(item, kinds) & said]

    def looped(self, reply: Reply, rounds: list[ConvergenceRecord], shown: int) -> int | None:
        """After a token: where the sentence it just finished starts (a reply index), when that sentence repeats
        an earlier one and the paragraph still owes an asked item: it goes on from there instead, once of its
        `times`, that sentence's first token banned. The model that lost its plan after a rewrite loops to the
        budget ("The country is divided into 100 municipalities." thrice) and never writes the currency.
        While it owes one, the open sentence is held back (`open_from`): a repeat is cut before it is seen."""
        self.open_from = None
        text, spans, start = reply.text(), [], 0
        opening = len(text) - len(text.lstrip())
        if text.find(PARAGRAPH_END, opening) > opening or not self._unsaid(reply, rounds):
            return None  # after a blank line the model starts the reply over: the paragraph ends there (whole_end)
        while (end := sentence_end(text, start)) is not None:
            spans.append((start, end))
            start = end
        self.open_from = max(reply.token_at(start), shown)
        before = reply.text(len(reply.tokens) - 1)  # a stop ends a sentence once the whitespace after it comes
        if len(spans) < 2 or sentence_end(before, spans[-1][0]) is not None:  # no sentence finished just now
            return None
        sentences = [text[a:b].strip() for a, b in spans]
        if repeats(sentences[-1], sentences[:-1]) is None:
            return None
        # Its first token carries the space before it (as in repeat_cut); one that also ends the sentence before
        # is not cut.
        at = reply.token_at(text.index(sentences[-1], spans[-1][0]) - 1)
        if len(reply.text(at)) < len(text[: spans[-2][1]].rstrip()) or at < shown:
            return None
        return at if self.owes(reply, rounds, at) else None

    def repeat_cut(self, reply: Reply) -> int | None:
        """Reply index where the first sentence written after it went on that repeats an earlier one starts."""
        if self.from_token is None:
            return None
        text = reply.text()
        start = len(reply.text(self.from_token))
        earlier = split_sentences(text[:start])
        for sentence in split_sentences(text[start:]):
            if repeats(sentence, earlier) is not None:
                # Its first token carries the space before it; never before where it went on.
                return max(reply.token_at(text.index(sentence, start) - 1), self.from_token)
            earlier.append(sentence)
        return None


class RewriteCheck:
    """The rewrite awaiting its check, and what happens when it fails: a paragraph's splice, one retry, then the
    revert; and whether a paragraph a rewrite changed goes on at its end of turn.

    It shares the loop's reply, decoding, emitter and rounds; `start_over(n)` is the loop's restart of the
    window and the emitter after the reply was cut back to `n` tokens."""

    def __init__(
        self,
        config: Config,
        question: str,
        loop_state: tuple[Reply, Decoding, Emitter, list[ConvergenceRecord]],
        eos: frozenset[int],
        start_over: Callable[[int], None],
        evidence_leaves: Callable[[bool, Unchecked], None] = lambda at_end_of_turn, stood: None,
        backend: Backend | None = None,
        ask_unsaid: Callable[[str, frozenset[int]], Generator[Event, None, bool]] | None = None,
    ) -> None:
        self.enabled, self.retries = config.revert_unused_evidence, config.retry_failed_rewrite
        self.sentence_scope, self.keeps_asked = config.sentence_scope, config.rewrite_keeps_asked
        self.answer_last, self.splices = config.answer_last, config.splice_own_clause
        self.grounds_unsaid = config.ground_unsaid_items
        self.unsaid = UnsaidItems(question, config.unsaid_items_go_on if config.sentence_scope else 0)
        self.question = question
        self.reply, self.decoding, self.emitter, self.rounds = loop_state
        self.eos, self.start_over, self.evidence_leaves = eos, start_over, evidence_leaves
        self.ask_unsaid = ask_unsaid  # the loop's round for an asked item left unsaid (True: its evidence went in)
        # config.retry_opens_evidence (item_retry_opens_evidence: for item rounds), where the backend can ban that much
        self.openers = EvidenceOpeners.of(backend, config) if backend is not None else None
        self.opens_evidence = (config.retry_opens_evidence, config.item_retry_opens_evidence and self.grounds_unsaid)
        self.pending: Unchecked | None = None  # a rewrite whose sentence is not finished: held back
        self.reverted = False  # a rewrite failed and was dropped: no further rounds

    @property
    def held_from(self) -> int | None:
        """Reply index from which nothing may be shown yet: a rewrite awaiting its check, or what a paragraph wrote
        after it went on for an unsaid item (None: nothing is held)."""
        held = (
            None if self.pending is None else self.pending.span_start,
            self.unsaid.from_token,
            self.unsaid.open_from,
        )
        return min((at for at in held if at is not None), default=None)

    def before_round(self, span_start: int) -> Unchecked | None:
        """At a trigger, before its round: where a failed rewrite would go back to (the first of a chain)."""
        # Sentence scope follows every rewrite to its sentence's end even unchecked: its evidence leaves there.
        if not (self.enabled or self.sentence_scope) or self.pending is not None:
            return None
        reply, context = self.reply, self.decoding.context
        return Unchecked(Snapshot.take(reply, len(reply.tokens) - 1, context), span_start, len(self.rounds))

    def opened(
        self,
        before: Unchecked | None,
        span_start: int,
        evidence: str,
        context: Context,
        computed: bool = False,
        claim: Query | None = None,
    ) -> None:
        """A rewind went in at `span_start`: its rewrite is checked once its sentence is finished. `computed`:
        the evidence is a tool's result for a computable span (its one number then ends the claim); `claim`:
        sentence scope, what the arms were asked about the sentence it rewrites."""
        self.pending = self.pending or before
        if self.pending is not None:
            self.pending.claim = claim
            self.pending.check_from = span_start
            self.pending.evidence.append(evidence)
            self.pending.answer = computed_answer(evidence) if computed and self.answer_last else None
            self.pending.after_injection = Snapshot.take(self.reply, len(self.reply.tokens), context)

    def check(self, final: bool) -> Generator[Event, None, bool]:
        """Check the latest rewrite once its sentence is finished; True when the context was replaced (it
        failed and went back, or a paragraph's sentence stood and its evidence left)."""
        assert self.pending is not None
        checked, problem = self._verdict(final)
        if problem is not None:
            if (yield from self._splice(problem, at_end_of_turn=False)) is None:
                yield from self._failed(problem, at_end_of_turn=False)
            return True
        if checked:
            if (yield from self._answer_last(fed=len(self.reply.tokens) - 1)):  # the last token is not yet fed
                return True
            stood, self.pending = self.pending, None  # it drew on its evidence and answers the question: it stands
            if stood.claim is not None:
                self.evidence_leaves(False, stood)
                return True
        return False

    @property
    def item_pending(self) -> bool:
        """An item round's sentence awaits its check: no trigger judges it first. A round on it would take over the
        pending rewrite, and the item's own check with it ("The two-letter postal abbreviation is KY." again stood
        for Kentucky's capital, then was rewritten as an ordinary doubted sentence)."""
        return self.pending is not None and bool(self.pending.item)

    def item_first(self) -> Generator[Event, None, bool]:
        """At a trigger, an item round's sentence is checked first, as written so far (`check`, final: it stands or
        goes back, so True whenever one was pending)."""
        return (yield from self.check(final=True)) if self.item_pending else False

    def end_of_turn(self) -> Generator[Event, None, bool]:
        """The model ended its turn: True when the reply is finished; False when it goes on (a failed rewrite went
        back or is tried again, or a paragraph goes on after its rewrite, without the evidence)."""
        problem = self._verdict(final=True)[1] if self.pending is not None else None
        if problem is None and self.pending is not None and self.pending.claim is not None:
            stood, self.pending = self.pending, None
            return (yield from self._stood_at_end(stood))
        if problem is None:
            finished = self.pending is None or not (yield from self._answer_last(fed=len(self.reply.tokens)))
            return finished and not (yield from self._owes_asked_items())
        spliced = yield from self._splice(problem, at_end_of_turn=True)
        if spliced is not None:
            return (yield from self._stood_at_end(spliced))
        yield from self._failed(problem, at_end_of_turn=True)
        return False

    def _stood_at_end(self, stood: Unchecked) -> Generator[Event, None, bool]:
        """A paragraph's rewrite stood as the turn ended: the reply goes on without its evidence when the reply its
        sentence replaced went on, or when it still owes an item the question asks for; True: it is finished."""
        owes = not stood.reply_went_on and self.unsaid.owes(self.reply, self.rounds)
        if stood.reply_went_on or owes:
            self.evidence_leaves(True, stood)
            if owes:
                yield from self.ground_unsaid(self.eos)
            return False
        return True

    def _owes_asked_items(self) -> Generator[Event, None, bool]:
        """A paragraph a rewrite changed ended with an asked item unsaid: its end of turn is banned once more and
        it goes on (True), with that item's evidence where the arms find some."""
        if not self.unsaid.owes(self.reply, self.rounds):
            return False
        self.decoding.continue_from(self.decoding.context.tokens, banned=self.eos)
        yield from self.ground_unsaid(self.eos)
        return True

    def ground_unsaid(self, pushed_past: frozenset[int]) -> Generator[Event, None, bool]:
        """The item it just went on for (past `pushed_past`, banned) is asked of the arms
        (config.ground_unsaid_items); True: its evidence went in."""
        asking, self.unsaid.asking = self.unsaid.asking, None
        if asking is None or self.ask_unsaid is None or not self.grounds_unsaid:
            return False
        return (yield from self.ask_unsaid(asking, pushed_past))

    def _verdict(self, final: bool) -> tuple[bool, str | None]:
        """rewrite_verdict on the pending rewrite; unchecked (revert_unused_evidence off), a finished one stands."""
        assert self.pending is not None
        checked, problem = rewrite_verdict(self.reply, self.pending, self.question, final, self.keeps_asked)
        return checked, problem if self.enabled else None

    def on_fault(self, kind: str) -> Generator[Event, None, None]:
        """The backend failed: a rewrite not yet checked is dropped (only the reply goes back)."""
        if self.pending is not None:
            yield from self._revert(f"was cut off when the backend failed ({kind})", session=False)

    def _answer_last(self, fed: int) -> Generator[Event, None, bool]:
        """A computed answer ends its claim: a tail that restates other numbers after it is cut at its clause
        boundary and the sentence's end written again, the boundary's first token banned; True when cut.
        `fed`: reply tokens the model's context holds (the one just sampled is not fed until it stands)."""
        u, reply = self.pending, self.reply
        assert u is not None
        if u.answer is None or u.tail_cuts >= ANSWER_LAST_TRIES:
            return False
        start, sentence = checked_sentence(reply, u, final=True) or (0, "")
        at = answer_tail(sentence, u.answer)
        cut = None if at is None else reply.token_starting_at(start + at)
        if cut is None or cut < u.check_from:  # not on a token boundary, or before the rewrite began
            return False
        failed, shown = reply.tail(cut), self.emitter.shown_after(cut)
        at_same, banned_there = u.tail_banned
        banned = (banned_there if at_same == cut else frozenset()) | {reply.tokens[cut]}
        context = self.decoding.context.tokens
        kept = context[: len(context) - fed + cut]
        self.decoding.continue_from(kept, banned=banned)
        self.decoding.replace(kept, None)
        reply.cut(cut)
        u.tail_cuts, u.tail_banned = u.tail_cuts + 1, (cut, banned)
        self.start_over(cut)
        rewound = self.latest_rewound()
        how = "cut at the clause boundary after the computed answer, its first token banned"
        rewound.retry("restated other numbers after its computed answer", failed, how)
        yield Rewind(rewound.round, shown, failed, 0)
        return True

    def latest_rewound(self) -> ConvergenceRecord:
        """The round whose rewrite is being checked."""
        return next(r for r in reversed(self.rounds) if r.action == "rewound")

    def _splice(self, problem: str, at_end_of_turn: bool) -> Generator[Event, None, Unchecked | None]:
        """config.splice_own_clause: a paragraph's failed rewrite that fixed its claim and stopped is tried as its
        first clause and the model's own later clause; the rewrite that stood when that sentence passes the check
        (its evidence leaves unless the reply ends here), else None and nothing changed."""
        u, reply = self.pending, self.reply
        assert u is not None
        found = spliced_reply(reply, u, self.question) if self.splices and u.claim is not None else None
        if found is None or rewrite_verdict(found[1], u, self.question, True, self.keeps_asked)[1] is not None:
            return None
        head, spliced = found
        failed, retracted, shown = reply.tail(u.check_from), reply.tail(head), self.emitter.shown_after(head)
        reply.restore(spliced)
        self.pending, rewound = None, self.latest_rewound()
        rewound.retry(problem, failed, "kept its first clause and the sentence's own later clause")
        self.emitter.restart(reply, head)
        self.start_over(len(reply.tokens))  # the spliced sentence has ended: the next one opens
        if shown:
            yield Rewind(rewound.round, shown, retracted, 0)
        if not at_end_of_turn:  # at the turn's end the caller decides whether the reply goes on (_stood_at_end)
            self.evidence_leaves(False, u)
        return u

    def _failed(self, problem: str, at_end_of_turn: bool) -> Generator[Event, None, None]:
        """A rewrite failed its check: one more try if allowed, else back to the reply written without it."""
        u = self.pending
        assert u is not None
        if self.retries and not u.tried_again and u.after_injection is not None:
            yield from self._try_again(problem, at_end_of_turn)
        else:
            yield from self._revert(problem)

    def _try_again(self, problem: str, at_end_of_turn: bool) -> Generator[Event, None, None]:
        """One more try, the evidence still in context: a rewrite cut short by its end of turn goes on past it
        ("… is vpn." inside "vpn.acme.example"); any other is written again from the rewind point with its
        first token banned ("I'm ready to help."), and, where it can, opening with a word of its evidence."""
        u, reply = self.pending, self.reply
        assert u is not None and u.after_injection is not None
        u.tried_again = True
        start = u.check_from
        failed = reply.tail(start)
        rewound = self.latest_rewound()  # the round whose rewrite failed
        if at_end_of_turn and cut_short(failed, u.evidence):
            how = "continued past the end of turn"
            self.decoding.continue_from(self.decoding.context.tokens, banned=self.eos)
        else:
            how = "rewritten from the rewind point with its first token banned"
            banned = frozenset({reply.tokens[start]}) if len(reply.tokens) > start else frozenset()
            if u.claim is not None:  # a paragraph's sentence is written again, not ended
                banned |= self.eos
            # Only a rewrite that ignored its evidence opens with it (one that used it and failed otherwise is
            # tried freely), with a word of the shape of the doubted one: a number for a number, a name for a name.
            if self.openers is not None and self._retry_opens_evidence(u, problem):
                spaced = needs_space(reply.text(start))
                opening = self.openers.bans(u.evidence, self._said_before(start), rewound.dropped_text, spaced)
                if opening and len(banned | opening) < self.openers.n_vocab:  # at least one token left
                    banned |= opening
                    how = "rewritten from the rewind point, opening with a word of its evidence"
            shown = self.emitter.shown_after(start)
            self.decoding.restore(u.after_injection, reply, banned)
            self.start_over(start)
            yield Rewind(rewound.round, shown, failed, 0)
        rewound.retry(problem, failed, how)

    def _retry_opens_evidence(self, u: Unchecked, problem: str) -> bool:
        doubted, item = self.opens_evidence
        return (item and bool(u.item)) or (doubted and problem == UNUSED_EVIDENCE)

    def _said_before(self, start: int) -> str:
        """The question and the checked sentence up to the rewind point: words a retry need not open with."""
        text = self.reply.text()
        at = len(self.reply.text(start))
        return f"{self.question} {text[sentence_start(text, at) : at]}"

    def _revert(self, problem: str, session: bool = True) -> Generator[Event, None, None]:
        """Back to the reply written without the rewrite; no more rounds. `session` False: only the reply goes
        back (the backend failed; nothing more will be decoded)."""
        u, reply = self.pending, self.reply
        assert u is not None
        text = reply.text()
        # The rewrite up to the end of the sentence that was checked, not the word that showed it had ended.
        rewritten = text[len(reply.text(u.span_start)) : sentence_end(text, len(reply.text(u.check_from)))]
        shown = self.emitter.shown_after(u.span_start)
        if session:
            self.decoding.restore(u.before, reply, banned=u.pushed_past)
        else:
            reply.restore(u.before.reply)
        for record in self.rounds[u.first_round :]:
            if record.action == "rewound":
                record.revert(rewritten, problem)
        self.pending, self.reverted = None, True
        self.start_over(u.span_start)
        yield Rewind(self.rounds[-1].round, shown, rewritten, 0, reverted=True)
