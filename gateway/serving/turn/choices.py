"""Run a prepared request's choices and read their output: text, tool calls,
reasoning, logprobs. The API layers only encode what comes out.

`ChoiceOutput` follows one choice: token ids -> text (stop strings cut it)
-> vLLM's parser (`parse_delta` while streaming) -> `ChoiceDelta`s, and at
the end `result()` (`parse` of the whole text). `run_choices` runs every
job of a `Prepared` through the orchestrator (one job: inline; several:
concurrently, deltas interleaved as they come) and hands each finished job
to `account` once.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass, field
from typing import Any

from gateway.http.errors import InvalidRequest
from gateway.serving.jobs import Finished, Job, TokenDelta
from gateway.serving.orchestrator import Orchestrator
from gateway.serving.tokenize import PromptTokenizer
from gateway.serving.turn.lean import JobClock, TextAssembler
from gateway.serving.turn.prepare import Prepared
from workers.protocol import TokenLogprobs


@dataclass(frozen=True)
class TopLogprob:
    token: str
    logprob: float
    bytes: list[int]


@dataclass(frozen=True)
class LogprobEntry:
    """One generated token's logprob and its most likely alternatives."""

    token: str
    logprob: float
    bytes: list[int]
    top: list[TopLogprob]


@dataclass
class ChoiceDelta:
    """What one step of one choice adds. `message` is the parser's
    `DeltaMessage` (content / reasoning / tool_calls) or None: the text is
    plain content."""

    index: int
    text: str = ""
    message: Any = None
    parsed: bool = False  # the output goes through the parser: `message` is what the client sees
    logprobs: list[LogprobEntry] = field(default_factory=list)
    finished: Finished | None = None  # set on a choice's last delta
    finish_reason: str | None = None  # the API-level reason, with the last delta
    stop_string: str | None = None  # the stop string that ended the choice, with the last delta

    @property
    def content(self) -> str | None:
        if not self.parsed:
            return self.text or None
        return self.message.content if self.message is not None else None

    @property
    def tool_calls(self) -> list[Any]:
        return list(self.message.tool_calls or []) if self.message is not None else []

    @property
    def reasoning(self) -> str | None:
        return self.message.reasoning if self.message is not None else None

    def tool_call_dicts(self) -> list[dict[str, Any]]:
        """The tool calls as OpenAI's stream sends them (index, then id/type/name once, then argument fragments)."""
        return [tool_call_delta(tc) for tc in self.tool_calls]


def tool_call_delta(tc: Any) -> dict[str, Any]:
    """A vLLM `DeltaToolCall` as OpenAI's stream sends it."""
    out: dict[str, Any] = {"index": tc.index}
    if tc.id:
        out["id"] = tc.id
        out["type"] = "function"
    if tc.function is not None:
        fn = {k: v for k, v in (("name", tc.function.name), ("arguments", tc.function.arguments)) if v is not None}
        out["function"] = fn
    return out


@dataclass
class ChoiceResult:
    """One choice, complete (non-streaming answers)."""

    index: int
    text: str
    content: str | None
    reasoning: str | None
    tool_calls: list[Any]  # vLLM FunctionCall (id, name, arguments)
    logprobs: list[LogprobEntry]
    finished: Finished
    finish_reason: str
    stop_string: str | None


def logprob_entries(tokenizer: PromptTokenizer, entries: list[TokenLogprobs]) -> list[LogprobEntry]:
    def top(token_id: int, logprob: float) -> TopLogprob:
        return TopLogprob(tokenizer.token_text(token_id), logprob, tokenizer.token_bytes(token_id))

    return [
        LogprobEntry(
            tokenizer.token_text(e.token_id),
            e.logprob,
            tokenizer.token_bytes(e.token_id),
            [top(t, lp) for t, lp in e.top],
        )
        for e in entries
    ]


