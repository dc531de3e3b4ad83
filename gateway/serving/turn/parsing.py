"""Tool calls, structured outputs and reasoning through vLLM's own code.

The gateway owns the text of a request across nodes (a request may run on
a prefill node, a decode node and, after a migration, another one), so it
parses that text, not the workers. It does so with vLLM's parsers rather
than a second copy:

- `OutputParsing.create(...)` composes vLLM's tool-call parser (the
  `--tool-call-parser` setting, e.g. `hermes`) and reasoning parser
  (`ParserManager.get_parser`) once, validated against the tokenizer.
- `adjust(request)` runs the parser's `adjust_request` on a vLLM
  `ChatCompletionRequest` or `ResponsesRequest`: `tool_choice` required or a
  named function becomes a structural-tag constraint, as in vLLM's server;
  `response_format` / `text.format` a JSON constraint. What comes back is
  the worker's `StructuredOutput` and whether to keep special tokens.
- `Adjusted.new_parser()` gives one stateful parser per choice:
  `parse_delta` while streaming, `parse` for a whole output.

Importing vLLM here costs the gateway process 9-15 s at start and about
550 MiB (torch comes along); docs/architecture.md ("The gateway and vLLM")
says why that is the trade taken. vLLM's `VLLMValidationError` and the
pydantic errors of its models become `InvalidRequest` naming the field.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from gateway.http.errors import InvalidRequest
from gateway.serving.turn.fields import field_path
from workers.protocol import StructuredOutput

log = logging.getLogger(__name__)

TOOL_STRICT_LEVELS = ("auto", "function", "parameter")


def invalid_request(exc: Exception, *, prefix: str = "") -> InvalidRequest:
    """A vLLM validation failure (its own error or a pydantic one) as a 400 naming the field."""
    from vllm.exceptions import VLLMValidationError

    if isinstance(exc, VLLMValidationError):
        param = exc.parameter
        return InvalidRequest(exc.args[0] if exc.args else str(exc), param=_join(prefix, param))
    if isinstance(exc, ValidationError):
        err = exc.errors()[0]
        loc = field_path(err.get("loc", ()))
        msg = str(err.get("msg", "invalid request")).removeprefix("Value error, ")
        where = _join(prefix, loc or None)
        return InvalidRequest(msg + (f" (at {where})" if where else ""), param=where)
    return InvalidRequest(str(exc).removeprefix("Value error, "), param=prefix or None)


def _join(prefix: str, param: str | None) -> str | None:
    if prefix and param:
        return f"{prefix}.{param}"
    return prefix or param


def structured_output(params: Any) -> StructuredOutput | None:
    """vLLM's `StructuredOutputsParams` as the worker protocol's `StructuredOutput`."""
    if params is None:
        return None
    json_schema = params.json
    if isinstance(json_schema, str):
        import json

        try:
            json_schema = json.loads(json_schema)
        except ValueError as exc:
            raise InvalidRequest(f"the JSON schema is not valid JSON: {exc}") from exc
    fields = {
        "json_schema": json_schema,
        "json_object": params.json_object or None,
        "regex": params.regex,
        "choice": params.choice,
        "grammar": params.grammar,
        "structural_tag": params.structural_tag,
    }
    given = {k: v for k, v in fields.items() if v is not None}
    if not given:
        return None
    try:
        return StructuredOutput(**given)
    except ValidationError as exc:
        raise invalid_request(exc) from exc


@dataclass
class Adjusted:
    """One request after the parser adjusted it; makes the per-choice parsers."""

    request: Any  # vLLM ChatCompletionRequest | ResponsesRequest, after adjust_request
    structured_output: StructuredOutput | None
    skip_special_tokens: bool
    _parser_cls: Any
    _tokenizer: Any

    @property
    def parses(self) -> bool:
        """Whether the output goes through vLLM's parser (tools or reasoning)."""
        return self._parser_cls is not None

    def new_parser(self) -> Any:
        """A fresh vLLM `Parser` for one choice (it keeps stream state)."""
        return self._parser_cls(self._tokenizer, self.request.tools or None)

    @property
    def forced_tool(self) -> bool:
        """tool_choice named a function: OpenAI's finish_reason stays "stop"."""
        choice = self.request.tool_choice
        return choice not in (None, "none", "auto", "required")


