"""Prometheus metrics of `serve`, through the official client, in a registry of the app's own (two apps
in one process, as in the tests, never share counters)."""

from __future__ import annotations

from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)

CONTENT_TYPE = CONTENT_TYPE_LATEST


class Metrics:
    def __init__(self) -> None:
        disable_created_metrics()  # the `*_created` series double the page and no dashboard reads them
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "surprisegate_requests",
            "HTTP requests answered, by endpoint and status",
            ["endpoint", "status"],
            registry=r,
        )
        self.triggers = Counter(
            "surprisegate_triggers",
            "windows that crossed the threshold, by mode (detect records them)",
            ["mode"],
            registry=r,
        )
        self.rounds = Counter(
            "surprisegate_rounds",
            "grounding rounds, by the arm that grounded (none) and action",
            ["arm", "action"],
            registry=r,
        )
        self.grounding = Histogram(
            "surprisegate_grounding_seconds",
            "latency of a grounding round, routing to resume",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10),
            registry=r,
        )
        self.tokens = Counter("surprisegate_tokens", "reply tokens sent (completion tokens)", registry=r)
        self.tokens_per_s = Histogram(
            "surprisegate_tokens_per_second",
            "decoding speed of each reply: tokens decoded (dropped ones included) / reply seconds",
            buckets=(5, 10, 20, 40, 60, 80, 120, 160, 240, 400),
            registry=r,
        )
        self.reply_seconds = Histogram(
            "surprisegate_reply_seconds", "time from admission to the end of a reply", registry=r
        )
        self.queue_depth = Gauge("surprisegate_queue_depth", "requests waiting for a session", registry=r)
        self.active = Gauge("surprisegate_sessions_active", "replies being written", registry=r)
        self.disconnects = Counter("surprisegate_client_disconnects", "replies cancelled by their client", registry=r)

    def reply(self, receipt: dict[str, Any]) -> None:
        """Count one finished reply from its receipt."""
        mode = receipt.get("mode", "off")
        extra = receipt.get("extra", {})
        self.triggers.labels(mode).inc(len(receipt.get("rounds", [])) + len(extra.get("would_trigger") or []))
        for r in receipt.get("rounds", []):
            source = (r.get("chosen") or {}).get("source") or "none"
            self.rounds.labels(source.split(":", 1)[0], r.get("action", "unknown")).inc()
            self.grounding.observe(float(r.get("latency_ms") or 0.0) / 1000.0)
        self.tokens.inc(int(receipt.get("n_tokens", 0)))
        seconds = float(extra.get("latency_ms") or 0.0) / 1000.0
        if seconds > 0:
            self.tokens_per_s.observe(int(extra.get("tokens_decoded", 0)) / seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)
