"""`serve` attacked from loopback: the red team's inputs against a real server (the embedded model, a
bearer key, --sessions 2, every normal request intervening), through the official openai client and raw
HTTP. Each bad input gets its status (400 malformed or out of bounds, 401, 404) and an OpenAI-shaped error
under 2 KB that names the field without echoing more than a short prefix of its value; a normal request
right after is answered, grounded, as before. One server for the module (tests/test_serve.py's
real_server); the pure status-URL cases are in tests/test_arms_status.py.
"""

from __future__ import annotations

import contextlib
import dataclasses
import http.client
import json
import time
from collections.abc import Iterator

import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("starlette")

from click.testing import CliRunner  # noqa: E402

from surprisegate.errors import InputError  # noqa: E402
from surprisegate.gate.receipts import read_receipts  # noqa: E402
from surprisegate.serve.wire import (  # noqa: E402
    MAX_DEPTH,
    ApiError,
    Limits,
    check_depth,
    parse_json,
    shown,
    with_client_system,
)
from test_serve import BURKINA, INTERVENE, KEY, client, grounded_by, real_server, receipt_of  # noqa: E402

USER = [{"role": "user", "content": "Hi?"}]
MAX_ERROR_BODY = 2048


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SURPRISEGATE_API_KEY", KEY)  # serve reads it when the app is built
        server = real_server(tmp_path_factory, {})
    server.model = client(server, KEY).models.list().data[0].id
    server.state = server.server.config.app.state.server  # the app's Server: its settings and metrics
    yield server
    server.stop()


# --------------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------------
def raw(srv, data: bytes, path: str = "/v1/chat/completions", key: str | None = KEY) -> tuple[int, bytes]:
    """POST `data` as it is (no client library re-encoding it) on a fresh connection: (status, body)."""
    connection = http.client.HTTPConnection(srv.host, srv.port, timeout=300)
    headers = {"Content-Type": "application/json"} | ({"Authorization": f"Bearer {key}"} if key else {})
    try:
        connection.request("POST", path, body=data, headers=headers)
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def chat(srv, **fields) -> bytes:
    """A chat body as JSON bytes; json.dumps writes a lone surrogate as its \\uXXXX escape."""
    return json.dumps({"model": srv.model, "messages": USER} | fields).encode()


