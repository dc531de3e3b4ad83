"""TurnService.prepare: big prompts tokenized off the event loop, block
hashes computed once (in slices for big prompts), context limits."""

from __future__ import annotations

import asyncio
import threading

import pytest

from gateway.control.registry import WorkerRegistry
from gateway.http.errors import InvalidRequest
from gateway.kv.directory import GatewayDirectory
from gateway.metrics import GatewayMetrics
from gateway.serving.openai.convert import chat_spec, completion_spec
from gateway.serving.openai.schemas import ChatCompletionRequest, CompletionRequest
from gateway.serving.orchestrator import Orchestrator
from gateway.serving.policy.tenancy import OpenTenantGate
from gateway.serving.tokenize import PromptTokenizer
from gateway.serving.turn.branch import parse_branch_headers
from gateway.serving.turn.service import TurnService
from kvpool.directory import MemoryDirectory
from testing.fake_worker import InProcessWorkerClient

MODEL = "demo"


def make_service(tokenizer: PromptTokenizer, **kwargs) -> TurnService:
    directory = GatewayDirectory(MemoryDirectory(), block_size=4)
    client = InProcessWorkerClient({})
    orchestrator = Orchestrator(WorkerRegistry(client, directory), client, directory)
    return TurnService(
        model_name=MODEL,
        tokenizer=tokenizer,
        orchestrator=orchestrator,
        gate=OpenTenantGate(),
        directory=directory,
        metrics=GatewayMetrics(),
        default_max_tokens=16,
        **kwargs,
    )


def chat(content: str) -> ChatCompletionRequest:
    return ChatCompletionRequest(model=MODEL, messages=[{"role": "user", "content": content}])


async def prepare(service: TurnService, req, branch_id: str | None = None, finished: str | None = None):
    tenant = await service.gate.authenticate(None)
    branch = parse_branch_headers(
        tenant.tenant_id, branch_id=branch_id, parent_id=None, session_id=None, finished=finished
    )
    spec = chat_spec(req) if isinstance(req, ChatCompletionRequest) else completion_spec(req)
    return await service.prepare(spec, tenant, branch, "chatcmpl")


BIG = "Agents call tools, read their results and continue the conversation. " * 1000  # 70k characters


async def test_a_big_prompt_is_tokenized_while_the_loop_runs(tokenizer: PromptTokenizer) -> None:
    service = make_service(tokenizer)
    loop_ran = threading.Event()
    threads: list[str] = []
    encode_chat = tokenizer.encode_chat

    def encode_waiting_for_the_loop(*args, **kwargs):
        threads.append(threading.current_thread().name)
        # On the loop's own thread this would wait for itself: the other task could not run.
        assert loop_ran.wait(10), "the event loop did not run while the prompt was tokenized"
        return encode_chat(*args, **kwargs)

    service.tokenizer = PromptTokenizer(tokenizer._hf)
    # Replaces the tokenizer's method to observe where and when it runs.
    service.tokenizer.encode_chat = encode_waiting_for_the_loop  # type: ignore[method-assign]

    async def other_request() -> None:
        loop_ran.set()

    other = asyncio.ensure_future(other_request())
    p = await prepare(service, chat(BIG))
    await other
    assert threads and threads[0].startswith("tokenize")
    assert p.job.prompt_token_ids == tokenizer.encode_chat([{"role": "user", "content": BIG}])


async def test_a_small_prompt_is_tokenized_inline(tokenizer: PromptTokenizer) -> None:
    service = make_service(tokenizer)
    threads: list[str] = []
    encode_chat = tokenizer.encode_chat

    def recording(*args, **kwargs):
        threads.append(threading.current_thread().name)
        return encode_chat(*args, **kwargs)

    service.tokenizer = PromptTokenizer(tokenizer._hf)
    # Replaces the tokenizer's method to record its calls.
    service.tokenizer.encode_chat = recording  # type: ignore[method-assign]
    await prepare(service, chat("hello"))
    assert threads == [threading.current_thread().name]


@pytest.mark.parametrize("content", ["short prompt", BIG * 2])  # inline; sliced (> 1024 blocks)
async def test_prompt_hashes_are_the_directorys(tokenizer: PromptTokenizer, content: str) -> None:
    service = make_service(tokenizer)
    p = await prepare(service, chat(content))
    tokens = p.job.prompt_token_ids
    assert list(p.job.prompt_hashes) == service.directory.block_hashes(tokens, p.job.tenant_salt)
    assert len(p.job.prompt_hashes) == len(tokens) // 4


@pytest.mark.parametrize(
    ("branch_id", "finished", "reference"), [(None, None, False), ("b1", None, True), ("b1", "true", False)]
)
async def test_blocks_are_referenced_only_for_a_branch_that_goes_on(
    tokenizer: PromptTokenizer, branch_id, finished, reference
) -> None:
    p = await prepare(make_service(tokenizer), chat("hi"), branch_id=branch_id, finished=finished)
    assert p.job.reference_blocks is reference


async def test_prompts_over_the_context_are_refused(tokenizer: PromptTokenizer) -> None:
    # "hi" in the stock template is ~90 tokens of this tiny vocabulary (its default system prompt)
    service = make_service(tokenizer, max_prompt_tokens=150)
    for req in (
        chat("Agents call tools. " * 60),
        chat(BIG),  # off the loop: the same refusal
        CompletionRequest(model=MODEL, prompt=list(range(10, 170))),
        CompletionRequest(model=MODEL, prompt="Agents call tools. " * 60),
    ):
        with pytest.raises(InvalidRequest) as err:
            await prepare(service, req)
        assert err.value.code == "context_length_exceeded", req
    assert (await prepare(service, chat("hi"))).job.prompt_token_ids


@pytest.fixture(scope="module")
def process_tokenizer(tokenizer_dir):
    from gateway.serving.tokenize_process import ProcessTokenizer

    proc = ProcessTokenizer(str(tokenizer_dir))
    yield proc
    proc.close()


async def test_a_huge_prompt_is_tokenized_in_the_tokenizers_process(
    tokenizer: PromptTokenizer, process_tokenizer
) -> None:
    """Past `process_chars` the ids come from the other process: the same ids,
    the same hashes, and a refusal there is the same 400 here."""
    service = make_service(tokenizer, process_tokenizer=process_tokenizer, process_chars=len(BIG) // 2)
    service.tokenizer = PromptTokenizer(tokenizer._hf)
    # Replaces the tokenizer's method: any call in this process fails the test.
    service.tokenizer.encode_chat = lambda *a, **k: pytest.fail("tokenized in this process")  # type: ignore[method-assign]
    p = await prepare(service, chat(BIG * 2))
    want = tokenizer.encode_chat([{"role": "user", "content": BIG * 2}])
    assert p.job.prompt_token_ids == want and all(type(t) is int for t in want[:5] + p.job.prompt_token_ids[:5])
    assert list(p.job.prompt_hashes) == service.directory.block_hashes(want, p.job.tenant_salt)
    text = await prepare(service, CompletionRequest(model=MODEL, prompt=BIG))
    assert text.job.prompt_token_ids == tokenizer.encode_text(BIG)
    service.model.max_prompt_setting = 50
    for req, param in ((chat(BIG), "messages"), (CompletionRequest(model=MODEL, prompt=BIG), "prompt")):
        with pytest.raises(InvalidRequest) as err:
            await prepare(service, req)
        assert (err.value.code, err.value.param) == ("context_length_exceeded", param), req
