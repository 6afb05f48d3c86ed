"""The second-model tier: the gate on a model of another family than the embedded one (Qwen2.5-Coder-0.5B:
ChatML template, 151,936-token vocabulary), so that nothing passes only because it was shaped on SmolLM2.

The backend contract runs on it in tests/test_backend_contract.py (`llamacpp-second-model`); here: what the
model's own GGUF decides (stop tokens, special tokens, chat template), a gated reply end to end through the
CLI as a user with their own model runs it, and `serve` on it with the official openai client. Skipped, with
the reason, where `make second-model` has not fetched it.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from test_e2e import factkb_memory, sg  # noqa: F401 - factkb_memory is a fixture

pytestmark = pytest.mark.slow

QUESTION = "What is the capital of Burkina Faso?"


def test_its_stop_and_special_tokens_come_from_its_own_gguf(second_backend):
    (im_end,) = second_backend.tokenize("<|im_end|>", special=True)
    assert im_end in second_backend.eos_token_ids  # ChatML's end of turn ends a reply
    assert len(second_backend.tokenize("<|im_end|>")) > 1  # as text it is text
    assert second_backend.n_vocab > 150_000  # not the embedded model's 49,152


def test_its_chat_template_is_its_own(second_backend):
    prompt = second_backend.chat_prompt([{"role": "user", "content": "Hi"}])
    assert prompt.rstrip().endswith("<|im_start|>assistant")
    assert "<|im_start|>user\nHi<|im_end|>" in prompt


def ask(home, model, *args, env_extra=None):
    out = sg("ask", "--json", "--model", str(model), *args, home=home, env_extra=env_extra, timeout=600)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout), out.stderr


def test_without_a_calibration_it_runs_detect_and_says_how_to_calibrate(second_model, factkb_memory):  # noqa: F811
    home, store = factkb_memory
    reply, said = ask(home, second_model, "--mode", "intervene", "--memory", str(store), QUESTION)
    assert "no calibration for" in said and "surprisegate calibrate --backend llamacpp --model" in said
    assert all(r["action"] != "rewound" for r in reply["rounds"])


def test_a_gated_reply_grounds_and_rewrites_the_capital(second_model, factkb_memory):  # noqa: F811
    home, store = factkb_memory
    off, _ = ask(home, second_model, "--mode", "off", "--memory", str(store), QUESTION)
    # A threshold the user gives stands for a calibration (the calibration itself: test_calibrate_* below).
    on, _ = ask(
        home,
        second_model,
        "--mode",
        "intervene",
        "--memory",
        str(store),
        QUESTION,
        env_extra={"SURPRISEGATE_THRESHOLD": "1.0"},
    )
    assert "Ouagadougou" not in off["reply"]
    assert "Ouagadougou" in on["reply"]
    rewound = [r for r in on["rounds"] if r["action"] == "rewound"]
    assert rewound and rewound[0]["chosen"]["source"] == "memory:country:BF"
    lines = [json.loads(line) for line in open(on["receipt"], encoding="utf-8")]
    receipt = next(r for r in lines if r["reply_id"] == on["receipt_id"])
    assert receipt["config"]["mode"] == "intervene" and receipt["model"].endswith(second_model.name)


@pytest.fixture(scope="module")
def second_server(second_model, tmp_path_factory):
    from test_serve import real_server

    # A given threshold stands for a calibration here too; two sessions: batched decoding on this model.
    srv = real_server(tmp_path_factory, {"model": str(second_model), "threshold": 1.0})
    yield srv
    srv.stop()


def test_serve_on_it_grounds_the_capital_through_the_official_client(second_server):
    from test_serve import INTERVENE, LN2, client, grounded_by, receipt_of

    model = client(second_server).models.list().data[0].id
    assert model == second_server.runtime.backend.model_id.rsplit("/", 1)[-1].removesuffix(".gguf")
    plain = client(second_server).chat.completions.create(
        model=model, messages=[{"role": "user", "content": QUESTION}], logprobs=True, extra_body=INTERVENE
    )
    receipt = receipt_of(plain)
    assert "Ouagadougou" in plain.choices[0].message.content and grounded_by(receipt) == ["memory:country:BF"]
    surprises = receipt["extra"]["token_surprises"]
    assert [t.logprob for t in plain.choices[0].logprobs.content] == pytest.approx([-s * LN2 for s in surprises])
    chunks = list(
        client(second_server).chat.completions.create(
            model=model, messages=[{"role": "user", "content": QUESTION}], stream=True, extra_body=INTERVENE
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == plain.choices[0].message.content  # streamed with holdback: the rewound words never shown


WORD_PROBLEM = (
    "Paige had 43 math problems and 12 science problems for homework. If she finished 44 of the problems at "
    "school, how many problems did she have to do for homework?"
)


def test_a_word_problem_is_grounded_by_the_program_it_writes(second_model, factkb_memory):  # noqa: F811
    home, _ = factkb_memory
    env = {"SURPRISEGATE_THRESHOLD": "1.0"}
    on, _ = ask(home, second_model, "--mode", "intervene", "--memory", "none", WORD_PROBLEM, env_extra=env)
    rewound = [r for r in on["rounds"] if r["action"] == "rewound"]
    assert rewound and rewound[0]["chosen"]["source"] == "tool:program", on["rounds"]
    assert rewound[0]["chosen"]["claim"].endswith("= 11")  # the calculator ran the model's own setup
    assert "11" in on["reply"]


# ------------------------------------------------------------------------------------------ tool calls (issue 44)
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city, e.g. it's sunny & <hot> in Zürich",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
PARIS = [{"role": "user", "content": "What's the weather like in Paris right now?"}]


def a_call_round(call_id: str = "call_1") -> list[dict]:
    return [
        *PARIS,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call_id, "content": "18 C and cloudy"},
    ]


@pytest.fixture(scope="module")
def qwen_llama_server(second_model, tmp_path_factory):
    """llama.cpp's own server on the second model: the reference for how tools render and calls parse."""
    from surprisegate.backends.llama_server import LlamaServerProcess, find_llama_server

    binary = find_llama_server()
    if binary is None:
        pytest.skip("llama-server is not built: run `make llama-server`")
    log = tmp_path_factory.mktemp("ls") / "server.log"
    process = LlamaServerProcess(second_model, binary=binary, n_ctx=4096, parallel=1, log_path=log)
    process.start()
    yield f"http://{process.host}:{process.port}"
    process.stop()