def assert_refused(
    answer: tuple[int, bytes], status: int, param: str | None = None, code: str | None = None, names: str | None = None
) -> dict:
    """The status, an OpenAI-shaped error under 2 KB naming the field (`names`, default `param`), with
    nothing of ours in it (no repr, no traceback)."""
    got, body = answer
    assert got == status, body[:500]
    assert len(body) < MAX_ERROR_BODY, len(body)
    error = json.loads(body)["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    if param is not None:
        assert error["param"] == param, error
    if code is not None:
        assert error["code"] == code, error
    if names or param:
        assert (names or param) in error["message"], error["message"]
    for internal in ("object at 0x", "_MISSING_TYPE", "Traceback", "Error:", "site-packages"):
        assert internal not in error["message"], error["message"]
    return error


def assert_not_echoed(error: dict, value: str) -> None:
    """At most a short prefix of a long value is in the message, then its length."""
    assert value[:80] not in error["message"] and len(error["message"]) < 1500, error["message"]
    assert "characters)" in error["message"] or value[:40] not in error["message"]  # a cut says the length


def refused_by_client(call) -> tuple[int, bytes]:
    """The official client's error as (status, body bytes)."""
    with pytest.raises(openai.APIStatusError) as caught:
        call()
    return caught.value.status_code, caught.value.response.content


def ask(srv, messages=None, **kw):
    messages = messages or [{"role": "user", "content": BURKINA}]
    return client(srv, KEY).chat.completions.create(model=srv.model, messages=messages, **kw)


def assert_idle(srv) -> None:
    """After a refused request: no session taken or left behind, nothing queued (the refusal came before
    admission). The model's time is dear here, so each class of attack ends with assert_still_serves."""
    health = json.loads(http_get(srv, "/health"))
    assert health["status"] == "ok" and health["active"] == 0 and health["queued"] == 0, health


def assert_still_serves(srv) -> None:
    """A normal request right after: the demo capital, grounded from memory, as before the attack."""
    r = ask(srv, extra_body=INTERVENE)
    receipt = receipt_of(r)
    assert "Ouagadougou" in r.choices[0].message.content and grounded_by(receipt) == ["memory:country:BF"]


@contextlib.contextmanager
def policy(srv, client_system: str) -> Iterator[None]:
    """The server's client_system rule for a while (what `serve --client-system` sets)."""
    settings = srv.state.settings
    before = settings.limits
    settings.limits = dataclasses.replace(before, client_system=client_system)
    try:
        yield
    finally:
        settings.limits = before


def seen_by_model(srv, response) -> list[dict]:
    """The chat the model was given (the receipts file keeps it whole: the client's view hides the
    server's system prompt)."""
    reply_id = receipt_of(response)["reply_id"]
    return next(r for r in read_receipts(srv.receipts) if r["reply_id"] == reply_id)["messages"]


# --------------------------------------------------------------------------------------------------
# the pieces, without a server
# --------------------------------------------------------------------------------------------------
def test_the_depth_scan_counts_brackets_outside_strings_only():
    check_depth("[" * MAX_DEPTH + "]" * MAX_DEPTH)
    with pytest.raises(ApiError, match="more than 32 deep"):
        check_depth("[" * (MAX_DEPTH + 1))
    check_depth(json.dumps({"a": "[" * 5000 + '\\"' + "{" * 5000, "b": ['x"]', "\\"]}))  # escapes too
    assert parse_json(b'{"a": [[[["]]]]]]]]"]]]]}') == {"a": [[[["]]]]]]]]"]]]]}


def test_the_depth_scan_is_linear_on_unclosed_strings():
    # A backtracking string pattern retried at each of 500,000 quotes would take hours on these.
    for text in ('\\"' * 500_000, '"\\' * 500_000, '"' * 1_000_001, '"' + "\\a" * 500_000):
        started = time.monotonic()
        check_depth(text)
        assert time.monotonic() - started < 2.0, text[:10]


def test_shown_cuts_a_long_value_and_says_its_length():
    assert shown("short") == '"short"' and shown(1e308) == "1e+308" and shown(None) == "null"
    cut = shown("z" * 1_000_000)
    assert cut.startswith('"' + "z" * 60) and "z" * 61 not in cut and cut.endswith("(1000000 characters)")
    assert len(shown(["w" * 500] * 500)) < 120


def test_an_error_body_is_never_over_2_kb_and_always_encodes():
    for message in ("m" * 100_000, "\x01" * 100_000, '"' * 100_000, "\ud800" * 5000, "é" * 100_000):
        body = ApiError(message, param="p" * 10_000).body()
        encoded = json.dumps(body, ensure_ascii=False).encode("utf-8")  # a lone surrogate would fail here
        assert len(encoded) <= 2000 and body["error"]["message"].endswith("(message cut)")
        assert len(body["error"]["param"]) <= 120


def test_client_system_rules():
    server, chat_ = "SERVER.", [{"role": "system", "content": "MINE."}, {"role": "user", "content": "Q?"}]
    assert with_client_system(chat_, "append", server)[0] == {"role": "system", "content": "SERVER.\n\nMINE."}
    assert with_client_system(chat_, "replace", server)[0] == {"role": "system", "content": "MINE."}
    assert with_client_system(chat_, "append", "")[0] == {"role": "system", "content": "MINE."}
    only_user = chat_[1:]
    assert with_client_system(only_user, "refuse", server) == only_user  # nothing to refuse
    with pytest.raises(ApiError, match="refuses a client's") as caught:
        with_client_system(chat_, "refuse", server)
    assert caught.value.param == "messages[0].role" and caught.value.code == "system_turn_refused"


def test_limits_name_their_flag_when_wrong():
    with pytest.raises(InputError, match="--client-system"):
        Limits(client_system="ignore")
    for budget in (0, -1, float("nan"), float("inf"), True):
        with pytest.raises(InputError, match="--max-grounding-s"):
            Limits(max_grounding_s=budget)
    assert Limits().client_system == "append" and Limits().max_grounding_s == 8.0


def test_the_serve_command_has_the_client_system_and_budget_flags():
    from surprisegate.cli import main

    out = CliRunner().invoke(main, ["serve", "--help"])
    assert out.exit_code == 0 and "--client-system" in out.output and "--max-grounding-s" in out.output
    bad = CliRunner().invoke(main, ["serve", "--client-system", "ignore", "--memory", "none"])
    assert bad.exit_code == 2 and "--client-system" in bad.output
    bad = CliRunner().invoke(main, ["serve", "--max-grounding-s", "0", "--memory", "none"])
    assert bad.exit_code == 2 and "--max-grounding-s" in bad.output  # refused before any model is loaded


# --------------------------------------------------------------------------------------------------
# 5. malformed bodies: lone surrogates anywhere, deep nesting, non-JSON numbers
# --------------------------------------------------------------------------------------------------
SURROGATES = [
    ("in a message", {"messages": [{"role": "user", "content": "Hi \ud800 there?"}]}, "messages[0].content"),
    ("a low one alone", {"messages": [{"role": "user", "content": "\udfff?"}]}, "messages[0].content"),
    ("a pair reversed", {"messages": [{"role": "user", "content": "\udc00\ud800?"}]}, "messages[0].content"),
    (
        "in a text part",
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "x\ud800"}]}]},
        "messages[0].content[0].text",
    ),
    ("in stop", {"stop": "\ud800"}, "stop"),
    ("in a stop list", {"stop": ["END", "x\udbff"]}, "stop[1]"),
    (
        "in a kind_thresholds key",
        {"surprisegate": {"kind_thresholds": {"\ud800": 1.0}}},
        "surprisegate.kind_thresholds",
    ),
    ("in the model's name", {"model": "\ud800"}, "model"),
    (
        "in a streamed request",
        {"stream": True, "messages": [{"role": "user", "content": "\ud800"}]},
        "messages[0].content",
    ),
]


