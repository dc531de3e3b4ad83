"""`TurnService`: the small facade the API routes use.

Behind it, one part per job: the served model (`ServedModel`: names,
tokenizer, context), the branch contract (`branch`), tokenization and job
preparation (`PromptTokens`, `Preparer`), admission (`Admission`), the run
and its lifecycle (`Turn`), and accounting (`Accounting`, with the request
log). Routes get a `Turn` per request from `serve` and never reach past it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager

from starlette.responses import Response

from gateway.control.workload_feed import LocalWorkloadFeed, WorkloadFeed
from gateway.http.error_responses import error_response
from gateway.http.errors import GatewayError
from gateway.kv.directory import Directory
from gateway.metrics import GatewayMetrics
from gateway.serving.orchestrator import Orchestrator
from gateway.serving.policy.tenancy import TenantContext, TenantGate
from gateway.serving.tokenize import PromptTokenizer
from gateway.serving.tokenize_process import ProcessTokenizer
from gateway.serving.turn.accounting import Accounting
from gateway.serving.turn.admission import Admission
from gateway.serving.turn.branch import BranchContext
from gateway.serving.turn.model import ServedModel
from gateway.serving.turn.parsing import OutputParsing
from gateway.serving.turn.pipeline import CLIENT_GONE, ErrorAnswer, Turn
from gateway.serving.turn.prepare import Prepared, Preparer
from gateway.serving.turn.requestlog import RequestLog
from gateway.serving.turn.spec import TurnSpec
from gateway.serving.turn.tokens import PromptTokens

log = logging.getLogger(__name__)


class TurnService:
    def __init__(
        self,
        *,
        model_name: str,
        tokenizer: PromptTokenizer,
        orchestrator: Orchestrator,
        gate: TenantGate,
        directory: Directory,
        metrics: GatewayMetrics,
        default_max_tokens: int | None = None,
        workload: WorkloadFeed | None = None,
        max_prompt_tokens: int | None = None,
        offload_chars: int = 16 * 1024,
        tokenize_threads: int = 2,
        process_tokenizer: ProcessTokenizer | None = None,
        process_chars: int = 256 * 1024,
        parsing: OutputParsing | None = None,
        context_limit: Callable[[], int | None] = lambda: None,
        model_aliases: dict[str, str] | None = None,
        sampling_defaults: dict[str, float | int] | None = None,
        request_log: RequestLog | None = None,
    ) -> None:
        self.model = ServedModel(
            name=model_name,
            tokenizer=tokenizer,
            parsing=parsing or OutputParsing(None, tokenizer, tool_parser=None),
            default_max_tokens=default_max_tokens,
            max_prompt_setting=max_prompt_tokens,
            context_limit=context_limit,
            aliases=dict(model_aliases or {}),
            sampling_defaults=dict(sampling_defaults or {}),
        )
        self.orchestrator = orchestrator
        self.gate = gate
        self.directory = directory
        # Finished requests for the planner's workload estimate (drained by it).
        # (the feed also works out each branch's turn gaps, cluster-wide on a shared feed)
        self.workload: WorkloadFeed = workload if workload is not None else LocalWorkloadFeed()
        self.requests = request_log if request_log is not None else RequestLog(1000)
        self.tokens = PromptTokens(
            self.model,
            directory,
            offload_chars=offload_chars,
            tokenize_threads=tokenize_threads,
            process_tokenizer=process_tokenizer,
            process_chars=process_chars,
        )
        self.preparer = Preparer(self.model, self.tokens)
        self.admission = Admission(model_name, gate, directory, self.workload)
        self.accounting = Accounting(model_name, gate, metrics, self.workload, self.requests)

    @property
    def model_name(self) -> str:
        return self.model.name

    @property
    def tokenizer(self) -> PromptTokenizer:
        return self.model.tokenizer

    @tokenizer.setter
    def tokenizer(self, tokenizer: PromptTokenizer) -> None:
        self.model.tokenizer = tokenizer

    def context_length(self) -> int | None:
        return self.model.context_length()

    def check_model(self, model: str) -> None:
        self.model.check_model(model)

    def models_for(self, tenant: TenantContext) -> list[str]:
        return self.model.models_for(tenant)

    async def authenticate(self, key: str | None) -> TenantContext:
        return await self.gate.authenticate(key)

    async def finish_branch(self, branch_key: str) -> bool:
        return await self.directory.finish_branch(branch_key)

    async def prepare(self, spec: TurnSpec, tenant: TenantContext, branch: BranchContext, prefix: str) -> Prepared:
        return await self.preparer.prepare(spec, tenant, branch, prefix)

    def admitted(self, p: Prepared) -> AbstractAsyncContextManager[None]:
        return self.admission.admitted(p)

    def turn(self, api: str, endpoint: str) -> Turn:
        return Turn(
            model=self.model,
            orchestrator=self.orchestrator,
            preparer=self.preparer,
            admission=self.admission,
            accounting=self.accounting,
            api=api,
            endpoint=endpoint,
        )

    async def serve(
        self,
        api: str,
        endpoint: str,
        handler: Callable[[Turn], Awaitable[Response]],
        *,
        error_answer: ErrorAnswer = error_response,
    ) -> Response:
        """`handler`'s answer for a new turn; a failure before the answer
        started is the API's error answer. Either way the turn is recorded
        (a stream's at its end)."""
        turn = self.turn(api, endpoint)
        try:
            response = await handler(turn)
        except GatewayError as exc:
            await turn.abort()
            turn.finish(exc.status)
            return error_answer(exc)
        except asyncio.CancelledError:  # the client left before the answer
            await turn.abort()
            turn.finish(CLIENT_GONE)
            raise
        except Exception as exc:  # answered and logged, never swallowed
            log.exception("%s request crashed", endpoint)
            await turn.abort()
            turn.finish(500)
            return error_answer(GatewayError(f"internal error: {type(exc).__name__}"))
        if not turn.streaming:
            turn.finish(response.status_code)
        return response

    def close(self) -> None:
        """Stop the tokenizer's process, if one was started (the app's shutdown)."""
        self.tokens.close()


__all__ = ["TurnService"]
