"""The file tool: read a file's contents, only from inside configured roots.

A path is refused, with a message that says why, when it contains "..", starts with "~", lies outside every
root, or resolves (through symlinks) to a real path outside every root. The file is opened without following
a final symlink and its real path is checked again after opening, so swapping a symlink in between the check
and the read does not escape. Only regular files are read, at most `max_bytes` of them.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from surprisegate.arms import Evidence
from surprisegate.arms.toolkit import ToolRefused, tool_evidence

DEFAULT_MAX_BYTES = 64 * 1024
MAX_PATH_CHARS = 1024
EVIDENCE_CHARS = 1500  # how much of the file goes into the model's context


@dataclass(frozen=True)
class FileContents:
    path: str  # as asked
    real_path: str  # resolved, inside `root`
    root: str
    text: str  # decoded (UTF-8, undecodable bytes replaced), at most max_bytes of it
    size: int  # bytes on disk
    truncated: bool
    line_count: int  # lines in the text read (all of them unless truncated)


def _real_roots(roots: Sequence[str | os.PathLike]) -> list[Path]:
    if isinstance(roots, (str, os.PathLike)):
        roots = [roots]
    real = [Path(os.path.realpath(os.fspath(root))) for root in roots]
    if not real:
        raise ToolRefused("no_roots", "no file roots are configured; pass roots=[...] to allow reading files")
    return real


def _is_within(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def resolve_path(path: str, roots: Sequence[str | os.PathLike]) -> tuple[Path, Path]:
    """(real path, root) for `path`, or ToolRefused saying why it may not be read.

    Relative paths are looked up in each root in turn; absolute paths must lie inside one.
    """
    real_roots = _real_roots(roots)
    shown_roots = ", ".join(str(r) for r in real_roots)
    if not isinstance(path, str) or not path.strip():
        raise ToolRefused("bad_path", f"path {path!r} is empty; give a file path inside {shown_roots}")
    if len(path) > MAX_PATH_CHARS or "\x00" in path:
        raise ToolRefused("bad_path", f"path {path[:60]!r}... is too long or contains NUL; give a plain file path")
    written = PurePosixPath(path.strip())
    if ".." in written.parts:
        raise ToolRefused(
            "parent_escape",
            f"path {path!r} contains '..'; only files inside the allowed roots ({shown_roots}) are read",
        )
    if path.strip().startswith("~"):
        raise ToolRefused(
            "home_path", f"path {path!r} starts with '~', which is not expanded; give a path inside {shown_roots}"
        )
    if written.is_absolute():
        # Lexically outside every root: refused without touching the filesystem, so nothing leaks.
        configured = [
            Path(os.path.abspath(os.fspath(r)))
            for r in (roots if not isinstance(roots, (str, os.PathLike)) else [roots])
        ]
        if not any(_is_within(Path(written), root) for root in [*real_roots, *configured]):
            raise ToolRefused("outside_roots", f"path {path!r} is outside the allowed roots ({shown_roots})")
        candidates = [Path(written)]
    else:
        candidates = [root / written for root in real_roots]
    for candidate in candidates:
        if not os.path.lexists(candidate):
            continue
        real = Path(os.path.realpath(candidate))
        root = next((r for r in real_roots if _is_within(real, r)), None)
        if root is None:
            raise ToolRefused(
                "symlink_escape",
                f"path {path!r} resolves through a symlink to {real}, "
                f"outside the allowed roots ({shown_roots}); it is not read",
            )
        return real, root
    raise ToolRefused("not_found", f"file {path!r} was not found under the allowed roots ({shown_roots})")


def read_file(path: str, roots: Sequence[str | os.PathLike], max_bytes: int = DEFAULT_MAX_BYTES) -> FileContents:
    """Read a regular file inside `roots`, at most `max_bytes`; ToolRefused for anything else."""
    real, root = resolve_path(path, roots)
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(real, flags)  # O_NONBLOCK: opening a FIFO must not hang the round
    except OSError as err:
        raise ToolRefused("unreadable", f"file {path!r} could not be opened: {err.strerror}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            kind = "a directory" if stat.S_ISDIR(info.st_mode) else "not a regular file"
            raise ToolRefused("not_regular", f"path {path!r} is {kind}; only regular files are read")
        opened = _opened_path(fd)
        if opened is not None and not _is_within(opened, root):  # swapped for a symlink after the check
            raise ToolRefused(
                "symlink_escape",
                f"path {path!r} changed while being opened and now leads outside {root}; it is not read",
            )
        data = os.read(fd, max_bytes + 1)
    finally:
        os.close(fd)
    if b"\x00" in data[:8192]:
        raise ToolRefused("binary", f"file {path!r} looks binary (it contains NUL bytes); only text files are read")
    truncated = len(data) > max_bytes
    text = data[:max_bytes].decode("utf-8", "replace")
    return FileContents(path, str(real), str(root), text, info.st_size, truncated, _count_lines(text))


def _opened_path(fd: int) -> Path | None:
    """Where an open fd really points (Linux /proc); None where that cannot be known."""
    try:
        return Path(os.readlink(f"/proc/self/fd/{fd}"))
    except OSError:
        return None


def _count_lines(text: str) -> int:
    return text.count("\n") + (1 if text and not text.endswith("\n") else 0)


# --------------------------------------------------------------------------------------------------
# finding a file request in text

_FILE_EXTENSIONS = "txt|json|jsonl|toml|ya?ml|cfg|ini|conf|csv|tsv|md|py|log|xml|html|env|rst|sql|sh"
PATH_PATTERN = (
    r"(?:~?/[\w.-]{1,255}(?:/[\w.-]{1,255}){0,20}"  # /etc/hosts, ~/notes
    r"|(?:\.{1,2}/){1,10}[\w.-]{1,255}(?:/[\w.-]{1,255}){0,20}"  # ./data/notes.txt, ../secret.txt (refused later)
    rf"|\b[\w-]{{1,255}}(?:/[\w.-]{{1,255}}){{0,20}}\.(?:{_FILE_EXTENSIONS})\b)"  # config.toml, data/notes.txt
)
ASKS_FOR_CONTENTS = (
    r"\b(?:contents?\s+of|what(?:'s|\s+is)\s+in(?:side)?|inside|read|open|cat|show(?:\s+me)?|lines?\s+(?:of|in)"
    r"|how\s+many\s+lines|say|says|contain|contains)\b"
)
_ASKS = re.compile(ASKS_FOR_CONTENTS, re.IGNORECASE)
_QUOTED_PATH = re.compile(r"`(?P<path>[^`\n]{1,1024})`|\"(?P<dq>[^\"\n]{1,1024})\"|'(?P<sq>[^'\n]{1,1024})'")
_BARE_PATH = re.compile(PATH_PATTERN)
_LINE_COUNT = re.compile(r"\bhow\s+many\s+lines\b|\bline\s+count\b|\bnumber\s+of\s+lines\b", re.IGNORECASE)


@dataclass(frozen=True)
class FileRequest:
    path: str
    text: str  # the text it was found in (cut), for the receipt
    wants_line_count: bool = False


def extract_file_request(text: str) -> FileRequest | None:
    """A file the text asks about ("What are the contents of /etc/hosts?", "what's in `notes.txt`?"), or None.

    A quoted or backticked path is taken whole (spaces, semicolons and all: it is never given to a shell),
    otherwise the first path-shaped word. Whether it may be read is decided by `read_file`, not here.
    """
    if not text or not text.strip():
        return None
    text = text[:4000]
    ask = _ASKS.search(text)
    if ask is None:
        return None
    wants_lines = bool(_LINE_COUNT.search(text))
    for match in _QUOTED_PATH.finditer(text):
        quoted = next(g for g in match.groups() if g is not None).strip()
        if _looks_like_path(quoted):
            return FileRequest(quoted, text, wants_lines)
    bare = _BARE_PATH.search(text)
    if bare:
        return FileRequest(bare.group().rstrip("."), text, wants_lines)
    return None


def _looks_like_path(candidate: str) -> bool:
    # A quoted string is a path when it has a separator or an extension at its start: "notes.txt; rm -rf /".
    first = candidate.split()[0] if candidate.split() else ""
    return "/" in first or bool(re.search(rf"\.(?:{_FILE_EXTENSIONS})\b", candidate))


def file_evidence(contents: FileContents, wants_line_count: bool = False, field_name: str = "") -> Evidence:
    shown = contents.text[:EVIDENCE_CHARS]
    cut = len(contents.text) > EVIDENCE_CHARS or contents.truncated
    lines = f"{contents.line_count}{'+' if contents.truncated else ''} line{'s' if contents.line_count != 1 else ''}"
    if wants_line_count:
        sentence = f"The file {contents.path} has {lines}."
        output = str(contents.line_count)
    else:
        sentence = f"The file {contents.path} ({lines}, {contents.size} bytes) contains:\n{shown}"
        sentence += "\n[... cut]" if cut else ""
        output = shown
    return tool_evidence(
        "files",
        claim=f"contents of {contents.path} ({contents.size} bytes)",
        evidence=sentence,
        tool_input=contents.path,
        output=output,
        sandbox="allowed-roots",
        real_path=contents.real_path,
        root=contents.root,
        size=contents.size,
        truncated=contents.truncated,
        line_count=contents.line_count,
        field=field_name,
    )
