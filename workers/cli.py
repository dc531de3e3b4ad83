"""`evolving-infra worker`: one dual-phase worker process."""

from __future__ import annotations

import argparse
import json
import os

from core import Phase
from core.tracing import TraceSettings
from workers.engine import EngineConfig


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    p = parser or argparse.ArgumentParser(prog="evolving-infra worker")
    p.add_argument("--model", required=True, help="local Hugging Face model folder")
    p.add_argument("--port", type=int, default=8100)
    p.add_argument("--host", default="127.0.0.1", help="bind address (loopback by default)")
    p.add_argument("--phase", choices=[x.value for x in Phase], default="decode")
    p.add_argument("--node-id", default=None, help="defaults to w<port>")
    p.add_argument("--block-size", type=int, default=32)
    p.add_argument(
        "--max-model-len", type=int, default=None, help="context length (default: the model's own, from config.json)"
    )
    p.add_argument(
        "--hf-overrides",
        type=json.loads,
        default=None,
        help='vLLM\'s hf_overrides as JSON, e.g. \'{"max_position_embeddings": 32768, "rope_parameters": '
        '{"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8192, "rope_theta": 100000}}\' '
        "with --max-model-len 32768 to serve past the model's own context (vLLM's dynamic NTK does not: its "
        "rope table keeps the model's own length)",
    )
    p.add_argument("--max-num-seqs", type=int, default=64)
    p.add_argument(
        "--dtype",
        choices=["auto", "bfloat16", "float32", "float16"],
        default="auto",
        help="weights and activations (auto: bfloat16 where the CPU computes it natively, else float32)",
    )
    p.add_argument("--kvcache-gib", type=int, default=1, help="device KV cache (VLLM_CPU_KVCACHE_SPACE)")
    p.add_argument("--kv-store-gib", type=float, default=0.25, help="host block store shared via the KV pool")
    p.add_argument("--no-kv-pool", action="store_true", help="run without the KV pool connector")
    p.add_argument(
        "--kv-pull-timeout-s",
        type=float,
        default=3.0,
        help="deadline of one pull from a peer's host store; past it the blocks are recomputed",
    )
    p.add_argument("--threads-bind", default=None, help="VLLM_CPU_OMP_THREADS_BIND, e.g. 0 or 0-1")
    p.add_argument(
        "--http-cpus",
        default=None,
        help="move this process's own threads (HTTP, output handling) to these CPUs once the engine "
        "is up: 'auto' = every CPU outside --threads-bind, or a list like 2-3 (default: leave them)",
    )
    p.add_argument(
        "--executor",
        choices=["uni", "mp"],
        default="uni",
        help="uni: the engine-core process runs the model (default); mp: vLLM-CPU's separate model "
        "process, whose reader busy-polls a core between steps",
    )
    p.add_argument(
        "--structured-outputs-backend",
        choices=["auto", "xgrammar", "guidance", "outlines"],
        default="auto",
        help="vLLM's backend for response_format / tool-call constraints (default auto: xgrammar where it can)",
    )
    p.add_argument(
        "--json-no-whitespace",
        action="store_true",
        help="constrained JSON has no free whitespace (compact JSON; needs xgrammar or guidance). "
        "For models that would otherwise pad JSON with whitespace forever, e.g. the random demo model",
    )
    p.add_argument(
        "--stock-cpu-sampler",
        action="store_true",
        help="chaos testing only: vLLM-CPU's own sampler, whose seeded requests with a prompt over the "
        "chunked-prefill budget kill the engine (a real poison request; workers/seeded_cpu.py). "
        "An engine restarted in place gets the fixed sampler",
    )
    p.add_argument(
        "--vllm-tracing",
        action="store_true",
        help="with traces on (OTEL_EXPORTER_OTLP_ENDPOINT), vLLM's own request span joins each trace too "
        "(vLLM then traces every request it finishes, whatever the sampling ratio)",
    )
    p.add_argument(
        "--engine-restarts",
        type=int,
        default=5,
        help="restarts of a dead engine core inside this process within 10 minutes (backoff from 0.2 s); "
        "past them /healthz says engine_dead and the supervisor relaunches the process; 0: never",
    )
    p.add_argument("--run-dir", default="data/run")
    p.add_argument(
        "--cluster-token",
        default=None,
        help="require this bearer token on /internal (default: env EVOLVING_CLUSTER_TOKEN)",
    )
    return p


def run(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        # Traces: the standard OTEL_* names (core.tracing); off without an endpoint.
        traces = TraceSettings.from_otel_env(os.environ)
        config = EngineConfig(
            model=args.model,
            node_id=args.node_id or f"w{args.port}",
            block_size=args.block_size,
            max_model_len=args.max_model_len,
            hf_overrides=args.hf_overrides,
            dtype=args.dtype,
            max_num_seqs=args.max_num_seqs,
            kvcache_gib=args.kvcache_gib,
            kv_store_gib=args.kv_store_gib,
            kv_pool=not args.no_kv_pool,
            kv_pull_timeout_s=args.kv_pull_timeout_s,
            threads_bind=args.threads_bind,
            http_cpus=args.http_cpus,
            executor=args.executor,
            run_dir=args.run_dir,
            structured_outputs_backend=args.structured_outputs_backend,
            json_no_whitespace=args.json_no_whitespace,
            seeded_cpu_sampler=not args.stock_cpu_sampler,
            otlp_traces_endpoint=traces.endpoint if args.vllm_tracing else None,
        )
    except ValueError as exc:
        raise SystemExit(f"evolving-infra worker: {exc}") from None
    token = args.cluster_token or os.environ.get("EVOLVING_CLUSTER_TOKEN") or None
    if args.host not in ("127.0.0.1", "localhost", "::1") and not token:
        raise SystemExit("a worker bound beyond loopback needs --cluster-token (or EVOLVING_CLUSTER_TOKEN)")
    if token:
        # vLLM's engine process inherits it: the KV connector presents it to
        # peers when it fetches their /internal/kv/agent.
        os.environ["EVOLVING_CLUSTER_TOKEN"] = token
    if config.otlp_traces_endpoint:
        os.environ["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"] = "http/protobuf"  # vLLM's exporter: ours, not gRPC
    import uvicorn

    from workers.restart_policy import RestartPolicy
    from workers.server import create_app
    from workers.telemetry import WorkerTracing

    tracing = WorkerTracing.build(traces, node_id=config.node_id)
    restarts = RestartPolicy(base_delay_s=0.2, max_restarts=max(0, args.engine_restarts))
    app = create_app(config, Phase(args.phase), cluster_token=token, tracing=tracing, engine_restarts=restarts)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", timeout_graceful_shutdown=5)
    return 0


if __name__ == "__main__":
    raise SystemExit(run())