def test_tools_and_tool_turns_render_byte_for_byte_as_llama_cpps_server_renders_them(second_backend, qwen_llama_server):
    import httpx

    for messages in (PARIS, a_call_round(), [{"role": "system", "content": "Be brief."}, *a_call_round()]):
        theirs = httpx.post(qwen_llama_server + "/apply-template", json={"messages": messages, "tools": [WEATHER_TOOL]})
        ours = second_backend.chat_prompt(
            [m | {"content": m["content"] or ""} for m in messages], True, tools=[WEATHER_TOOL]
        )
        assert ours == theirs.json()["prompt"]


def test_a_forced_call_parses_as_llama_cpps_server_parses_the_same_continuation(second_server, qwen_llama_server):
    """tool_choice required: serve opens the call; llama.cpp's server continues the same opening (a final
    assistant message) and parses it. The calls are the same (scripts/tool_calls_vs_llama_server.py: 20 prompts)."""
    import httpx

    from surprisegate.gate.tools import HERMES
    from test_serve import client

    model = client(second_server).models.list().data[0].id
    for question in ("What's the weather like in Paris right now?", "Is it raining in London today?"):
        user = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": question}]
        ours = client(second_server).chat.completions.create(
            model=model,
            messages=user,
            tools=[WEATHER_TOOL],
            tool_choice="required",
            temperature=0,
            extra_body={"surprisegate": {"mode": "intervene", "threshold": 1.0}},
        )
        prefill = [*user, {"role": "assistant", "content": HERMES.opening()}]
        body = {"messages": prefill, "tools": [WEATHER_TOOL], "temperature": 0, "cache_prompt": False}
        theirs = httpx.post(qwen_llama_server + "/v1/chat/completions", json=body, timeout=300).json()
        ours_calls = [(c.function.name, json.loads(c.function.arguments)) for c in ours.choices[0].message.tool_calls]
        their_calls = [
            (c["function"]["name"], json.loads(c["function"]["arguments"]))
            for c in theirs["choices"][0]["message"]["tool_calls"]
        ]
        assert ours_calls == their_calls and ours.choices[0].finish_reason == "tool_calls"
        scored = ours.model_extra["surprisegate"]["receipt"]["extra"]["tool_calls"][0]
        assert scored["name"] == "get_weather" and scored["tokens"] > 3 and scored["surprise_max"] is not None