@pytest.mark.slow
@pytest.mark.parametrize("fields,param", [c[1:] for c in SURROGATES], ids=[c[0] for c in SURROGATES])
def test_a_lone_surrogate_is_a_400_before_anything_runs(srv, fields, param):
    answer = raw(srv, chat(srv, **fields))
    error = assert_refused(answer, 400, param, "invalid_unicode")
    assert "lone surrogate" in error["message"]
    assert_idle(srv)


@pytest.mark.slow
def test_a_lone_surrogate_in_a_key_of_the_body_is_a_400(srv):
    error = assert_refused(raw(srv, chat(srv, **{"\ud800": 1})), 400, None, "invalid_unicode", names="a key")
    assert "the request body" in error["message"]
    completion = json.dumps({"model": srv.model, "prompt": "Hi \ud800?"}).encode()
    assert_refused(raw(srv, completion, "/v1/completions"), 400, "prompt", "invalid_unicode")
    assert_idle(srv)


@pytest.mark.slow
def test_a_surrogate_pair_is_text_and_is_served(srv):
    r = ask(srv, [{"role": "user", "content": BURKINA + " \U0001f600"}], extra_body=INTERVENE)  # sent as \ud83d\ude00
    assert "Ouagadougou" in r.choices[0].message.content


@pytest.mark.slow
def test_after_the_surrogates_a_normal_request_is_answered_grounded(srv):
    assert_still_serves(srv)


NESTED = [
    ("50,000 [ unclosed", b"[" * 50_000),
    ("50,000 [ closed", b"[" * 50_000 + b"]" * 50_000),
    ("50,000 { as values", b'{"a":' * 50_000 + b"1" + b"}" * 50_000),
    ("nested inside messages", b'{"model": "m", "messages": ' + b"[" * 50_000 + b"]" * 50_000 + b"}"),
    ("33 deep in metadata", b'{"model": "m", "messages": [], "metadata": ' + b"[" * 33 + b"]" * 33 + b"}"),
]


