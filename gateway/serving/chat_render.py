"""Conversations to prompt text the way vLLM's own server renders them.

Every API (Chat Completions, Responses, Messages, `count_tokens`) ends in
`ChatRenderer.render`: vLLM's chat-message parsing (`parse_chat_messages`)
turns the messages into what a chat template is written for — text parts
joined into one string (or kept as `{"type": "text"}` parts when the
template iterates over parts: vLLM detects which from the template), a
missing `content` as "", tool results as text, tool-call arguments as
objects — and vLLM's `safe_apply_chat_template` applies the model's own
template (a `developer` message becomes `system` where the template has no
such role). The model's template then decides what it can render: nothing
here tolerates on its behalf what it does not.

The vLLM `ModelConfig` the parser needs is built once from the model folder
(`config.json`; no weights are read, nothing is fetched).
"""

from __future__ import annotations

import copy
import functools
from typing import Any

from gateway.http.errors import InvalidRequest


@functools.lru_cache(maxsize=8)
def model_config(model_dir: str) -> Any:
    """vLLM's `ModelConfig` of a local model folder (cached per folder)."""
    from vllm.config import ModelConfig

    return ModelConfig(model=model_dir, tokenizer=model_dir, skip_tokenizer_init=True)


class ChatRenderer:
    """Renders chat messages with a Hugging Face tokenizer's template through vLLM.

    `model_dir` names the folder the tokenizer came from (its `config.json`
    is read for vLLM's `ModelConfig`). Thread-safe: `render` keeps no state.
    """

    def __init__(self, hf_tokenizer: Any, model_dir: str) -> None:
        self._hf = hf_tokenizer
        self._model_dir = model_dir

    @functools.cached_property
    def _config(self) -> Any:
        return model_config(self._model_dir)

    @functools.cached_property
    def content_format(self) -> str:
        """ "string" or "openai": how the template wants message content (vLLM's detection)."""
        from vllm.renderers.hf import resolve_chat_template_content_format

        return str(resolve_chat_template_content_format(None, None, "auto", self._hf, model_config=self._config))

    def conversation(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The messages as vLLM hands them to a chat template."""
        from vllm.exceptions import VLLMValidationError
        from vllm.renderers.chat_utils import parse_chat_messages

        config, content_format = self._config, self.content_format
        # vLLM rewrites tool-call arguments in place (JSON text -> object): parse copies,
        # so the caller's messages (a stored Responses turn, the spec) stay as sent.
        owned = [{**m, "tool_calls": copy.deepcopy(m["tool_calls"])} if m.get("tool_calls") else m for m in messages]
        try:
            # Plain dicts, shaped as vLLM's ChatCompletionMessageParam TypedDicts it declares.
            parsed, mm_data, _ = parse_chat_messages(owned, config, content_format)  # type: ignore[arg-type]
        except (VLLMValidationError, ValueError, TypeError, KeyError) as exc:
            raise InvalidRequest(f"messages: {exc}", param="messages") from exc
        if mm_data:
            raise InvalidRequest("media content is not supported (text only)", param="messages")
        return [dict(m) for m in parsed]

    def render(
        self,
        messages: list[dict[str, Any]],
        *,
        tools: list[dict[str, Any]] | None = None,
        tool_choice: Any = None,
        template_kwargs: dict[str, Any] | None = None,
    ) -> str:
        """The prompt text for `messages`, ending with the assistant header."""
        from vllm.renderers.hf import safe_apply_chat_template

        conversation = self.conversation(messages)
        kwargs = {**(template_kwargs or {}), "add_generation_prompt": True}
        if tool_choice is not None:
            kwargs["tool_choice"] = tool_choice
        try:
            # `kwargs` are template variables, never `tokenize`; mypy cannot see that, so no overload matches.
            text = safe_apply_chat_template(  # type: ignore[call-overload]
                self._config, self._hf, conversation, tools=tools or None, tokenize=False, **kwargs
            )
        except Exception as exc:  # jinja and vLLM raise many types; all mean a conversation the template refuses
            raise InvalidRequest(f"messages cannot be rendered by the chat template: {exc}", param="messages") from exc
        assert isinstance(text, str)
        return text
