"""One string names a memory store; `open_memory` opens the right backend for it.

    PATH                                  SQLite file (the embedded default), e.g. ~/notes.sqlite
    milvus://HOST[:PORT]/COLLECTION       a Milvus server or cluster over gRPC (port 19530 by default)
    milvus+https://HOST[:PORT]/COLLECTION the same over TLS (e.g. Zilliz Cloud)
    milvus-lite:PATH.db[#COLLECTION]      milvus-lite: Milvus embedded, no server to run; collection "memory" by default

A server that needs credentials reads them from the MILVUS_TOKEN environment variable ("user:password"
or an API key), so they never appear in a URI that errors and receipts repeat.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from urllib.parse import urlsplit

from ..errors import InputError

DEFAULT_PORT = 19530
DEFAULT_COLLECTION = "memory"
_COLLECTION_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,254}")  # Milvus's rule for collection names

URI_HELP = (
    "pass a SQLite file path, milvus://HOST:19530/COLLECTION (a Milvus server), "
    "or milvus-lite:PATH.db#COLLECTION (embedded Milvus)"
)


def open_memory(uri: str, create: bool = False, embedder="auto", mode: str = "hybrid"):
    """Open the memory store named by `uri` (see the module doc); `create` makes it if absent.

    `embedder` ("auto", None or an `Embedder`) and `mode` (the default search mode) mean what they
    mean for `SQLiteMemory` and `MilvusMemory`.
    """
    uri = str(uri)
    if uri.startswith(("milvus://", "milvus+https://")):
        return _open_server(uri, create, embedder, mode)
    if uri.startswith("milvus-lite:"):
        return _open_lite(uri, create, embedder, mode)
    if re.match(r"[A-Za-z][A-Za-z0-9+.-]*://", uri):
        raise InputError(f"memory={uri!r} has a scheme this surprisegate does not know; {URI_HELP}")
    from .sqlite import SQLiteMemory

    return SQLiteMemory(Path(uri).expanduser(), create=create, embedder=embedder, mode=mode)


def _collection(uri: str, name: str) -> str:
    if not _COLLECTION_NAME.fullmatch(name):
        raise InputError(
            f"memory={uri!r} names collection {name!r}, which Milvus does not allow; "
            "use letters, digits and underscores, starting with a letter (e.g. milvus://HOST:19530/memory)"
        )
    return name


def _open_server(uri: str, create: bool, embedder, mode: str):
    from .milvus import MilvusMemory

    parts = urlsplit(uri)
    try:
        port = parts.port or DEFAULT_PORT
    except ValueError as err:  # a port that is not a number, or out of range
        raise InputError(f"memory={uri!r} has a bad port ({err}); {URI_HELP}") from err
    if not parts.hostname:
        raise InputError(f"memory={uri!r} names no host; {URI_HELP}")
    if parts.username or parts.password:
        raise InputError(
            f"memory={uri!r} carries credentials; remove them from the URI and set MILVUS_TOKEN=user:password instead"
        )
    collection = _collection(uri, parts.path.strip("/") or DEFAULT_COLLECTION)
    scheme = "https" if parts.scheme == "milvus+https" else "http"
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname  # IPv6 literal
    return MilvusMemory(
        f"{scheme}://{host}:{port}",
        collection,
        create=create,
        embedder=embedder,
        mode=mode,
        uri=uri,
        token=os.environ.get("MILVUS_TOKEN", ""),
    )


def _open_lite(uri: str, create: bool, embedder, mode: str):
    from .milvus import MilvusMemory

    location, _, name = uri[len("milvus-lite:") :].partition("#")
    path = Path(location).expanduser()
    if path.suffix != ".db":  # pymilvus hands only a ".db" path to milvus-lite
        raise InputError(
            f"memory={uri!r}: a milvus-lite store is a file ending in .db, e.g. milvus-lite:~/memory.db#memory"
        )
    if not path.exists():
        if not create:
            raise InputError(
                f"memory={uri!r} does not exist; build it with: surprisegate memory add --memory {uri} FILE.jsonl"
            )
        path.parent.mkdir(parents=True, exist_ok=True)
    return MilvusMemory(
        str(path.resolve()),
        _collection(uri, name or DEFAULT_COLLECTION),
        create=create,
        embedder=embedder,
        mode=mode,
        uri=uri,
    )