def test_an_agent_loop_of_two_steps_through_the_official_client(second_server):
    """Step one calls the tool (forced, as agent kits force a named tool), step two answers from its result;
    the call also streams as a tool_calls delta, and the SDK's stream helper keeps it."""
    from test_serve import client

    c = client(second_server)
    model = c.models.list().data[0].id
    named = {"type": "function", "function": {"name": "get_weather"}}
    first = c.chat.completions.create(model=model, messages=PARIS, tools=[WEATHER_TOOL], tool_choice=named)
    (call,) = first.choices[0].message.tool_calls
    assert call.function.name == "get_weather" and "Paris" in json.loads(call.function.arguments)["city"]
    turns = [*PARIS, first.choices[0].message.model_dump(exclude_none=True)]
    turns.append({"role": "tool", "tool_call_id": call.id, "content": "18 C and cloudy"})
    second = c.chat.completions.create(model=model, messages=turns, tools=[WEATHER_TOOL], max_tokens=48)
    assert second.choices[0].message.content and not second.choices[0].message.tool_calls
    assert second.model_extra["surprisegate"]["receipt"]["extra"]["tools"]["offered"] == ["get_weather"]
    chunks = list(
        c.chat.completions.create(model=model, messages=PARIS, tools=[WEATHER_TOOL], tool_choice=named, stream=True)
    )
    deltas = [t for ch in chunks if ch.choices for t in (ch.choices[0].delta.tool_calls or [])]
    assert [d.function.name for d in deltas] == ["get_weather"] and deltas[0].index == 0 and deltas[0].id
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == "tool_calls"
    with c.chat.completions.stream(model=model, messages=PARIS, tools=[WEATHER_TOOL], tool_choice=named) as s:
        final = s.get_final_completion()
    assert final.choices[0].message.tool_calls[0].function.name == "get_weather"


def test_the_context_check_counts_the_tools_in_the_prompt(second_backend):
    from surprisegate.config import Config
    from surprisegate.gate.tools import HERMES, ToolUse
    from surprisegate.serve.gate import check_context
    from surprisegate.serve.wire import ApiError, GateRequest

    plain = len(second_backend.tokenize(second_backend.chat_prompt(PARIS), special=True))
    offered = len(second_backend.tokenize(second_backend.chat_prompt(PARIS, tools=[WEATHER_TOOL]), special=True))
    n_ctx = second_backend.n_ctx
    # max_tokens that fits the chat alone but not with the tools' definitions in the prompt
    config = Config(max_tokens=n_ctx - (plain + offered) // 2, system_prompt="")
    request = GateRequest("chat", PARIS, config)
    check_context(second_backend, request)
    with pytest.raises(ApiError, match="over the model's context"):
        check_context(second_backend, replace(request, tool_use=ToolUse((WEATHER_TOOL,), HERMES)))


def test_tool_calls_through_llama_cpps_server_match_the_in_process_ones(
    second_server, qwen_llama_server, tmp_path_factory
):
    """serve -> llama.cpp's server: tools rendered with the server's template here, forced calls under the
    server's own grammar sampler; the calls are the in-process server's, auto and forced."""
    from test_serve import client, real_server

    host_port = qwen_llama_server.removeprefix("http://")
    proxy = real_server(tmp_path_factory, {"backend": f"llama-server://{host_port}", "threshold": 1.0})
    try:
        named = {"type": "function", "function": {"name": "get_weather"}}
        calls = []
        for srv in (second_server, proxy):
            c = client(srv)
            model = c.models.list().data[0].id
            auto = c.chat.completions.create(model=model, messages=PARIS, tools=[WEATHER_TOOL], max_tokens=64)
            forced = c.chat.completions.create(model=model, messages=PARIS, tools=[WEATHER_TOOL], tool_choice=named)
            calls.append(
                [
                    [(t.function.name, json.loads(t.function.arguments)) for t in r.choices[0].message.tool_calls or []]
                    for r in (auto, forced)
                ]
            )
        here, there = calls
        assert there[1] and there[1][0][0] == "get_weather" and "Paris" in there[1][0][1]["city"]
        assert here == there
    finally:
        proxy.stop()


def test_an_agent_loop_of_two_steps_through_the_responses_api(second_server):
    """OpenAI's Responses API, as agent kits call it: function tools, a forced call as a function_call item,
    its output sent back as a function_call_output item, then the answer; streamed as typed events too."""
    from test_serve import client

    c = client(second_server)
    model = c.models.list().data[0].id
    weather = {"type": "function", **WEATHER_TOOL["function"]}
    asked = [{"role": "user", "content": PARIS[0]["content"]}]
    first = c.responses.create(
        model=model, input=asked, tools=[weather], tool_choice={"type": "function", "name": "get_weather"}
    )
    (call,) = [item for item in first.output if item.type == "function_call"]
    assert call.name == "get_weather" and "Paris" in json.loads(call.arguments)["city"] and call.call_id
    assert first.status == "completed" and first.tools[0].name == "get_weather"
    done = [{"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments}]
    done.append({"type": "function_call_output", "call_id": call.call_id, "output": "18 C and cloudy"})
    second = c.responses.create(model=model, input=asked + done, tools=[weather], max_output_tokens=48)
    assert second.output_text and not [item for item in second.output if item.type == "function_call"]
    receipt = second.model_extra["surprisegate"]["receipt"]
    assert [m["role"] for m in receipt["messages"]][-2:] == ["assistant", "tool"]
    with c.responses.stream(model=model, input=asked, tools=[weather], tool_choice="required") as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    assert "response.function_call_arguments.done" in kinds and kinds[-1] == "response.completed"
    assert [item.type for item in final.output] == ["message", "function_call"]
    assert final.output[1].name == "get_weather"
