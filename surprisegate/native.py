"""Small C helpers compiled once per machine into $SURPRISEGATE_HOME/lib and loaded with ctypes.

Each helper has a Python (numpy) twin that computes the same thing, used where no C compiler is found or
compiling fails; the compiled one only saves time on a per-token path. A library is keyed by its source,
its flags and whatever else it was built against (`key_extra`), so a changed source builds anew, and it
is written atomically, so a concurrent first use never loads half a file.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import shutil
import subprocess
import sysconfig
import tempfile
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path

log = logging.getLogger(__name__)


def c_compiler() -> str | None:
    """$CC, else cc or gcc on PATH."""
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")


def build(source: Path, name: str, flags: Sequence[str] = (), link: Sequence[str] = (), key_extra: bytes = b"") -> Path:
    """`source` compiled into a shared library under $SURPRISEGATE_HOME/lib (once: a cached build is reused).
    Raises OSError (no compiler, an unwritable home) or RuntimeError (the compiler's complaint)."""
    from .paths import home

    compiler = c_compiler()
    if compiler is None:
        raise OSError("no C compiler found (set CC, or install gcc)")
    key = hashlib.sha256(source.read_bytes() + " ".join([*flags, *link]).encode() + key_extra).hexdigest()[:16]
    target = home() / "lib" / f"{name}-{key}{sysconfig.get_config_var('SHLIB_SUFFIX') or '.so'}"
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        built = Path(tmp) / target.name
        done = subprocess.run(
            [compiler, "-shared", "-fPIC", *flags, str(source), "-o", str(built), *link],
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            raise RuntimeError(done.stderr or f"{compiler} exited with {done.returncode}")
        os.replace(built, target)
    return target


_SOFTMAX_SOURCE = Path(__file__).with_name("softmax_stats.c")


@lru_cache(maxsize=1)
def softmax_stats_library() -> ctypes.CDLL | None:
    """softmax_stats.c compiled and loaded, or None (numpy then computes the same, about 2x slower).
    SURPRISEGATE_NATIVE=0 turns it off."""
    if os.environ.get("SURPRISEGATE_NATIVE", "1") == "0":
        return None
    try:
        lib = ctypes.CDLL(str(build(_SOFTMAX_SOURCE, "softmax_stats", ["-O3"], ["-lm"])))
    except (OSError, RuntimeError) as err:
        log.info("softmax stats: compiled kernel unavailable (%s); numpy computes them", str(err).strip()[:200])
        return None
    lib.surprisegate_softmax_stats.restype = ctypes.c_int64
    lib.surprisegate_softmax_stats.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_double)]
    return lib