@pytest.mark.slow
@pytest.mark.parametrize("data", [c[1] for c in NESTED], ids=[c[0] for c in NESTED])
def test_deep_nesting_is_a_400_without_recursion(srv, data):
    for path in ("/v1/chat/completions", "/v1/completions"):
        error = assert_refused(raw(srv, data, path), 400, None, "invalid_json", names="deep")
        assert "32" in error["message"]
    assert_idle(srv)


@pytest.mark.slow
def test_brackets_inside_strings_are_text_not_nesting(srv):
    question = BURKINA + " " + "[" * 2000 + "{" * 2000
    r = ask(srv, [{"role": "user", "content": question}], max_tokens=8)
    assert r.choices[0].finish_reason in ("stop", "length")


@pytest.mark.parametrize(
    "data",
    [
        b'{"model": "m", "messages": [], "temperature": NaN}',
        b'{"model": "m", "messages": [], "temperature": -Infinity}',
        b'{"model": "m", "messages": [], "seed": 1' + b"0" * 5000 + b"}",  # past Python's int digits
        b'{"model": "m", "messages": [\xed\xa0\x80]}',  # an encoded surrogate: not UTF-8
        b'{"model": "m", "messages": [\xff]}',
        b'{"model": "m", "messages": [',
    ],
    ids=["NaN", "-Infinity", "5000 digits", "encoded surrogate", "not UTF-8", "truncated"],
)
@pytest.mark.slow
def test_malformed_json_is_a_400(srv, data):
    assert_refused(raw(srv, data), 400, None, "invalid_json")
    assert_idle(srv)


@pytest.mark.slow
def test_after_malformed_bodies_a_normal_request_is_answered_grounded(srv):
    assert_still_serves(srv)


@pytest.mark.slow
def test_an_unknown_caller_is_401_before_its_body_is_read(srv):
    for data in (b"[" * 50_000, chat(srv, stop="\ud800")):
        assert_refused(raw(srv, data, key=None), 401, None, "missing_api_key")
        assert_refused(raw(srv, data, key="nope"), 401, None, "invalid_api_key")
    assert_idle(srv)


# --------------------------------------------------------------------------------------------------
# 6. long values are never echoed; error bodies stay under 2 KB
# --------------------------------------------------------------------------------------------------
MB = "x" * 1_000_000
LONG_KEY = "k" * 300_000


@pytest.mark.slow
def test_a_1_mb_stop_is_refused_with_a_short_prefix(srv):
    answer = refused_by_client(lambda: ask(srv, [{"role": "user", "content": "Hi?"}], stop=MB))
    error = assert_refused(answer, 400, "stop", names="stop")
    assert_not_echoed(error, MB)
    assert "1000000 characters" in error["message"] and "256" in error["message"]
    five = ["y" * 190_000] * 5
    error = assert_refused(raw(srv, chat(srv, stop=five)), 400, "stop")
    assert_not_echoed(error, five[0])
    assert_idle(srv)


@pytest.mark.parametrize(
    "fields,param",
    [
        ({"surprisegate": {"kind_thresholds": {LONG_KEY: 1.0}}}, "surprisegate.kind_thresholds." + "k" * 40 + "…"),
        ({LONG_KEY: 1}, "k" * 40 + "…"),  # an unknown field
        ({"surprisegate": {LONG_KEY: 1}}, "surprisegate." + "k" * 40 + "…"),  # an unknown setting
        ({"model": LONG_KEY}, "model"),
        ({"messages": [{"role": LONG_KEY, "content": "x"}]}, "messages[0].role"),
        ({"messages": [{"role": "user", "content": "x", LONG_KEY: 1}]}, "messages[0]"),
        ({"messages": [{"role": "assistant", "content": LONG_KEY}]}, "messages"),
        ({"temperature": LONG_KEY}, "temperature"),
        ({"surprisegate": {"mode": LONG_KEY}}, "surprisegate.mode"),
        ({"surprisegate": {"arm_order_other": [LONG_KEY]}}, "surprisegate.arm_order_other"),
        ({"stream": True, "stream_options": {LONG_KEY: True}}, "stream_options"),
    ],
    ids=[
        "a 300,000-character kind",
        "a field name",
        "a setting name",
        "a model",
        "a role",
        "a turn's key",
        "a last turn not the user's",
        "a number",
        "a mode",
        "an arm",
        "stream options",
    ],
)
@pytest.mark.slow
def test_a_300_000_character_value_is_named_not_echoed(srv, fields, param):
    status = 404 if "model" in fields else 400
    error = assert_refused(raw(srv, chat(srv, **fields)), status, param, names=param.split(".")[-1][:20])
    assert_not_echoed(error, LONG_KEY)
    assert_idle(srv)