class ChoiceOutput:
    """One choice's output as it streams (see the module docstring)."""

    def __init__(self, index: int, p: Prepared, tokenizer: PromptTokenizer, *, streaming: bool) -> None:
        self.index = index
        self._tokenizer = tokenizer
        self._text = TextAssembler(tokenizer, p.stops, skip_special_tokens=p.skip_special_tokens)
        self._adjusted = p.adjusted if p.adjusted is not None and p.adjusted.parses else None
        self._parser = self._adjusted.new_parser() if self._adjusted is not None else None
        self._streaming = streaming
        self._prompt = p.job.prompt_token_ids
        self._want_logprobs = p.logprobs is not None
        self.parts: list[str] = []
        self.token_ids: list[int] = []
        self.logprobs: list[LogprobEntry] = []
        self.tools_streamed = False

    @property
    def stopped(self) -> bool:
        return self._text.stopped

    @property
    def text(self) -> str:
        return "".join(self.parts)

    def push(self, ev: TokenDelta) -> ChoiceDelta | None:
        """The delta one worker chunk makes (None: nothing to send yet)."""
        self.token_ids.extend(ev.token_ids)
        text = self._text.push(ev.token_ids)
        lps = logprob_entries(self._tokenizer, ev.logprobs) if self._want_logprobs and ev.logprobs else []
        self.logprobs.extend(lps)
        return self._delta(text, ev.token_ids, lps, finished=False)

    def finish(self, done: Finished) -> ChoiceDelta:
        """The choice's last delta: held-back text, the parser's flush, the finish reason."""
        delta = self._delta(self._text.flush(), [], [], finished=True) or ChoiceDelta(self.index)
        delta.finished = done
        delta.finish_reason = self.finish_reason(done, tools_called=self.tools_streamed)
        delta.stop_string = self._text.matched_stop
        return delta

    def _delta(self, text: str, token_ids: list[int], lps: list[LogprobEntry], *, finished: bool) -> ChoiceDelta | None:
        if text:
            self.parts.append(text)
        parsed = self._parser is not None and self._streaming
        message = None
        if parsed and (text or finished):
            assert self._parser is not None and self._adjusted is not None
            message = self._parser.parse_delta(
                text, token_ids, self._adjusted.request, prompt_token_ids=self._prompt, finished=finished
            )
            if message is not None and message.tool_calls:
                self.tools_streamed = True
        if (message is None if parsed else not text) and not lps:
            return None
        return ChoiceDelta(self.index, text=text, message=message, parsed=parsed, logprobs=lps)

    def finish_reason(self, done: Finished, *, tools_called: bool) -> str:
        """OpenAI's reason: "tool_calls" when calls came for tool_choice auto or
        required; a named function keeps "stop" (as vLLM and OpenAI do)."""
        reason = done.finish_reason.value
        if reason == "stop" and tools_called and self._adjusted is not None and not self._adjusted.forced_tool:
            return "tool_calls"
        return reason

    def result(self, done: Finished) -> ChoiceResult:
        """The whole choice, parsed at once (non-streaming)."""
        text = self.text + self._text.flush()
        self.parts = [text]
        reasoning, content, calls = None, text, []
        if self._parser is not None:
            assert self._adjusted is not None
            reasoning, content, parsed = self._parser.parse(
                text, self._adjusted.request, enable_auto_tools=True, model_output_token_ids=self.token_ids
            )
            calls = list(parsed or [])
        return ChoiceResult(
            index=self.index,
            text=text,
            content=content,
            reasoning=reasoning,
            tool_calls=calls,
            logprobs=self.logprobs,
            finished=done,
            finish_reason=self.finish_reason(done, tools_called=bool(calls)),
            stop_string=self._text.matched_stop,
        )

    @property
    def stop_string(self) -> str | None:
        return self._text.matched_stop


Account = Callable[[Finished], None]


async def run_choice(
    orchestrator: Orchestrator, p: Prepared, job: Job, out: ChoiceOutput, account: Account
) -> AsyncGenerator[ChoiceDelta | Finished, None]:
    """One job through the orchestrator: its deltas, then its `Finished` (accounted)."""
    clock = JobClock()
    async with contextlib.aclosing(_named_constraint_errors(orchestrator.stream(job), p)) as events:
        async for ev in events:
            if isinstance(ev, TokenDelta):
                clock.seen(ev)
                delta = out.push(ev)
                if delta is not None:
                    yield delta
                if out.stopped:
                    break
            else:
                account(ev)
                yield ev
                return
    done = clock.stopped(len(job.prompt_token_ids))  # a stop string ended the text before the worker finished
    account(done)
    yield done


async def _named_constraint_errors(
    events: AsyncGenerator[TokenDelta | Finished, None], p: Prepared
) -> AsyncGenerator[TokenDelta | Finished, None]:
    """A constraint the worker refused is the client's field's fault: name it."""
    try:
        async for ev in events:
            yield ev
    except InvalidRequest as exc:
        if exc.code == "invalid_structured_output" and exc.param is None:
            exc.param = p.constraint_param
        raise
    finally:
        await events.aclose()


async def run_choices(
    orchestrator: Orchestrator, tokenizer: PromptTokenizer, p: Prepared, account: Account, *, streaming: bool
) -> AsyncGenerator[tuple[ChoiceOutput, ChoiceDelta | Finished], None]:
    """Every choice's deltas and `Finished`, interleaved in arrival order.

    A failure of any choice cancels the others and propagates."""
    outputs = [ChoiceOutput(i, p, tokenizer, streaming=streaming) for i in range(len(p.jobs))]
    if len(p.jobs) == 1:
        async with contextlib.aclosing(run_choice(orchestrator, p, p.jobs[0], outputs[0], account)) as events:
            async for item in events:
                yield outputs[0], item
        return
    queue: asyncio.Queue[tuple[ChoiceOutput, ChoiceDelta | Finished] | BaseException | None] = asyncio.Queue()

    async def pump(job: Job, out: ChoiceOutput) -> None:
        try:
            async with contextlib.aclosing(run_choice(orchestrator, p, job, out, account)) as events:
                async for item in events:
                    await queue.put((out, item))
            await queue.put(None)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - handed to the consumer, which raises it
            await queue.put(exc)

    tasks = [asyncio.create_task(pump(job, out)) for job, out in zip(p.jobs, outputs, strict=True)]
    try:
        running = len(tasks)
        while running:
            got = await queue.get()
            if got is None:
                running -= 1
            elif isinstance(got, BaseException):
                raise got
            else:
                yield got
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
