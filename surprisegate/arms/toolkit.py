"""What every Act tool shares: the refusal error and the shape of its evidence.

A tool either returns a verified result or refuses with a `ToolRefused` whose `reason` is a short code
("outside_roots", "not_allowed", "timeout", ...) and whose message says what happened and how to fix it.
"""

from __future__ import annotations

from typing import Any

from surprisegate.arms import Evidence
from surprisegate.errors import InputError


class ToolRefused(InputError):
    """A tool would not, or could not, produce a result. `reason` is a stable code for tests and receipts."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


def tool_evidence(
    tool: str,
    *,
    claim: str,
    evidence: str,
    tool_input: Any,
    output: Any,
    sandbox: str,
    confidence: float = 1.0,
    **extra: Any,
) -> Evidence:
    """Evidence from a tool run: observable 1.0, with the tool's input and output in `detail` for the receipt.

    `sandbox` names what contained the run: "bwrap" or "rlimits" for Python, "allowed-roots" for files, ...
    """
    detail = {"tool": tool, "input": tool_input, "output": output, "sandbox": sandbox, **extra}
    return Evidence(
        claim=claim,
        evidence=evidence,
        confidence=confidence,
        source=f"tool:{tool}",
        observable=1.0,
        detail=detail,
    )