@pytest.mark.slow
def test_unknown_routes_with_a_long_path_are_short_errors(srv):
    connection = http.client.HTTPConnection(srv.host, srv.port, timeout=60)
    try:
        connection.request("GET", "/v1/" + "p" * 8000)
        response = connection.getresponse()
        answer = response.status, response.read()
    finally:
        connection.close()
    assert_not_echoed(assert_refused(answer, 404), "p" * 8000)
    assert_idle(srv)


@pytest.mark.slow
def test_after_long_values_a_normal_request_is_answered_grounded(srv):
    assert_still_serves(srv)


# --------------------------------------------------------------------------------------------------
# 3 and 9. gate settings: known kinds, bounded values, and the grounding budget
# --------------------------------------------------------------------------------------------------
BOUNDS = [
    ("threshold -1e308", {"threshold": -1e308}, "surprisegate.threshold"),
    ("threshold 1e308", {"threshold": 1e308}, "surprisegate.threshold"),
    ("threshold 65 bits", {"threshold": 65}, "surprisegate.threshold"),
    ("threshold as a string", {"threshold": "high"}, "surprisegate.threshold"),
    ("threshold true", {"threshold": True}, "surprisegate.threshold"),
    (
        "an unknown kind",
        {"kind_thresholds": {"favourite colour": 1.0}},
        "surprisegate.kind_thresholds.favourite colour",
    ),
    ("a kind's bits 1e308", {"kind_thresholds": {"capital": 1e308}}, "surprisegate.kind_thresholds.capital"),
    ("a kind's bits as text", {"kind_thresholds": {"capital": "1"}}, "surprisegate.kind_thresholds.capital"),
    ("a kind's bits null", {"kind_thresholds": {"capital": None}}, "surprisegate.kind_thresholds.capital"),
    ("kind_thresholds a list", {"kind_thresholds": [["capital", 1]]}, "surprisegate.kind_thresholds"),
    ("round_deadline_s over the limit", {"round_deadline_s": 10.5}, "surprisegate.round_deadline_s"),
    ("round_deadline_s 0", {"round_deadline_s": 0}, "surprisegate.round_deadline_s"),
    ("round_deadline_s 1e308", {"round_deadline_s": 1e308}, "surprisegate.round_deadline_s"),
    ("max_rounds over the limit", {"max_rounds": 5}, "surprisegate.max_rounds"),
    ("max_rounds negative", {"max_rounds": -1}, "surprisegate.max_rounds"),
    ("max_rounds a fraction", {"max_rounds": 1.5}, "surprisegate.max_rounds"),
    ("window 0", {"window": 0}, "surprisegate.window"),
    ("window 10**6", {"window": 10**6}, "surprisegate.window"),
    ("min_tokens 0", {"min_tokens": 0}, "surprisegate.min_tokens"),
    ("relevance_floor 2", {"relevance_floor": 2}, "surprisegate.relevance_floor"),
    ("arbitration_margin -0.1", {"arbitration_margin": -0.1}, "surprisegate.arbitration_margin"),
    ("a mode not known", {"mode": "always"}, "surprisegate.mode"),
    ("an injection not known", {"injection": "raw"}, "surprisegate.injection"),
    ("a signal not known", {"signal": 5}, "surprisegate.signal"),
    ("a statistic not known", {"statistic": "min"}, "surprisegate.statistic"),
    ("an arm twice", {"arm_order_other": ["memory", "memory"]}, "surprisegate.arm_order_other"),
    ("an arm not known", {"arm_order_computable": ["shell"]}, "surprisegate.arm_order_computable"),
    ("an arm order as text", {"arm_order_other": "memory"}, "surprisegate.arm_order_other"),
    ("a flag as text", {"ground_closed_questions": "yes"}, "surprisegate.ground_closed_questions"),
    ("emit streaming", {"stream": "emit"}, "surprisegate.stream"),
]


