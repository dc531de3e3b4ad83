"""The agent harnesses' own client libraries against the gateway in front of
real vLLM-CPU workers (the session's cluster: wA prefill, wB decode).

openai (sync, async, `parse()`, streamed tools, n and logprobs), the OpenAI
Agents SDK on its default (Responses API) model, anthropic (messages,
streaming, a forced tool), langchain-openai (`bind_tools` with "any" and a
named tool, `with_structured_output` in its three methods) and a LangGraph
prebuilt agent with a tool.

The demo model's weights are random, so these assert that the request was
honoured, not what the text means: JSON that validates against its schema
(bounded strings and numbers, so the random model can close it within
max_tokens), a tool call with schema-valid arguments where one is required,
n choices, one logprob entry per token. `json_object` and unbounded values
may never close on this model: there the output so far must be a valid JSON
prefix. Prompts are longer than the gateway's local-prefill bound, so
requests go prefill (wA) -> decode (wB): constrained ones are replayed on
the decode node (gateway.serving.segments).
"""

from __future__ import annotations

import json
from typing import Annotated, Any

import anthropic
import openai
import pytest
from anthropic.types import MessageParam, TextBlockParam, ToolParam, ToolUseBlock
from openai.types.chat import ChatCompletionFunctionToolParam, ChatCompletionMessageParam
from openai.types.shared_params import ResponseFormatJSONSchema
from pydantic import BaseModel, Field

from testing.json_prefix import is_complete_json, is_json_prefix
from testing.live_gateway import running_gateway

pytestmark = pytest.mark.vllm
MODEL = "demo-model"
SYSTEM = "You are a careful agent. " + " ".join(f"Rule {i}: answer with tools when asked." for i in range(12))


class Person(BaseModel):
    """A person, bounded so the random model can finish it."""

    name: str = Field(max_length=10)
    age: int = Field(ge=0, le=120)


# Room for a name of ten escaped characters (a random model's \uXXXX runs take ~6 tokens each),
# greedy: the streamed and the plain run must parse the same way every time.
PERSON_MAX_TOKENS, PERSON_TEMPERATURE = 256, 0.0

PERSON_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 10},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}
ADD_PARAMS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "a": {"type": "integer", "minimum": 0, "maximum": 99},
        "b": {"type": "integer", "minimum": 0, "maximum": 99},
    },
    "required": ["a", "b"],
    "additionalProperties": False,
}
ADD_TOOL: ChatCompletionFunctionToolParam = {
    "type": "function",
    "function": {"name": "add", "description": "Add two numbers.", "parameters": ADD_PARAMS},
}


def _messages(question: str) -> list[ChatCompletionMessageParam]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]


def _lc_messages(question: str) -> list[dict[str, Any]]:
    """`_messages` as LangChain takes them (plain dicts)."""
    return [dict(m) for m in _messages(question)]


@pytest.fixture(scope="module")
def gateway(vllm_cluster, demo_model):
    from agents.models import get_default_model

    vllm_cluster.phases(wA="prefill", wB="decode")
    with running_gateway(
        demo_model,
        [vllm_cluster.url("wA"), vllm_cluster.url("wB")],
        local_prefill_max_tokens=16,
        # LangChain and the Agents SDK's tools are not all `strict`: constrain every call's arguments
        tool_strict_level="parameter",
        model_aliases=(get_default_model(),),
    ) as (url, _app):
        yield url
    vllm_cluster.phases(wA="prefill", wB="decode")


def _client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="sk-local", max_retries=0, timeout=300)


def _valid_add(arguments: str | dict[str, Any]) -> dict[str, Any]:
    args = json.loads(arguments) if isinstance(arguments, str) else arguments
    assert is_complete_json(json.dumps(args), ADD_PARAMS), args
    return args


# -- openai -----------------------------------------------------------------------
def test_openai_parse_gives_a_schema_valid_object(gateway):
    client = _client(gateway)
    for seed in (1, 2):
        r = client.chat.completions.parse(
            model=MODEL, messages=_messages("Who?"), response_format=Person, max_tokens=64, seed=seed
        )
        choice = r.choices[0]
        assert choice.finish_reason == "stop", choice
        assert isinstance(choice.message.parsed, Person)
        assert is_complete_json(choice.message.content or "", Person.model_json_schema())


def test_openai_json_object_output_is_json_so_far(gateway):
    r = _client(gateway).chat.completions.create(
        model=MODEL, messages=_messages("JSON please"), response_format={"type": "json_object"}, max_tokens=24, seed=4
    )
    text = r.choices[0].message.content or ""
    assert text.startswith("{") and is_json_prefix(text), text
    assert r.choices[0].finish_reason in ("stop", "length")
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(text), dict)


async def test_openai_async_required_tool_call(gateway):
    client = openai.AsyncOpenAI(base_url=gateway + "/v1", api_key="sk-local", max_retries=0, timeout=300)
    r = await client.chat.completions.create(
        model=MODEL,
        messages=_messages("Add 2 and 3."),
        tools=[ADD_TOOL],
        tool_choice="required",
        parallel_tool_calls=False,
        max_tokens=96,
        seed=3,
    )
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    calls = choice.message.tool_calls or []
    assert len(calls) == 1 and calls[0].type == "function" and calls[0].function.name == "add", calls
    _valid_add(calls[0].function.arguments)


