"""Where surprisegate keeps its files (receipts, the demo store, calibrations, the compiled layer tap)."""

from __future__ import annotations

import os
from pathlib import Path


def home() -> Path:
    """$SURPRISEGATE_HOME, default ~/.cache/surprisegate."""
    return Path(os.environ.get("SURPRISEGATE_HOME") or Path.home() / ".cache" / "surprisegate")