@pytest.mark.slow
@pytest.mark.parametrize("settings,param", [c[1:] for c in BOUNDS], ids=[c[0] for c in BOUNDS])
def test_gate_settings_out_of_bounds_are_a_400_naming_them(srv, settings, param):
    extension = {"surprisegate": {"mode": "intervene"} | settings}
    answer = refused_by_client(lambda: ask(srv, USER, extra_body=extension))
    assert_refused(answer, 400, param)
    assert_idle(srv)


@pytest.mark.slow
def test_an_unknown_kind_is_told_the_known_ones(srv):
    extension = {"surprisegate": {"kind_thresholds": {"favourite colour": 1.0}}}
    error = assert_refused(refused_by_client(lambda: ask(srv, USER, extra_body=extension)), 400)
    assert "capital" in error["message"] and "official language" in error["message"]


@pytest.mark.slow
def test_settings_within_bounds_are_served(srv):
    # threshold -64 bits triggers on every window: grounding runs, within the budget.
    settings = {"mode": "intervene", "kind_thresholds": {"capital": -64}, "threshold": 64, "max_rounds": 4}
    r = ask(srv, extra_body={"surprisegate": settings})
    assert "Ouagadougou" in r.choices[0].message.content
    assert receipt_of(r)["config"]["kind_thresholds"] == {"capital": -64.0}


@pytest.mark.slow
def test_a_request_over_the_grounding_budget_is_told_how_to_fit(srv):
    # The red team's: every reply grounds as often as allowed (4 x 10 s of arm and sandbox time).
    attack = {"mode": "intervene", "threshold": -1e308, "max_rounds": 4, "round_deadline_s": 10}
    assert_refused(refused_by_client(lambda: ask(srv, extra_body={"surprisegate": attack})), 400)
    within = {"mode": "intervene", "max_rounds": 4, "round_deadline_s": 10}
    answer = refused_by_client(lambda: ask(srv, extra_body={"surprisegate": within}))
    error = assert_refused(answer, 400, "surprisegate.round_deadline_s", "grounding_budget_exceeded", names="budget")
    assert "8 s" in error["message"] and "40 s" in error["message"]
    assert "round_deadline_s=2 with max_rounds=4" in error["message"]
    # The server's max_rounds (2) x a 10 s deadline is 20 s: over too, though the request set only one.
    one = {"mode": "intervene", "round_deadline_s": 10}
    assert_refused(
        refused_by_client(lambda: ask(srv, extra_body={"surprisegate": one})), 400, code="grounding_budget_exceeded"
    )
    # What the message says fits, fits.
    fit = {"mode": "intervene", "max_rounds": 4, "round_deadline_s": 2}
    r = ask(srv, extra_body={"surprisegate": fit})
    assert "Ouagadougou" in r.choices[0].message.content and grounded_by(receipt_of(r)) == ["memory:country:BF"]


@pytest.mark.slow
def test_the_operator_sets_the_budget(srv):
    settings = srv.state.settings
    before = settings.limits
    settings.limits = dataclasses.replace(before, max_grounding_s=40.0)
    try:
        r = ask(srv, extra_body={"surprisegate": {"mode": "intervene", "max_rounds": 4, "round_deadline_s": 10}})
        assert "Ouagadougou" in r.choices[0].message.content
    finally:
        settings.limits = before