def test_openai_stream_helper_with_a_named_strict_tool(gateway):
    client = _client(gateway)
    tool = openai.pydantic_function_tool(Person, name="record_person")
    with client.chat.completions.stream(
        model=MODEL,
        messages=_messages("Record someone."),
        tools=[tool],
        tool_choice={"type": "function", "function": {"name": "record_person"}},
        max_tokens=96,
        seed=5,
    ) as stream:
        deltas = [e for e in stream if e.type == "tool_calls.function.arguments.delta"]
        final = stream.get_final_completion()
    calls = final.choices[0].message.tool_calls
    assert calls, final
    call = calls[0]
    assert call.function.name == "record_person" and deltas  # arguments arrived as deltas
    assert isinstance(call.function.parsed_arguments, Person)
    assert final.choices[0].finish_reason == "stop"  # a named function: OpenAI's "stop"


def test_openai_n_choices_and_one_logprob_per_token(gateway):
    r = _client(gateway).chat.completions.create(
        model=MODEL, messages=_messages("Say something."), max_tokens=6, n=2, logprobs=True, top_logprobs=3, seed=7
    )
    assert [c.index for c in r.choices] == [0, 1]
    total = 0
    for choice in r.choices:
        assert choice.logprobs is not None and choice.logprobs.content is not None, choice
        entries = choice.logprobs.content
        assert all(len(e.top_logprobs) == 3 and e.logprob <= 0 for e in entries)
        total += len(entries)
    assert r.usage is not None and total == r.usage.completion_tokens


def test_openai_bad_schema_is_a_400_naming_response_format(gateway):
    bad: ResponseFormatJSONSchema = {"type": "json_schema", "json_schema": {"name": "p", "schema": {"type": "objekt"}}}
    with pytest.raises(openai.BadRequestError) as err:
        _client(gateway).chat.completions.create(
            model=MODEL, messages=_messages("x"), max_tokens=4, response_format=bad
        )
    body = err.value.body
    assert isinstance(body, dict), body
    assert body["param"] == "response_format" and "objekt" in body["message"], body
    assert "worker" not in body["message"]


# -- OpenAI Agents SDK (default model: the Responses API) -----------------------
@pytest.fixture
def agents_client(gateway):
    # one client per test: each async test has its own event loop, and a client's
    # pooled connections belong to the loop that opened them ("Event loop is closed")
    from agents import set_default_openai_client, set_tracing_disabled

    set_tracing_disabled(True)
    set_default_openai_client(
        openai.AsyncOpenAI(base_url=gateway + "/v1", api_key="sk-local", max_retries=0, timeout=300),
        use_for_tracing=False,
    )


async def test_agents_sdk_output_type_on_the_default_model(agents_client):
    from agents import Agent, ModelSettings, Runner

    settings = ModelSettings(max_tokens=PERSON_MAX_TOKENS, temperature=PERSON_TEMPERATURE)
    agent = Agent(name="profiler", instructions=SYSTEM, output_type=Person, model_settings=settings)
    result = await Runner.run(agent, "Who is it?")
    assert isinstance(result.final_output, Person)


async def test_agents_sdk_required_tool_call(agents_client):
    from agents import Agent, ModelSettings, Runner, function_tool

    calls: list[tuple[int, int]] = []

    @function_tool
    def add(a: Annotated[int, Field(ge=0, le=99)], b: Annotated[int, Field(ge=0, le=99)]) -> str:
        """Add two numbers."""
        calls.append((a, b))
        return str(a + b)

    agent = Agent(
        name="adder",
        instructions=SYSTEM,
        tools=[add],
        model_settings=ModelSettings(tool_choice="required", max_tokens=96, parallel_tool_calls=False),
        # The run ends with the tool's result: a free-text turn after it would run the random
        # model into max_tokens, which the SDK reports as a failed response. (Chains over
        # previous_response_id with the openai client: test_api_fields.py.)
        tool_use_behavior="stop_on_first_tool",
    )
    result = await Runner.run(agent, "Add 2 and 3.", max_turns=2)
    assert len(calls) == 1 and result.final_output == str(sum(calls[0]))
    assert result.last_response_id


async def test_agents_sdk_streamed_run(agents_client):
    from agents import Agent, ModelSettings, Runner

    settings = ModelSettings(max_tokens=PERSON_MAX_TOKENS, temperature=PERSON_TEMPERATURE)
    agent = Agent(name="streamer", instructions=SYSTEM, output_type=Person, model_settings=settings)
    run = Runner.run_streamed(agent, "Who is it?")
    kinds = {e.type async for e in run.stream_events()}
    assert "raw_response_event" in kinds and isinstance(run.final_output, Person)


# -- anthropic --------------------------------------------------------------------
def _anthropic(url: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=url, api_key="sk-local", max_retries=0, timeout=300)