class OutputParsing:
    """vLLM's composed tool/reasoning parser class for this gateway (see the module docstring)."""

    def __init__(
        self, parser_cls: Any, tokenizer: Any, *, tool_parser: str | None, forced_parser_cls: Any = None
    ) -> None:
        self._parser_cls = parser_cls
        # For a forced call (tool_choice required or named): the arguments held to the tool's
        # schema. Under "auto" vLLM leaves a non-strict tool's arguments free, and a small model
        # then writes a list where every client expects an object (LangChain refuses it; the
        # Anthropic SDK warns). A schema-valid call is one the non-strict contract allows.
        self._forced_parser_cls = forced_parser_cls or parser_cls
        self._tokenizer = tokenizer
        self.tool_parser = tool_parser

    @property
    def reasoning(self) -> bool:
        """A reasoning parser splits reasoning from content."""
        return self._parser_cls is not None and self._parser_cls.reasoning_parser_cls is not None

    @classmethod
    def create(
        cls,
        hf_tokenizer: Any,
        *,
        tool_parser: str | None,
        reasoning_parser: str | None,
        tool_strict_level: str = "auto",
    ) -> OutputParsing:
        """Compose the parsers (imports vLLM). Raises ValueError for an unknown parser name."""
        from vllm.parser.parser_manager import ParserManager

        if tool_strict_level not in TOOL_STRICT_LEVELS:
            raise ValueError(f"tool_strict_level must be one of {TOOL_STRICT_LEVELS}")

        def compose(level: str) -> Any:
            return ParserManager.get_parser(
                tool_parser_name=tool_parser or None,
                reasoning_parser_name=reasoning_parser or None,
                enable_auto_tools=bool(tool_parser),
                tool_strict_level=level,
                tokenizer=hf_tokenizer,
            )

        try:
            parser_cls = compose(tool_strict_level)
            forced = compose("parameter") if tool_parser and tool_strict_level != "parameter" else None
        except TypeError as exc:  # vLLM's way of saying "no such parser" or "not for this tokenizer"
            raise ValueError(str(exc)) from exc
        return cls(parser_cls, hf_tokenizer, tool_parser=tool_parser or None, forced_parser_cls=forced)

    def adjust(self, request: Any, *, constraint_param: str = "response_format") -> Adjusted:
        """Apply the parser's request adjustments and read the constraint off the result."""
        tools = bool(getattr(request, "tools", None))
        tool_choice = getattr(request, "tool_choice", "none")
        if tools and tool_choice != "none" and (self._parser_cls is None or self.tool_parser is None):
            raise InvalidRequest(
                "tools need a tool-call parser on this gateway (EVOLVING_TOOL_CALL_PARSER); "
                'send tool_choice "none" to only show the tools to the model',
                param="tool_choice",
            )
        forced = tools and tool_choice not in ("auto", "none", None)
        parser_cls = self._forced_parser_cls if forced else self._parser_cls
        from vllm.exceptions import VLLMValidationError

        try:
            if parser_cls is not None and (parser_cls.reasoning_parser_cls is not None or tool_choice != "none"):
                request = parser_cls(self._tokenizer, request.tools or None).adjust_request(request)
            params = request.extract_structured_outputs()
        except (ValueError, TypeError, VLLMValidationError) as exc:
            raise invalid_request(exc, prefix="" if tools else constraint_param) from exc
        spec = structured_output(params)
        needs_parser = parser_cls is not None and (
            parser_cls.reasoning_parser_cls is not None or (tools and tool_choice != "none")
        )
        return Adjusted(
            request=request,
            structured_output=spec,
            skip_special_tokens=bool(getattr(request, "skip_special_tokens", True)),
            _parser_cls=parser_cls if needs_parser else None,
            _tokenizer=self._tokenizer,
        )


def validate(model: Any, data: dict[str, Any], *, prefix: str = "") -> Any:
    """`model.model_validate(data)` for one of vLLM's request models; its
    validators raise `VLLMValidationError` (not a ValueError) as well as
    pydantic's errors: either becomes `InvalidRequest` with vLLM's reason."""
    from vllm.exceptions import VLLMValidationError

    try:
        return model.model_validate(data)
    except (ValueError, TypeError, VLLMValidationError) as exc:
        raise invalid_request(exc, prefix=prefix) from exc


def chat_request(fields: dict[str, Any]) -> Any:
    """A vLLM `ChatCompletionRequest` for the parser and constraint builders
    (messages, tools, tool_choice, response_format, parallel_tool_calls)."""
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

    return validate(ChatCompletionRequest, fields)


def new_tool_call_id() -> str:
    """A tool call id in vLLM's format (for a parsed call that has none)."""
    from vllm.renderers.chat_utils import make_tool_call_id

    return str(make_tool_call_id())