# --------------------------------------------------------------------------------------------------
# 8. a client's system turns: appended after the server's prompt by default, or replace it, or refused
# --------------------------------------------------------------------------------------------------
OWN = "Answer with the city's name."
BRIEF = {"max_tokens": 4, "extra_body": {"surprisegate": {"mode": "off"}}}  # only the chat it was given is read


@pytest.mark.slow
def test_by_default_the_servers_prompt_stays_first_and_the_clients_follows(srv):
    server_prompt = srv.runtime.config.system_prompt
    assert server_prompt and srv.state.settings.limits.client_system == "append"
    r = ask(srv, [{"role": "system", "content": OWN}, {"role": "user", "content": BURKINA}], extra_body=INTERVENE)
    assert "Ouagadougou" in r.choices[0].message.content
    assert seen_by_model(srv, r) == [
        {"role": "system", "content": f"{server_prompt}\n\n{OWN}"},
        {"role": "user", "content": BURKINA},
    ]
    # A developer turn is a system turn; several, anywhere: one system turn, the server's text first.
    chat_ = [
        {"role": "developer", "content": "One."},
        {"role": "user", "content": "Hi?"},
        {"role": "assistant", "content": "Hello."},
        {"role": "system", "content": "Two."},
        {"role": "user", "content": BURKINA},
    ]
    seen = seen_by_model(srv, ask(srv, chat_, **BRIEF))
    assert seen[0] == {"role": "system", "content": f"{server_prompt}\n\nOne.\n\nTwo."}
    assert [m["role"] for m in seen] == ["system", "user", "assistant", "user"]
    # No client system turn: the server's prompt alone.
    assert seen_by_model(srv, ask(srv, **BRIEF))[0] == {"role": "system", "content": server_prompt}


@pytest.mark.slow
def test_the_operator_may_let_a_clients_system_turn_replace_the_servers(srv):
    with policy(srv, "replace"):
        r = ask(
            srv, [{"role": "developer", "content": OWN}, {"role": "user", "content": BURKINA}], extra_body=INTERVENE
        )
        assert seen_by_model(srv, r) == [{"role": "system", "content": OWN}, {"role": "user", "content": BURKINA}]
        assert "Ouagadougou" in r.choices[0].message.content
        seen = seen_by_model(srv, ask(srv, **BRIEF))  # none sent: the server's stands
        assert seen[0] == {"role": "system", "content": srv.runtime.config.system_prompt}


@pytest.mark.slow
def test_the_operator_may_refuse_client_system_turns(srv):
    with policy(srv, "refuse"):
        for role in ("system", "developer"):
            messages = [{"role": "user", "content": "Hi?"}, {"role": role, "content": OWN}, USER[0]]
            answer = refused_by_client(lambda m=messages: ask(srv, m))
            error = assert_refused(answer, 400, "messages[1].role", "system_turn_refused", names="messages[1]")
            assert "system prompt" in error["message"]
            assert_idle(srv)
        r = ask(srv, extra_body=INTERVENE)
        assert "Ouagadougou" in r.choices[0].message.content
        assert seen_by_model(srv, r)[0] == {"role": "system", "content": srv.runtime.config.system_prompt}


# --------------------------------------------------------------------------------------------------
# afterwards
# --------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_no_attack_made_a_500_and_the_server_is_idle(srv):
    metrics = http_get(srv, "/metrics").decode()
    lines = [line for line in metrics.splitlines() if line.startswith("surprisegate_requests_total{")]
    assert lines and not [line for line in lines if 'status="5' in line], lines
    assert any('status="400"' in line for line in lines)
    health = json.loads(http_get(srv, "/health"))
    assert health["active"] == 0 and health["queued"] == 0


def http_get(srv, path: str) -> bytes:
    connection = http.client.HTTPConnection(srv.host, srv.port, timeout=60)
    try:
        connection.request("GET", path, headers={"Authorization": f"Bearer {KEY}"})
        return connection.getresponse().read()
    finally:
        connection.close()
