"""`evolving-infra console`: run the Streamlit console in a child process.

    evolving-infra console [--admin-url URL] [--port 8501] [--address 127.0.0.1]

`cli.main` dispatches the `console` subcommand here (and `up` may call
`console_command` to start it beside the gateway). The admin URL reaches the
app through EVOLVING_ADMIN_URL, which `admin_ui.session` reads once.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence

from admin_ui.session import ADMIN_URL_ENV, DEFAULT_ADMIN_URL

APP_PATH = pathlib.Path(__file__).with_name("app.py")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="evolving-infra console", description="Operator console (Streamlit) for the gateway's admin API."
    )
    parser.add_argument(
        "--admin-url",
        default=os.environ.get(ADMIN_URL_ENV) or DEFAULT_ADMIN_URL,
        help=f"gateway base URL serving /admin (default: ${ADMIN_URL_ENV} or {DEFAULT_ADMIN_URL})",
    )
    parser.add_argument("--port", type=int, default=8501, help="console port (default 8501)")
    parser.add_argument(
        "--address", default="127.0.0.1", help="listen address (default 127.0.0.1; 0.0.0.0 in a container)"
    )
    return parser


def console_command(
    *, admin_url: str, port: int, address: str = "127.0.0.1", environ: Mapping[str, str] | None = None
) -> tuple[list[str], dict[str, str]]:
    """argv and environment for the Streamlit child process (pure; used by `up` too)."""
    if not 1 <= port <= 65535:
        raise ValueError(f"port must be in 1..65535, got {port}")
    if not admin_url.startswith(("http://", "https://")):
        raise ValueError(f"--admin-url must be an http(s) URL, got {admin_url!r}")
    argv = [
        sys.executable,
        "-m",
        "streamlit",
        "run",
        str(APP_PATH),
        "--server.headless=true",
        f"--server.port={port}",
        f"--server.address={address}",
        "--browser.gatherUsageStats=false",
        "--server.fileWatcherType=none",
        # Defence in depth: pages catch API errors themselves; anything
        # unexpected still must not show a traceback to an operator.
        "--client.showErrorDetails=none",
        "--client.toolbarMode=minimal",
    ]
    env = dict(os.environ if environ is None else environ)
    env[ADMIN_URL_ENV] = admin_url.rstrip("/")
    return argv, env


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        command, env = console_command(admin_url=args.admin_url, port=args.port, address=args.address)
    except ValueError as exc:
        print(f"evolving-infra console: {exc}", file=sys.stderr)
        return 2
    print(f"console on http://{args.address}:{args.port} (admin API {env[ADMIN_URL_ENV]})", file=sys.stderr)
    proc = subprocess.Popen(command, env=env)
    # SIGTERM (a supervisor, `kill`) must stop Streamlit too, not leave it
    # listening: handled like Ctrl-C.
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        return proc.wait()
    except KeyboardInterrupt:
        proc.terminate()
        try:
            return proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            return proc.wait()
    finally:
        signal.signal(signal.SIGTERM, previous)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


if __name__ == "__main__":
    raise SystemExit(main())
