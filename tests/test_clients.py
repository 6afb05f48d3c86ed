"""The real-clients tier (issue 44): the clients applications use, driven against a real `serve`.

The `openai` SDK (sync and async, chat, completions, responses), LangChain's ChatOpenAI, LlamaIndex's
OpenAILike, litellm and the `llm` CLI (the `clients` extra; `make test` installs it). Each does a chat, a
stream and a two-turn conversation and reads the reply's receipt back (in the body where the client keeps
unknown fields, else by id from the X-Surprisegate-Receipt header over GET /v1/receipts/{id}). Tool calls
run on the second model (its template offers tools): LangChain's bind_tools in an agent loop of two steps,
LlamaIndex's chat_with_tools and litellm. Structured output (a Pydantic schema) runs on both real models: the
SDK's `parse`, LangChain's `with_structured_output` (json_schema and json_mode), litellm, and LlamaIndex's
`structured_predict` (through tool calls, on the second model). Tools on a model whose template has none, and
JSON output through a backend that takes no grammar, are refused with a 400 that names it: the
client raises and the message says so. A scripted server keeps most of them fast; the slow tests run the embedded model
with the gate on by default (so clients that cannot send the `surprisegate` extension are gated too).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from test_serve import MODEL, scripted_runtime, start

langchain_openai = pytest.importorskip("langchain_openai", reason="the clients extra: pip install -e '.[clients]'")
openai_like = pytest.importorskip("llama_index.llms.openai_like", reason="the clients extra")
litellm = pytest.importorskip("litellm", reason="the clients extra")

from langchain_core.messages import AIMessage, HumanMessage  # noqa: E402
from llama_index.core.llms import ChatMessage  # noqa: E402
from pydantic import BaseModel  # noqa: E402

KEY = "clients-key"
ASKED = "What is two plus two?"


def answer(question: str) -> str:
    return f"You asked: {question}. Done."  # the scripted server's reply (test_serve.echo)


@pytest.fixture(scope="module")
def server():
    srv = start(scripted_runtime(), api_key=KEY, receipts=None)
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def keeping(tmp_path_factory):
    """The same with receipts kept, so they can be read back by id."""
    from surprisegate.serve.gate import RotatingReceipts

    srv = start(scripted_runtime(), api_key=KEY, receipts=RotatingReceipts(tmp_path_factory.mktemp("c") / "r.jsonl"))
    yield srv
    srv.stop()


def receipt_by_id(srv, reply_id: str) -> dict:
    r = httpx.get(f"{srv.url}/v1/receipts/{reply_id}", headers={"authorization": f"Bearer {KEY}"})
    assert r.status_code == 200, r.text
    return r.json()


# ------------------------------------------------------------------------------------------ LangChain
def chat_model(srv, **kw):
    return langchain_openai.ChatOpenAI(
        model=MODEL, base_url=srv.url + "/v1", api_key=KEY, max_retries=0, timeout=120, **kw
    )


def test_langchain_chat_stream_two_turns_and_the_receipt(keeping):
    llm = chat_model(keeping, include_response_headers=True)
    reply = llm.invoke(ASKED)
    assert reply.content == answer(ASKED)
    receipt = receipt_by_id(keeping, reply.response_metadata["headers"]["x-surprisegate-receipt"])
    assert receipt["reply"] == reply.content
    streamed = "".join(chunk.content for chunk in llm.stream("Stream it?"))
    assert streamed == answer("Stream it?")
    turns = [HumanMessage("Hi?"), AIMessage(answer("Hi?")), HumanMessage("Again?")]
    assert llm.invoke(turns).content == answer("Again?")
    assert asyncio.run(llm.ainvoke(ASKED)).content == answer(ASKED)


def test_langchain_tools_on_a_model_without_them_and_structured_output_are_refused_by_name(server):
    import openai

    def weather(city: str) -> str:
        """The weather in a city."""
        return "sunny"

    # The scripted model has no tool template: the 400 names the model and what to serve instead.
    with pytest.raises(openai.BadRequestError, match="tools or tool turns|tool calls this server can read"):
        chat_model(server).bind_tools([weather]).invoke("Weather in Paris?")
    # Nor can it decode under a grammar: JSON output gets a 400 that says where it is served.
    with pytest.raises(openai.BadRequestError, match="takes no grammar here"):
        chat_model(server).with_structured_output({"title": "City", "type": "object", "properties": {}}).invoke("x")


# ------------------------------------------------------------------------------------------ LlamaIndex
def test_llamaindex_openailike_chat_stream_two_turns_and_the_receipt(server):
    llm = openai_like.OpenAILike(
        model=MODEL, api_base=server.url + "/v1", api_key=KEY, is_chat_model=True, max_retries=0, timeout=120
    )
    reply = llm.chat([ChatMessage(role="user", content=ASKED)])
    assert reply.message.content == answer(ASKED)
    assert reply.raw.model_extra["surprisegate"]["receipt"]["reply"] == answer(ASKED)  # the SDK object kept whole
    streamed = [r.delta for r in llm.stream_chat([ChatMessage(role="user", content="Stream it?")])]
    assert "".join(d or "" for d in streamed) == answer("Stream it?")
    turns = [
        ChatMessage(role="user", content="Hi?"),
        ChatMessage(role="assistant", content=answer("Hi?")),
        ChatMessage(role="user", content="Again?"),
    ]
    assert llm.chat(turns).message.content == answer("Again?")
    assert llm.complete("Complete me?").text == answer("Complete me?")


# ------------------------------------------------------------------------------------------ litellm
def test_litellm_chat_stream_and_the_receipt(keeping):
    common = {"model": f"openai/{MODEL}", "api_base": keeping.url + "/v1", "api_key": KEY}
    reply = litellm.completion(messages=[{"role": "user", "content": ASKED}], **common)
    assert reply.choices[0].message.content == answer(ASKED)
    headers = reply._hidden_params.get("additional_headers") or {}
    reply_id = next(v for k, v in headers.items() if k.lower().endswith("x-surprisegate-receipt"))
    assert receipt_by_id(keeping, reply_id)["reply"] == answer(ASKED)
    stream = litellm.completion(messages=[{"role": "user", "content": "Stream it?"}], stream=True, **common)
    assert "".join(c.choices[0].delta.content or "" for c in stream) == answer("Stream it?")
    turns = [
        {"role": "user", "content": "Hi?"},
        {"role": "assistant", "content": answer("Hi?")},
        {"role": "user", "content": "Again?"},
    ]
    assert litellm.completion(messages=turns, **common).choices[0].message.content == answer("Again?")


# ------------------------------------------------------------------------------------------ the llm CLI
def run_llm(srv, tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    """`llm` with an extra-openai-models.yaml pointing at the server (its documented way to add one)."""
    (tmp_path / "extra-openai-models.yaml").write_text(
        f"- model_id: gate\n  model_name: {MODEL}\n  api_base: {srv.url}/v1\n  api_key_name: gate\n"
    )
    (tmp_path / "keys.json").write_text(json.dumps({"gate": KEY}))
    env = os.environ | {"LLM_USER_PATH": str(tmp_path)}
    cli = Path(sys.executable).with_name("llm")
    return subprocess.run([str(cli), *args], capture_output=True, text=True, env=env, timeout=120)


def test_the_llm_cli_prompts_streams_and_continues_a_conversation(server, tmp_path):
    done = run_llm(server, tmp_path, "-m", "gate", ASKED)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == answer(ASKED)
    done = run_llm(server, tmp_path, "-m", "gate", "--no-stream", "Again?")
    assert done.stdout.strip() == answer("Again?")
    follow = run_llm(server, tmp_path, "-c", "And now?")  # -c: the last conversation, sent as turns
    assert follow.returncode == 0, follow.stderr
    assert follow.stdout.strip() == answer("And now?")


# ------------------------------------------------------------------------------------------ the real model
@pytest.fixture(scope="module")
def gated(tmp_path_factory):
    from test_serve import real_server

    srv = real_server(tmp_path_factory, {"mode": "intervene"})  # gated by default: no extension needed
    yield srv
    srv.stop()


BURKINA = "What is the capital of Burkina Faso?"


@pytest.mark.slow
def test_every_client_gets_the_grounded_answer_from_the_embedded_model(gated, tmp_path):
    model = httpx.get(gated.url + "/v1/models").json()["data"][0]["id"]
    lc = langchain_openai.ChatOpenAI(model=model, base_url=gated.url + "/v1", api_key="unused", max_retries=0)
    assert "Ouagadougou" in lc.invoke(BURKINA).content
    li = openai_like.OpenAILike(model=model, api_base=gated.url + "/v1", api_key="unused", is_chat_model=True)
    reply = li.chat([ChatMessage(role="user", content=BURKINA)])
    assert "Ouagadougou" in reply.message.content
    assert reply.raw.model_extra["surprisegate"]["receipt"]["rounds"]
    lite = litellm.completion(
        model=f"openai/{model}",
        api_base=gated.url + "/v1",
        api_key="unused",
        messages=[{"role": "user", "content": BURKINA}],
    )
    assert "Ouagadougou" in lite.choices[0].message.content
    (tmp_path / "extra-openai-models.yaml").write_text(
        f"- model_id: gate\n  model_name: {model}\n  api_base: {gated.url}/v1\n"
    )
    env = os.environ | {"LLM_USER_PATH": str(tmp_path), "OPENAI_API_KEY": "unused"}
    cli = Path(sys.executable).with_name("llm")
    done = subprocess.run([str(cli), "-m", "gate", BURKINA], capture_output=True, text=True, env=env, timeout=300)
    assert "Ouagadougou" in done.stdout, done.stderr


class Capital(BaseModel):
    country: str
    capital: str


def check_capital(value: Capital | dict, capital: str = "Ouagadougou") -> None:
    value = value if isinstance(value, Capital) else Capital.model_validate(value)
    assert capital in value.capital, value


@pytest.mark.slow
def test_structured_output_from_every_client_is_grounded_on_the_embedded_model(gated):
    import openai

    model = httpx.get(gated.url + "/v1/models").json()["data"][0]["id"]
    sdk = openai.OpenAI(base_url=gated.url + "/v1", api_key="unused", max_retries=0)
    reply = sdk.chat.completions.parse(
        model=model, messages=[{"role": "user", "content": BURKINA}], response_format=Capital
    )
    check_capital(reply.choices[0].message.parsed)
    receipt = reply.model_extra["surprisegate"]["receipt"]
    assert receipt["extra"]["response_format"]["parses"] and receipt["rounds"]
    with sdk.chat.completions.stream(
        model=model, messages=[{"role": "user", "content": BURKINA}], response_format=Capital
    ) as stream:
        check_capital(stream.get_final_completion().choices[0].message.parsed)
    lc = langchain_openai.ChatOpenAI(model=model, base_url=gated.url + "/v1", api_key="unused", max_retries=0)
    check_capital(lc.with_structured_output(Capital, method="json_schema").invoke(BURKINA))
    as_json = lc.with_structured_output(None, method="json_mode").invoke(BURKINA + " Answer with country and capital.")
    assert isinstance(as_json, dict)  # any object: json_mode sends no schema
    lite = litellm.completion(
        model=f"openai/{model}",
        api_base=gated.url + "/v1",
        api_key="unused",
        messages=[{"role": "user", "content": BURKINA}],
        response_format=Capital,
    )
    check_capital(json.loads(lite.choices[0].message.content))
    response = sdk.responses.parse(model=model, input=BURKINA, text_format=Capital)
    check_capital(response.output_parsed)


# ------------------------------------------------------------------------------------------ tools on the second model
@pytest.fixture(scope="module")
def qwen(second_model, tmp_path_factory):
    from test_serve import real_server

    srv = real_server(tmp_path_factory, {"model": str(second_model), "threshold": 1.0})
    yield srv
    srv.stop()


def get_weather(city: str) -> str:
    """Get the current weather in a city."""
    return f"18 C and cloudy in {city}"


@pytest.mark.slow
def test_langchain_binds_tools_and_runs_an_agent_loop_of_two_steps(qwen):
    from langchain_core.messages import ToolMessage

    model = httpx.get(qwen.url + "/v1/models").json()["data"][0]["id"]
    lc = langchain_openai.ChatOpenAI(model=model, base_url=qwen.url + "/v1", api_key="unused", max_retries=0)
    asked = HumanMessage("What's the weather like in Paris right now?")
    first = lc.bind_tools([get_weather], tool_choice="get_weather").invoke([asked])
    (call,) = first.tool_calls
    assert call["name"] == "get_weather" and "Paris" in call["args"]["city"]
    answer = ToolMessage(get_weather(**call["args"]), tool_call_id=call["id"])
    second = lc.bind_tools([get_weather]).invoke([asked, first, answer])
    assert second.content and not second.tool_calls
    streamed = list(lc.bind_tools([get_weather], tool_choice="get_weather").stream([asked]))
    whole = streamed[0]
    for piece in streamed[1:]:
        whole += piece
    assert [c["name"] for c in whole.tool_calls] == ["get_weather"]


@pytest.mark.slow
def test_llamaindex_and_litellm_get_the_tool_call(qwen):
    from llama_index.core.tools import FunctionTool

    model = httpx.get(qwen.url + "/v1/models").json()["data"][0]["id"]
    li = openai_like.OpenAILike(
        model=model, api_base=qwen.url + "/v1", api_key="unused", is_chat_model=True, is_function_calling_model=True
    )
    reply = li.chat_with_tools(
        [FunctionTool.from_defaults(get_weather)], user_msg="Weather in Rome?", tool_required=True
    )
    (selection,) = li.get_tool_calls_from_response(reply, error_on_no_tool_call=True)
    assert selection.tool_name == "get_weather" and "Rome" in selection.tool_kwargs["city"]
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
    lite = litellm.completion(
        model=f"openai/{model}",
        api_base=qwen.url + "/v1",
        api_key="unused",
        messages=[{"role": "user", "content": "Weather in Oslo?"}],
        tools=[tool],
        tool_choice="required",
    )
    assert lite.choices[0].message.tool_calls[0].function.name == "get_weather"


@pytest.mark.slow
def test_structured_output_on_the_second_model_by_schema_and_through_tools(qwen):
    from llama_index.core.prompts import PromptTemplate

    model = httpx.get(qwen.url + "/v1/models").json()["data"][0]["id"]
    gated = {"surprisegate": {"mode": "intervene"}}  # this server's default mode does not ground
    lc = langchain_openai.ChatOpenAI(
        model=model, base_url=qwen.url + "/v1", api_key="unused", max_retries=0, extra_body=gated
    )
    check_capital(lc.with_structured_output(Capital, method="json_schema").invoke(BURKINA))
    li = openai_like.OpenAILike(
        model=model, api_base=qwen.url + "/v1", api_key="unused", is_chat_model=True, is_function_calling_model=True
    )
    value = li.structured_predict(Capital, PromptTemplate("Which country and capital: {q}"), q="Peru, capital Lima")
    assert isinstance(value, Capital) and "Lima" in value.capital
