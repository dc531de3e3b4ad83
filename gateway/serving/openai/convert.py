"""OpenAI chat and completions requests as `TurnSpec`s (gateway.serving.turn.spec).

Sampling fields map one to one; the chat template gets `reasoning_effort`,
`verbosity` and `chat_template_kwargs` as variables. When the output is
constrained or parsed (tools, `response_format`), the spec carries a vLLM
`ChatCompletionRequest` built from the same fields, for vLLM's tool parser
and constraint builders.
"""

from __future__ import annotations

from typing import Any

from gateway.serving.openai.schemas import ChatCompletionRequest, CompletionRequest, _Sampling
from gateway.serving.turn.parsing import chat_request
from gateway.serving.turn.spec import Sampling, TurnSpec, unset_fields


def sampling_of(req: _Sampling, *, logprobs: int | None) -> Sampling:
    return Sampling(
        temperature=req.temperature if req.temperature is not None else 1.0,
        top_p=req.top_p if req.top_p is not None else 1.0,
        top_k=req.top_k or 0,
        min_p=req.min_p or 0.0,
        presence_penalty=req.presence_penalty or 0.0,
        frequency_penalty=req.frequency_penalty or 0.0,
        repetition_penalty=req.repetition_penalty if req.repetition_penalty is not None else 1.0,
        logit_bias=req.logit_bias_ids(),
        seed=req.seed,
        stop=tuple(req.stop_list()),
        stop_token_ids=tuple(req.stop_token_ids or ()),
        ignore_eos=bool(req.ignore_eos),
        min_tokens=req.min_tokens or 0,
        logprobs=logprobs,
    )


def chat_spec(req: ChatCompletionRequest) -> TurnSpec:
    messages = [m.chat_message() for m in req.messages]
    tools = [t.model_dump(exclude_none=True) for t in req.tools] if req.tools else None
    kwargs: dict[str, Any] = dict(req.chat_template_kwargs or {})
    if req.reasoning_effort is not None:
        kwargs.setdefault("reasoning_effort", req.reasoning_effort)
    if req.verbosity is not None:
        kwargs.setdefault("verbosity", req.verbosity)
    parsing = None
    if tools or req.response_format is not None:
        parsing = chat_request(
            {
                "model": req.model,
                "messages": messages,
                "tools": tools,
                "tool_choice": _tool_choice(req),
                "response_format": req.response_format.model_dump(by_alias=True, exclude_none=True)
                if req.response_format is not None
                else None,
                "parallel_tool_calls": req.parallel_tool_calls if req.parallel_tool_calls is not None else True,
                "stream": req.stream,
            }
        )
    return TurnSpec(
        messages=messages,
        tools=tools,
        template_kwargs=kwargs,
        max_tokens=req.requested_max_tokens(),
        max_tokens_param=req.max_tokens_param,
        n=req.n or 1,
        sampling=sampling_of(req, logprobs=(req.top_logprobs or 0) if req.logprobs else None),
        parsing=parsing,
        include_usage=req.include_usage,
        unset=unset_fields(req),
    )


def _tool_choice(req: ChatCompletionRequest) -> Any:
    if req.tool_choice is None:
        return "auto" if req.tools else "none"
    if isinstance(req.tool_choice, str):
        return req.tool_choice
    return req.tool_choice.model_dump()


def completion_spec(req: CompletionRequest) -> TurnSpec:
    prompt: str | list[int]
    if isinstance(req.prompt, str):
        prompt = req.prompt
    elif req.prompt and isinstance(req.prompt[0], str):
        prompt = str(req.prompt[0])
    else:
        prompt = [int(t) for t in req.prompt]
    return TurnSpec(
        prompt=prompt,
        max_tokens=req.max_tokens,
        n=req.n or 1,
        sampling=sampling_of(req, logprobs=req.logprobs),
        include_usage=req.include_usage,
        unset=unset_fields(req),
    )
