"""Receipts: one JSON object per reply, appended durably to a JSON Lines file.

A receipt records what the model was asked, what it wrote, how surprised it was, what the groundedness
canary concluded and, per intervention round, a convergence record (trigger, arms tried, evidence
chosen, rewind or not and why). Layout of a receipt: see `receipt_record`; of a round: `ConvergenceRecord`.

Durability: `ReceiptWriter.append` serialises the whole record before opening the file, writes it as one
line and fsyncs, so a crash loses at most the record being written. Reading skips a torn or undecodable
line (reporting its number) instead of failing.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import enum
import hashlib
import json
import math
import os
import re
import time
import uuid
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from surprisegate import __version__
from surprisegate.errors import InputError

SCHEMA = "surprisegate.receipt/1"
MODES = ("off", "detect", "intervene")
ARM_STATUSES = ("ok", "empty", "below_floor", "timeout", "error", "skipped")
ACTIONS = ("rewound", "resumed_unmodified", "reverted", "revised")  # revised: the black-box revise pass


# --------------------------------------------------------------------------------------------------
# Turning records into plain JSON data


def to_jsonable(value: Any) -> Any:
    """Return `value` as plain JSON data (dict, list, str, int, float, bool, None).

    Non-finite floats become None (JSON has no NaN; a receipt must stay readable by any JSON parser).
    Dataclasses, objects with `to_dict()`, paths, datetimes, enums and numpy values are converted;
    anything else raises TypeError so that a bad record fails loudly instead of being stringified.
    """
    return _jsonable(value, active=set())


def _jsonable(value: Any, active: set[int]) -> Any:
    if value is None or isinstance(value, (str, bool, int)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, (dict, list, tuple)):
        # `active` holds the containers on the current path, so a cycle is an error, not a RecursionError.
        if id(value) in active:
            raise ValueError("record contains a circular reference; receipts must be trees of plain data")
        active.add(id(value))
        try:
            if isinstance(value, dict):
                return {_key(k): _jsonable(v, active) for k, v in value.items()}
            return [_jsonable(v, active) for v in value]
        finally:
            active.discard(id(value))
    if hasattr(value, "to_dict") and callable(value.to_dict):
        return _jsonable(value.to_dict(), active)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _jsonable(dataclasses.asdict(value), active)
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if isinstance(value, (dt.datetime, dt.date)):
        return value.isoformat()
    if isinstance(value, enum.Enum):
        return _jsonable(value.value, active)
    if type(value).__module__ == "numpy" and hasattr(value, "tolist"):
        return _jsonable(value.tolist(), active)  # numpy scalars and arrays
    raise TypeError(
        f"receipt value {value!r} of type {type(value).__name__} is not JSON-serialisable; "
        "convert it to str, number, list or dict before adding it to the receipt"
    )


def _key(key: Any) -> str | int | float | bool | None:
    # Same keys json.dumps accepts; anything else (a tuple, an object) is a bug in the caller.
    if key is None or isinstance(key, (str, int, float, bool)):
        return key
    raise TypeError(f"receipt dict key {key!r} is a {type(key).__name__}; use str keys")


def dumps_line(record: dict[str, Any]) -> str:
    """Serialise one receipt to a single JSON line (with the trailing newline)."""
    if not isinstance(record, dict):
        raise TypeError(f"record={record!r} is a {type(record).__name__}; a receipt must be a dict")
    plain = to_jsonable(record)
    # ensure_ascii=False keeps non-English text greppable; json still escapes \n, so one record = one line.
    line = json.dumps(plain, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    try:
        line.encode("utf-8")
    except UnicodeEncodeError:
        # Lone surrogates (e.g. a token holding half a UTF-8 character) cannot be UTF-8; escape them.
        line = json.dumps(plain, ensure_ascii=True, allow_nan=False, separators=(",", ":"))
    return line + "\n"


# --------------------------------------------------------------------------------------------------
# Writing


class ReceiptWriter:
    """Append receipts to a JSON Lines file, one durable line per reply.

    Each `append` opens, writes one line, flushes and fsyncs, so there is no open handle to leak and
    each record is on disk when `append` returns. Appends from several processes are not locked;
    each is a single `write` on a file opened with O_APPEND.

    Receipts hold users' prompts, so by default (`private=True`) a new file is 0600 and the folders made
    for it 0700, whatever the umask; `private=False` (evaluation results, labels) keeps the umask's modes.
    """

    def __init__(self, path: str | os.PathLike[str], private: bool = True) -> None:
        self.path = Path(path)
        self.private = private
        if self.path.is_dir():
            raise InputError(f"receipts={str(self.path)!r} is a directory; give a file path such as receipts.jsonl")

    def append(self, record: dict[str, Any]) -> None:
        """Write `record` as one line. Raises TypeError/ValueError, writing nothing, if it cannot be serialised."""
        data = dumps_line(record).encode("utf-8")  # fails here, before the file is touched
        make_folder(self.path.parent, private=self.private)
        created = not self.path.exists()
        flags = os.O_RDWR | os.O_APPEND | os.O_CREAT | getattr(os, "O_CLOEXEC", 0)
        fd = os.open(self.path, flags, 0o600 if self.private else 0o666)
        with os.fdopen(fd, "a+b") as f:
            if created and self.private:
                os.fchmod(f.fileno(), 0o600)  # the umask could only narrow it; say it outright
            if _ends_with_torn_line(f):
                data = b"\n" + data  # start on a fresh line so the torn one stays isolated and skippable
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        if created:
            _fsync_directory(self.path.parent)

    def __repr__(self) -> str:
        return f"ReceiptWriter({str(self.path)!r})"


_KEPT_WHOLE = (
    "schema",
    "reply_id",
    "created",
    "created_unix",
    "surprisegate_version",
    "mode",
    "finish_reason",
    "prompt_sha256",
    "conversation_sha256",
    "n_tokens",
)


def fit_receipt(record: dict[str, Any], max_bytes: int) -> dict[str, Any]:
    """`record` if its line fits in `max_bytes`, else a copy whose long texts and lists are cut, step by step,
    until it does, with `truncated` saying how big it was. Ids, hashes, mode and counts always survive, so a
    cut receipt still says which reply it was; one request cannot fill a receipts file with its own bytes."""
    size = len(dumps_line(record).encode("utf-8"))
    if size <= max_bytes:
        return record
    plain = to_jsonable(record)
    whole = {k: plain[k] for k in _KEPT_WHOLE if k in plain}
    for chars, items in ((4000, 512), (1000, 128), (200, 32), (60, 8)):
        cut = {k: v if k in whole else _cut(v, chars, items) for k, v in plain.items()}
        cut["truncated"] = {"bytes": size, "cap": max_bytes, "texts_cut_to": chars, "lists_cut_to": items}
        if len(dumps_line(cut).encode("utf-8")) <= max_bytes:
            return cut
    return whole | {"truncated": {"bytes": size, "cap": max_bytes, "texts_cut_to": 0, "lists_cut_to": 0}}


def _cut(value: Any, chars: int, items: int) -> Any:
    if isinstance(value, str):
        return value if len(value) <= chars else value[:chars] + f"…[{len(value) - chars} more characters]"
    if isinstance(value, list):
        return [_cut(v, chars, items) for v in value[:items]]
    if isinstance(value, dict):
        # Keys are text too (a 300,000-character key must not survive); later keys go past `items`.
        return {
            _cut(k, chars, items) if isinstance(k, str) else k: _cut(v, chars, items)
            for k, v in list(value.items())[: max(items, 64)]
        }
    return value


def make_folder(folder: Path, private: bool = True) -> None:
    """Create `folder` and its missing parents; with `private` the ones created here are 0700 (an existing
    folder keeps its modes: it is the operator's)."""
    missing = [p for p in (folder, *folder.parents) if not p.exists()]
    folder.mkdir(parents=True, exist_ok=True)
    if private:
        for created in missing:
            with contextlib.suppress(OSError):
                os.chmod(created, 0o700)


def _ends_with_torn_line(f: BinaryIO) -> bool:
    """True if the file is non-empty and its last byte is not a newline (a crash cut the last record)."""
    size = f.seek(0, os.SEEK_END)
    if size == 0:
        return False
    f.seek(size - 1)
    return f.read(1) != b"\n"


def _fsync_directory(directory: Path) -> None:
    # A new file's directory entry is only durable once the directory itself is synced (POSIX).
    if os.name != "posix":
        return
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# --------------------------------------------------------------------------------------------------
# Reading


class ReadResult(list):
    """The receipts of a file, in file order (a plain list of dicts).

    `skipped_lines` holds the 1-based numbers of lines that could not be decoded (a torn write,
    a hand edit); blank lines are ignored and not reported.
    """

    def __init__(self, records: Iterable[dict[str, Any]] = (), skipped_lines: list[int] | None = None) -> None:
        super().__init__(records)
        self.skipped_lines: list[int] = list(skipped_lines or [])

    def __repr__(self) -> str:
        return f"ReadResult({len(self)} records, skipped_lines={self.skipped_lines})"


def iter_receipts(path: str | os.PathLike[str], skipped: list[int] | None = None) -> Iterator[dict[str, Any]]:
    """Yield the receipts in `path` one at a time; numbers of undecodable lines go into `skipped`.

    The file is checked when this is called (not on the first `next`), so a missing file fails early.
    """
    path = Path(path)
    if not path.exists():
        raise InputError(
            f"receipts={str(path)!r} does not exist; check the path, or run a reply with receipts enabled to create it"
        )
    if path.is_dir():
        raise InputError(f"receipts={str(path)!r} is a directory; give the .jsonl file inside it")
    return _iter_lines(path, skipped if skipped is not None else [])


def _iter_lines(path: Path, skipped: list[int]) -> Iterator[dict[str, Any]]:
    # Binary, split on b"\n" only: str.splitlines would also split on U+2028 inside a record.
    with open(path, "rb") as f:
        for number, raw in enumerate(f, start=1):
            if not raw.strip():
                continue
            try:
                record = json.loads(raw.decode("utf-8"))
            except (UnicodeDecodeError, ValueError):
                skipped.append(number)
                continue
            if isinstance(record, dict):
                yield record
            else:
                skipped.append(number)  # a fragment like `12` from a torn line is valid JSON but no receipt


def read_receipts(path: str | os.PathLike[str]) -> ReadResult:
    """Read every receipt in `path`; see `ReadResult.skipped_lines` for lines that were skipped."""
    skipped: list[int] = []
    records = list(iter_receipts(path, skipped))
    return ReadResult(records, skipped)


# --------------------------------------------------------------------------------------------------
# Building receipts and convergence records


@dataclass
class ArmAttempt:
    """One arm asked (or skipped) in one round; `to_dict()` is its entry in the round's `arms`. Built by
    grounding._ask_arm; optional fields are written only when set, so a plain attempt stays short."""

    arm: str  # "memory" | "web" | "tool"
    status: str  # one of ARM_STATUSES
    query: Any = None  # what the arm was asked (an arms.Query or its dict); None when it was never called
    latency_ms: float = 0.0
    results: list[Any] = field(default_factory=list)  # Evidence objects or their dicts, best first
    cached: bool = False  # the reply's cache answered: the arm was not called again
    reason: str | None = None  # why it was skipped or timed out before it was called
    error: str | None = None  # the error message when status is "error" or "timeout"
    arbitration: str | None = None  # why its evidence was kept over, or asked alongside, another arm's

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ArmAttempt:
        return cls(**d)

    def to_dict(self) -> dict[str, Any]:
        if self.status not in ARM_STATUSES:
            raise ValueError(f"status={self.status!r} for arm {self.arm!r}; use one of {', '.join(ARM_STATUSES)}")
        optional = {"reason": self.reason, "error": self.error, "arbitration": self.arbitration}
        return to_jsonable(
            {"arm": self.arm}
            | ({"query": self.query} if self.query is not None else {})
            | {"status": self.status}
            | ({"cached": True} if self.cached else {})
            | {"latency_ms": self.latency_ms, "results": self.results}
            | {k: v for k, v in optional.items() if v is not None}
        )


def trigger_to_dict(trigger: Any) -> dict[str, Any]:
    """The receipt's view of an `events.Trigger` (or a dict with the same fields)."""
    source = trigger if isinstance(trigger, dict) else dataclasses.asdict(trigger)
    keys = ("token_index", "statistic", "value", "threshold", "span_start", "span_text")
    return {k: source.get(k) for k in keys}


def rounded_trigger(trigger: Any) -> dict[str, Any]:
    """`trigger_to_dict` with its value to 4 decimals: what the loop and the revise pass write."""
    return trigger_to_dict(trigger) | {"value": round(trigger.value, 4)}


@dataclass(frozen=True)
class RewindReport:
    """How a rewind reached the backend: tokens trimmed from its cache (or None: re-prefilled) and the method;
    a server session also says whether the resume went as token ids or text, and the prompt tokens it cached."""

    trimmed: int | None
    method: str  # "trim" | "reprefill"
    prompt_path: str | None = None  # "token-ids" | "text"
    cached_tokens: int | None = None


@dataclass
class ConvergenceRecord:
    """What happened in one intervention round; `to_dict()` is the entry in a receipt's `rounds`.

    Built once per round by `grounding.ground_span` (route, arms asked, evidence chosen); how the round
    ended is then set through its outcome methods below (`rewind`, `revert`, ...), never field by field.
    `to_dict()` validates the finished record. The defaults describe a round that changed nothing.
    """

    round: int  # 1-based round number within the reply
    trigger: Any  # events.Trigger or dict: token_index, statistic, value, threshold, span_start, span_text
    span_class: str = "other"  # router's class: computable | entity | other
    route_rule: str = ""  # the router rule that decided the class, for the log
    arm_order: list[str] = field(default_factory=list)
    arms: list[ArmAttempt] = field(default_factory=list)
    chosen: Any = None  # Evidence (or its dict) whose snippet was injected; None when nothing passed
    action: str = "resumed_unmodified"  # "rewound" | "resumed_unmodified" | "reverted" (dropped) | "revised"
    reason: str = ""  # why grounding was accepted or not, one sentence
    tokens_dropped: int = 0  # reply tokens rewound
    tokens_injected: int = 0  # context tokens of the evidence segment
    dropped_text: str = ""
    latency_ms: float = 0.0  # whole round, routing to resume
    closed_question: str | None = None  # the router's closed-question rule, when it kept the round from grounding
    # A rewound round: how the span left the context, and the text of the injected segment.
    tokens_trimmed: int | None = None
    rewind_method: str | None = None  # "trim" | "reprefill"
    injected_text: str | None = None
    already_grounded: bool = False  # resumed because the same evidence was injected in an earlier round
    retries: list[dict[str, Any]] = field(default_factory=list)  # one more try of a failed rewrite: problem, text, how
    rewritten_text: str | None = None  # a reverted round: the rewrite that was dropped
    went_on_from: str | None = None  # a paragraph rewrite that stood went on after: own_sentence | rewrite
    went_back_from: str | None = None  # the loop a paragraph went into after the rewrite, dropped (repetition.py)
    went_on_for: list[str] = field(default_factory=list)  # asked items the paragraph went on for after it ended
    # A server backend: how the resume after the rewind reached the server, and the prompt tokens its cache served.
    prompt_path: str | None = None  # "token-ids" | "text"
    cached_tokens: int | None = None

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ConvergenceRecord:
        """The record a receipt's round was written from; unknown keys are an error (a schema drift)."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(
                f"round {d.get('round')} has fields {unknown} that ConvergenceRecord does not know; "
                "add them to receipts.ConvergenceRecord"
            )
        return cls(**(d | {"arms": [ArmAttempt.from_dict(a) for a in d.get("arms", [])]}))

    # --- how a round ends: every outcome is set here, by the loop or the revise pass ---------------
    def resume(self, reason: str) -> None:
        """Nothing goes in: the reply resumes as it was written."""
        self.action, self.reason = "resumed_unmodified", reason

    def repeats(self, round_no: int, what: str = "injected") -> str:
        """Its evidence is already in (round `round_no`): the reason it resumes."""
        self.already_grounded = True
        return f"evidence already {what} in round {round_no}"

    def stood(self, went_on_from: str) -> None:
        """A paragraph's rewrite stood; the reply went on after the model's own sentence or after the rewrite."""
        self.went_on_from = went_on_from

    def went_back(self, dropped: str) -> None:
        """The paragraph went on from the rewrite into repeating itself (`dropped`): it goes on from the model's
        own sentence instead, the rewrite still shown."""
        self.went_on_from, self.went_back_from = "own_sentence", dropped

    def rewind(self, source: str, dropped: tuple[int, str], injected: tuple[int, str], how: RewindReport) -> None:
        """The span (count, text) left the context and the evidence segment (count, text) went in."""
        self.action, self.reason = "rewound", f"grounded by {source}"
        self.tokens_dropped, self.dropped_text = dropped
        self.tokens_injected, self.injected_text = injected
        self.tokens_trimmed, self.rewind_method = how.trimmed, how.method
        self.prompt_path, self.cached_tokens = how.prompt_path, how.cached_tokens

    def resume_failed(self, source: str, kind: str) -> None:
        self.reason = f"grounded by {source}, but the resume failed ({kind}): reply kept as written"

    def retry(self, problem: str, rewrite: str, how: str) -> None:
        """The rewrite failed its check and is tried once more (`how`)."""
        self.retries.append({"problem": problem, "rewrite": rewrite, "how": how})

    def revert(self, rewritten: str, problem: str) -> None:
        """The rewrite failed its check and was dropped for the reply written without it."""
        self.action, self.rewritten_text = "reverted", rewritten
        self.reason = (
            f"{self.reason}, but the rewrite {rewritten.strip()[:80]!r} {problem}: kept the reply written without it"
        )

    def revised(self, source: str) -> None:
        """The revise pass: the revision that used this round's evidence stands."""
        self.action, self.reason = "revised", f"grounded by {source}: revised"

    def draft_stands(self, source: str, why: str, revision: str | None) -> None:
        """The revise pass: the revision failed (`why`) and the draft stands."""
        self.action, self.rewritten_text = "reverted", revision
        self.reason = f"grounded by {source}, but {why}"

    def finish(self, started: float) -> None:
        """The round's wall time, from routing to resume (`started`: time.monotonic() at the trigger)."""
        self.latency_ms = round((time.monotonic() - started) * 1000, 2)

    @property
    def evidence(self) -> str | None:
        """The injected snippet's text (None when nothing was chosen)."""
        if self.chosen is None:
            return None
        return self.chosen["evidence"] if isinstance(self.chosen, dict) else self.chosen.evidence

    def check(self) -> None:
        """Raise ValueError when the record contradicts itself (an unknown action, a rewind without evidence)."""
        if self.action not in ACTIONS:
            raise ValueError(f"action={self.action!r} in round {self.round}; use one of {', '.join(ACTIONS)}")
        if self.action == "rewound" and self.chosen is None:
            raise ValueError(f"round {self.round} says action='rewound' but chosen=None; set the evidence injected")
        if self.tokens_dropped < 0 or self.tokens_injected < 0:
            raise ValueError(
                f"tokens_dropped={self.tokens_dropped}, tokens_injected={self.tokens_injected} in round "
                f"{self.round}; token counts cannot be negative"
            )

    def to_dict(self) -> dict[str, Any]:
        self.check()
        return {
            "round": self.round,
            "trigger": to_jsonable(trigger_to_dict(self.trigger)),
            "span_class": self.span_class,
            "route_rule": self.route_rule,
            "arm_order": list(self.arm_order),
            "arms": [a.to_dict() for a in self.arms],
            "chosen": None if self.chosen is None else to_jsonable(self.chosen),
            "action": self.action,
            "reason": self.reason,
            "tokens_dropped": self.tokens_dropped,
            "tokens_injected": self.tokens_injected,
            "dropped_text": self.dropped_text,
            "latency_ms": to_jsonable(self.latency_ms),
            "closed_question": self.closed_question,
            # Written only when they happened, so a plain round stays short.
            **(
                {
                    "tokens_trimmed": self.tokens_trimmed,
                    "rewind_method": self.rewind_method,
                    "injected_text": self.injected_text,
                }
                if self.rewind_method is not None
                else {}
            ),
            **({"already_grounded": True} if self.already_grounded else {}),
            **({"retries": to_jsonable(self.retries)} if self.retries else {}),
            **({"rewritten_text": self.rewritten_text} if self.rewritten_text is not None else {}),
            **({"went_on_from": self.went_on_from} if self.went_on_from is not None else {}),
            **({"went_back_from": self.went_back_from} if self.went_back_from is not None else {}),
            **({"went_on_for": list(self.went_on_for)} if self.went_on_for else {}),
            **({"prompt_path": self.prompt_path} if self.prompt_path is not None else {}),
            **({"cached_tokens": self.cached_tokens} if self.cached_tokens is not None else {}),
        }


def receipt_record(
    *,
    reply_id: str | None,
    created: float | dt.datetime,
    model: str,
    backend: str,
    config: dict[str, Any],
    prompt: str,
    reply: str,
    n_tokens: int,
    surprise: dict[str, Any] | None,
    canary: dict[str, Any],
    rounds: Sequence[ConvergenceRecord | dict[str, Any]],
    mode: str,
    finish_reason: str,
    extra: dict[str, Any] | None = None,
    store_prompt: bool = True,
    messages: list[dict[str, str]] | None = None,
    fault: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One receipt (schema `surprisegate.receipt/1`) as plain JSON data; `reply_id=None` draws a fresh id.
    `extra` stays under its own key, so it never overwrites a schema field; `fault` (finish_reason "error"):
    what the backend did, and the reply tokens kept. The question and conversation: see `_question`."""
    if mode not in MODES:
        raise ValueError(f"mode={mode!r}; use one of {', '.join(MODES)}")
    return (
        _header(reply_id, created, model, backend, mode, config)
        | _question(prompt, messages, store_prompt)
        | {
            "reply": reply,
            "n_tokens": n_tokens,
            "finish_reason": finish_reason,
            "surprise": to_jsonable(surprise),
            "canary": to_jsonable(canary),
            "rounds": [r.to_dict() if isinstance(r, ConvergenceRecord) else to_jsonable(r) for r in rounds],
            "extra": to_jsonable(extra) if extra else {},
        }
        | ({"fault": to_jsonable(fault)} if fault else {})
    )


def _header(
    reply_id: str | None, created: float | dt.datetime, model: str, backend: str, mode: str, config: dict[str, Any]
) -> dict[str, Any]:
    """Which reply, when (`created` a Unix time or a datetime, naive meaning UTC: stored as ISO 8601 UTC and
    as seconds), by which model and backend, under which config."""
    created_at = _as_utc_datetime(created)
    return {
        "schema": SCHEMA,
        "reply_id": reply_id if reply_id is not None else uuid.uuid4().hex,
        "created": created_at.isoformat().replace("+00:00", "Z"),
        "created_unix": created_at.timestamp(),
        "surprisegate_version": __version__,
        "model": model,
        "backend": backend,
        "mode": mode,
        "config": to_jsonable(config),
    }


def _question(prompt: str, messages: list[dict[str, str]] | None, store_prompt: bool) -> dict[str, Any]:
    """The question the reply answers, always hashed (`prompt_sha256`); `messages`, the whole conversation,
    hashed too over its canonical JSON. `store_prompt=False` leaves both texts out."""
    asked = {
        "prompt_sha256": hashlib.sha256(prompt.encode("utf-8", "surrogatepass")).hexdigest(),
        "prompt": prompt if store_prompt else None,
    }
    if messages is None:
        return asked
    return asked | {
        "conversation_sha256": conversation_sha256(messages),
        "messages": to_jsonable(messages) if store_prompt else None,
    }


def conversation_sha256(messages: list[dict[str, str]]) -> str:
    """Hash of a chat as canonical JSON (sorted keys, no spaces): the same turns give the same hash."""
    canonical = json.dumps(messages, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8", "surrogatepass")).hexdigest()


def _as_utc_datetime(created: float | dt.datetime) -> dt.datetime:
    if isinstance(created, dt.datetime):
        if created.tzinfo is None:
            return created.replace(tzinfo=dt.UTC)
        return created.astimezone(dt.UTC)
    if isinstance(created, (int, float)) and not isinstance(created, bool) and math.isfinite(created):
        return dt.datetime.fromtimestamp(created, tz=dt.UTC)
    raise ValueError(f"created={created!r}; give a Unix time (time.time()) or a datetime")


# --------------------------------------------------------------------------------------------------
# Rendering for `surprisegate receipts show FILE`

_QUESTION_CHARS = 200
_SPAN_CHARS = 80
_EVIDENCE_CHARS = 160
_INDENT = " " * 9  # continuation lines line up under the values

_RESET = "\033[0m"
_STYLE = {
    "bold": "\033[1m",
    "dim": "\033[2m",
    "red": "\033[31m",
    "green": "\033[32m",
    "yellow": "\033[33m",
    "cyan": "\033[36m",
}
_VERDICT_STYLE = {
    "confident_grounded": "green",
    "uncertain_grounded": "green",
    "uncertain_unanchored": "yellow",
    "confident_unanchored": "red",
    "not_scored": "dim",
}
_STATUS_STYLE = {"ok": "green", "timeout": "red", "error": "red", "skipped": "dim"}
# Model and web text can hold escape sequences; show them, never let them drive the terminal.
_CONTROL_CHARS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


class _Painter:
    """ANSI styles when `color`, plain text otherwise; labels padded so the values line up."""

    def __init__(self, color: bool) -> None:
        self.color = color

    def __call__(self, text: str, style: str | None) -> str:
        return f"{_STYLE[style]}{text}{_RESET}" if self.color and style else text

    def label(self, name: str) -> str:
        return self(f"{name:<8}", "bold") + " "


def format_receipt(record: dict[str, Any], color: bool = False) -> str:
    """Render one receipt as readable text. Missing fields show as "?"; it never raises on partial records."""
    paint = _Painter(color)
    label = paint.label
    lines: list[str] = []
    reply_id = str(record.get("reply_id", "?"))
    lines.append(paint(f"receipt {reply_id}", "bold") + f"  {record.get('created', '?')}")
    lines.append(
        label("model")
        + f"{record.get('model', '?')} ({record.get('backend', '?')})"
        + f" · mode {record.get('mode', '?')} · {record.get('n_tokens', '?')} tokens"
        + f" · finish {record.get('finish_reason', '?')}"
    )
    prompt = record.get("prompt")
    question = _clean(_truncate(prompt, _QUESTION_CHARS)) if isinstance(prompt, str) else "(not stored)"
    lines.append(label("question") + _indent_continuation(question))
    lines.append(label("reply") + _indent_continuation(_clean(str(record.get("reply", "")))))
    lines.extend(_signal_lines(record, paint))
    rounds = record.get("rounds") or []
    if not rounds:
        lines.append(label("rounds") + "none")
    for rnd in rounds:
        if isinstance(rnd, dict):
            lines.extend(_format_round(rnd, paint))
    fault = record.get("fault")
    if isinstance(fault, dict):
        kept = f" · {fault.get('at_token', '?')} reply tokens kept"
        message = _clean(_truncate(str(fault.get("message", "")), _EVIDENCE_CHARS))
        lines.append(label("fault") + paint(str(fault.get("kind", "?")), "red") + kept + f" · {message}")
    return "\n".join(lines)


def _signal_lines(record: dict[str, Any], paint: _Painter) -> list[str]:
    """The surprise aggregates and the canary's verdict."""
    label = paint.label
    surprise = record.get("surprise")
    if isinstance(surprise, dict) and surprise:
        parts = [f"{k} {_num(v)}" for k, v in surprise.items() if not isinstance(v, (dict, list))]
        lines = [label("surprise") + " · ".join(parts)]
    else:
        lines = [label("surprise") + "not measured"]
    canary = record.get("canary")
    if not (isinstance(canary, dict) and canary):
        return [*lines, label("canary") + "none"]
    verdict = str(canary.get("verdict", "?"))
    lines.append(
        label("canary")
        + paint(verdict, _VERDICT_STYLE.get(verdict))
        + f" (uncertainty {_num(canary.get('uncertainty'))}, anchoring {_num(canary.get('anchoring'))})"
    )
    if canary.get("reason"):
        lines.append(_INDENT + _clean(str(canary["reason"])))
    return lines


def _format_round(rnd: dict[str, Any], paint: _Painter) -> list[str]:
    trigger = rnd.get("trigger") or {}
    comparison = f"{trigger.get('statistic', '?')}={_num(trigger.get('value'))} > {_num(trigger.get('threshold'))}"
    lines = [
        paint.label(f"round {rnd.get('round', '?')}")
        + f"trigger at token {trigger.get('token_index', '?')}: "
        + paint(comparison, "cyan")
        + f" · span {_quote(trigger.get('span_text'), _SPAN_CHARS)}"
    ]
    arm_order = rnd.get("arm_order") or []
    rule = f" (rule: {rnd['route_rule']})" if rnd.get("route_rule") else ""
    arms_text = " → ".join(map(str, arm_order)) or "none"
    lines.append(_INDENT + f"class {rnd.get('span_class', '?')}{rule} · arms {arms_text}")
    lines.extend(_arm_line(arm, paint) for arm in rnd.get("arms") or [] if isinstance(arm, dict))
    chosen = rnd.get("chosen")
    if isinstance(chosen, dict):
        lines.append(
            _INDENT
            + "chosen  "
            + paint(_quote(chosen.get("evidence") or chosen.get("claim"), _EVIDENCE_CHARS), "green")
            + f" from {chosen.get('source', '?')}"
            + f" (confidence {_num(chosen.get('confidence'))}, observable {_num(chosen.get('observable'))})"
        )
    else:
        lines.append(_INDENT + "chosen  nothing")
    return [*lines, _action_line(rnd, paint)]


def _arm_line(arm: dict[str, Any], paint: _Painter) -> str:
    name, status = f"{str(arm.get('arm', '?')):<7}", str(arm.get("status", "?"))
    why = arm.get("error") or arm.get("reason")  # the controller may say why an arm was skipped or failed
    why_text = f" · {_clean(_truncate(str(why), _EVIDENCE_CHARS))}" if why else ""
    if status == "skipped":  # never run: latency and results would only be noise
        return _INDENT + f"{name} " + paint(status, _STATUS_STYLE.get(status)) + why_text
    n_results = len(arm.get("results") or [])
    query = arm.get("query")
    query_text = query.get("span") if isinstance(query, dict) else query
    return (
        _INDENT
        + f"{name} "
        + paint(f"{status:<11}", _STATUS_STYLE.get(status))
        + f" {_num(arm.get('latency_ms'), digits=0):>6} ms · {n_results} result{'s' if n_results != 1 else ''}"
        + why_text
        + (f" · query {_quote(query_text, _SPAN_CHARS)}" if query_text else "")
    )


def _action_line(rnd: dict[str, Any], paint: _Painter) -> str:
    action = str(rnd.get("action", "?"))
    reason = f": {_clean(str(rnd['reason']))}" if rnd.get("reason") else ""
    dropped = rnd.get("tokens_dropped", 0)
    dropped_text = f" ({_quote(rnd.get('dropped_text'), _SPAN_CHARS)})" if rnd.get("dropped_text") else ""
    return (
        _INDENT
        + "action  "
        + paint(action, "green" if action == "rewound" else "yellow")
        + reason
        + f" · dropped {dropped} tokens{dropped_text}, injected {rnd.get('tokens_injected', 0)}"
        + f" · {_num(rnd.get('latency_ms'), digits=0)} ms"
    )


def _num(value: Any, digits: int = 2) -> str:
    if isinstance(value, bool) or value is None:
        return "?" if value is None else str(value)
    if isinstance(value, (int, float)):
        return f"{value:.{digits}f}" if isinstance(value, float) else str(value)
    return _clean(str(value))


def _truncate(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _clean(text: str) -> str:
    return _CONTROL_CHARS.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def _quote(text: Any, limit: int) -> str:
    if not text:
        return '""'
    # Spans are shown on one line, so newlines are escaped too.
    flat = str(text).replace("\n", "\\n")
    return '"' + _clean(_truncate(flat, limit)) + '"'


def _indent_continuation(text: str) -> str:
    return text.replace("\n", "\n" + _INDENT)