def test_anthropic_message_and_stream(gateway):
    client = _anthropic(gateway)
    system: list[TextBlockParam] = [{"type": "text", "text": SYSTEM, "cache_control": {"type": "ephemeral"}}]
    msg = client.messages.create(
        model=MODEL,
        max_tokens=12,
        system=system,
        messages=[{"role": "user", "content": "Hello"}],
        extra_body={"temperature": 0},  # this SDK version has no temperature argument
    )
    assert msg.role == "assistant" and msg.stop_reason in ("end_turn", "max_tokens")
    assert msg.usage.output_tokens >= 1 and msg.usage.input_tokens > 0
    with client.messages.stream(
        model=MODEL,
        max_tokens=12,
        system=system,
        messages=[{"role": "user", "content": "Hello"}],
        extra_body={"temperature": 0},  # this SDK version has no temperature argument
    ) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == "".join(b.text for b in msg.content if b.type == "text")  # greedy: the same either way
    # the second time, the system prompt's blocks come from the cache
    assert final.usage.cache_read_input_tokens and final.usage.cache_read_input_tokens > 0


def test_anthropic_forced_tool_and_its_result(gateway):
    client = _anthropic(gateway)
    tools: list[ToolParam] = [{"name": "add", "description": "Add two numbers.", "input_schema": ADD_PARAMS}]
    messages: list[MessageParam] = [{"role": "user", "content": "Add 2 and 3."}]
    msg = client.messages.create(
        model=MODEL,
        max_tokens=96,
        system=SYSTEM,
        tools=tools,
        tool_choice={"type": "tool", "name": "add"},
        messages=messages,
    )
    uses = [b for b in msg.content if isinstance(b, ToolUseBlock)]
    assert msg.stop_reason == "tool_use" and len(uses) == 1 and uses[0].name == "add"
    _valid_add(uses[0].input)
    messages += [
        {"role": "assistant", "content": uses},  # the SDK's own blocks, sent back as its docs show
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": uses[0].id, "content": "5"}]},
    ]
    with client.messages.stream(model=MODEL, max_tokens=8, system=SYSTEM, tools=tools, messages=messages) as stream:
        final = stream.get_final_message()
    assert final.stop_reason in ("end_turn", "max_tokens", "tool_use")


# -- LangChain / LangGraph --------------------------------------------------------
def _chat_model(url: str, **kwargs):
    from langchain_openai import ChatOpenAI

    return ChatOpenAI(
        model=MODEL, base_url=url + "/v1", api_key="sk-local", max_retries=0, timeout=300, max_tokens=96, **kwargs
    )


class AddArgs(BaseModel):
    """The add tool's arguments, bounded so the random model can close them within max_tokens."""

    a: int = Field(ge=0, le=99)
    b: int = Field(ge=0, le=99)


def _lc_add(**kwargs):
    from langchain_core.tools import tool

    @tool(args_schema=AddArgs, **kwargs)
    def add(a: int, b: int) -> int:
        """Add two numbers."""
        return a + b

    return add


@pytest.mark.parametrize("choice", ["any", "add"])
def test_langchain_bind_tools_forces_a_call(gateway, choice):
    model = _chat_model(gateway, seed=11).bind_tools([_lc_add()], tool_choice=choice, parallel_tool_calls=False)
    reply = model.invoke(_lc_messages("Add 2 and 3."))
    assert len(reply.tool_calls) == 1 and reply.tool_calls[0]["name"] == "add", reply
    _valid_add(reply.tool_calls[0]["args"])


@pytest.mark.parametrize("method", ["json_schema", "function_calling"])
def test_langchain_structured_output(gateway, method):
    structured = _chat_model(gateway, seed=12).with_structured_output(Person, method=method)
    assert isinstance(structured.invoke(_lc_messages("Who is it?")), Person)


def test_langchain_json_mode_output_is_json_so_far(gateway):
    # json_mode sends only {"type": "json_object"}: the schema never reaches the model, and the
    # random model rarely closes a free JSON object; what it writes must still be JSON.
    structured = _chat_model(gateway, seed=13, max_completion_tokens=24).with_structured_output(
        Person, method="json_mode", include_raw=True
    )
    try:
        text = structured.invoke(_lc_messages("Who is it? Answer in JSON."))["raw"].content
    except openai.LengthFinishReasonError as exc:  # the openai client refuses to parse a cut-off answer
        text = exc.completion.choices[0].message.content
    assert text.startswith("{") and is_json_prefix(text), text


def test_langgraph_prebuilt_agent_runs_a_tool(gateway):
    from langchain_core.messages import ToolMessage
    from langgraph.prebuilt import create_react_agent

    add = _lc_add(return_direct=True)
    model = _chat_model(gateway, seed=14).bind_tools([add], tool_choice="any", parallel_tool_calls=False)
    agent = create_react_agent(model, [add])
    state = agent.invoke({"messages": _lc_messages("Add 2 and 3.")}, {"recursion_limit": 6})
    results = [m for m in state["messages"] if isinstance(m, ToolMessage)]
    assert results and results[-1].name == "add" and isinstance(results[-1].content, str), results
    assert int(results[-1].content) <= 198
