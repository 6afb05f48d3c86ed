"""A round's arm calls: order, arbitration between arms, the deadline and the bounded pool."""

from __future__ import annotations

import threading
import time

import pytest

from surprisegate.arms import Evidence, Query
from surprisegate.config import Config
from surprisegate.gate.grounding import ArmPool, arm_order, ground_round
from surprisegate.gate.router import route
from test_loop import QUESTION, StaticArm


def _evidence(source, confidence, text="snippet"):
    return Evidence(claim=text, evidence=text, confidence=confidence, source=source)


@pytest.mark.parametrize(
    "memory_conf, web_conf, margin, kept, asked",
    [
        (0.9, 0.95, 0.75, "memory:a", ["memory"]),  # strong first evidence: the next arm is never asked
        (0.65, 0.82, 0.75, "web:b", ["memory", "web"]),  # weak: the web is asked too and covers more
        (0.65, 0.60, 0.75, "memory:a", ["memory", "web", "tool"]),  # both weak: the better one, every arm asked
        (0.65, 0.82, 0.0, "memory:a", ["memory"]),  # margin 0: the first arm with evidence wins
        (0.70, 0.70, 0.75, "memory:a", ["memory", "web", "tool"]),  # a tie keeps the first arm's
    ],
)
def test_weak_evidence_lets_the_next_arm_be_asked_and_the_better_is_kept(memory_conf, web_conf, margin, kept, asked):
    arms = {
        "memory": StaticArm("memory", [_evidence("memory:a", memory_conf)]),
        "web": StaticArm("web", [_evidence("web:b", web_conf)]),
        "tool": StaticArm("tool", []),
    }
    chosen, reports = ground_round(
        arms, ["memory", "web", "tool"], Query("", QUESTION, ""), time.monotonic() + 2, margin=margin
    )
    assert chosen.source == kept
    assert [r.arm for r in reports] == asked
    assert [name for name, arm in arms.items() if arm.calls] == asked  # every arm asked is a grounding call
    if len(asked) > 1:
        assert "margin" in reports[0].arbitration


def test_arbitration_holds_the_round_deadline():
    arms = {
        "memory": StaticArm("memory", [_evidence("memory:a", 0.5)]),
        "web": StaticArm("web", [_evidence("web:b", 0.9)], delay=1.0),
    }
    started = time.monotonic()
    chosen, reports = ground_round(arms, ["memory", "web"], Query("", QUESTION, ""), started + 0.2, margin=0.75)
    assert time.monotonic() - started < 0.5
    assert chosen.source == "memory:a" and reports[1].status == "timeout"


def test_a_full_pool_skips_the_arm_with_that_reason_and_frees_slots_when_calls_return():
    release = threading.Event()
    pool = ArmPool(size=1)
    started = time.monotonic()
    assert pool.call(release.wait, started + 0.1) == ("timeout", None)  # still running: its slot stays taken
    arms = {"memory": StaticArm("memory", [_evidence("memory:a", 0.9)])}
    chosen, (report,) = ground_round(arms, ["memory"], Query("", QUESTION, ""), time.monotonic() + 1, pool=pool)
    assert chosen is None and report.status == "skipped" and "executor full" in report.reason
    assert arms["memory"].calls == []  # never started: no thread piles up
    release.set()
    deadline = time.monotonic() + 2
    while time.monotonic() < deadline and pool.call(lambda: 1, time.monotonic() + 1)[0] == "full":
        time.sleep(0.01)
    assert pool.call(lambda: 2, time.monotonic() + 1) == ("ok", 2)


def test_an_arm_error_is_reported_never_raised():
    arms = {"memory": StaticArm("memory", error=RuntimeError("db locked"))}
    chosen, (report,) = ground_round(arms, ["memory"], Query("", QUESTION, ""), time.monotonic() + 1)
    assert chosen is None and report.status == "error" and "db locked" in report.error


def test_pool_size_must_be_positive():
    with pytest.raises(ValueError, match="size"):
        ArmPool(0)


# --- arm order: the config's, one source ------------------------------------------------------------
@pytest.mark.parametrize(
    ("span_class", "available", "expected"),
    [
        ("computable", ("memory", "web", "tool"), ("memory", "tool", "web")),  # a tool settles it before the web
        ("entity", ("memory", "web", "tool"), ("memory", "web", "tool")),
        ("other", ("memory", "web", "tool"), ("memory", "web", "tool")),
        ("computable", ("web", "tool"), ("tool", "web")),  # the class decides the order, not the mapping's
        ("entity", ("tool", "web", "memory"), ("memory", "web", "tool")),
        ("other", (), ()),
        ("other", ("oracle", "web"), ("web",)),  # arms the config does not name are never asked
    ],
)
def test_arm_order_is_the_configs_kept_to_the_arms_this_run_has(span_class, available, expected):
    arms = {name: StaticArm(name, []) for name in available}
    assert arm_order(Config(), span_class, arms) == expected


def test_a_configured_order_is_followed_and_the_router_names_no_order():
    config = Config(arm_order_other=("web", "memory"))
    arms = {name: StaticArm(name, []) for name in ("memory", "web", "tool")}
    assert arm_order(config, "entity", arms) == ("web", "memory")
    assert not hasattr(route("Paris", "What is the capital of France?"), "arm_order")
