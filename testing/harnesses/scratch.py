"""The scratch world one harness runs in: a folder with a few files (the task's
subject), a HOME of its own (no user config, credentials or history leaks in,
and the harness's own state stays out of the user's), and the environment a
CLI harness is started with.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import signal
import subprocess
import time
from dataclasses import dataclass

TASK = "list the files in this folder and tell me how many there are"
FOLLOW_UP = "Which of those files is the largest?"
FILES = {
    "README.md": "# Scratch project\n\nA folder for the harness suite.\n",
    "main.py": 'print("hello")\n',
    "notes.txt": "buy milk\ncall Ana\n" * 8,
    "data.csv": "id,value\n1,3\n2,5\n",
}
# What a child process may keep of this process' environment; the rest (keys,
# proxies, the user's config folders) stays out.
_KEEP_ENV = ("PATH", "LANG", "LC_ALL", "TZ", "TMPDIR", "SYSTEMROOT")


@dataclass(frozen=True)
class Scratch:
    root: pathlib.Path
    workdir: pathlib.Path  # the folder the task is about; the harness's working directory
    home: pathlib.Path

    @classmethod
    def create(cls, root: pathlib.Path) -> Scratch:
        workdir, home = root / "work", root / "home"
        workdir.mkdir(parents=True)
        home.mkdir(parents=True)
        for name, text in FILES.items():
            (workdir / name).write_text(text)
        return cls(root, workdir, home)

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: os.environ[k] for k in _KEEP_ENV if k in os.environ}
        env.update(
            HOME=str(self.home),
            XDG_CONFIG_HOME=str(self.home / ".config"),
            XDG_DATA_HOME=str(self.home / ".local" / "share"),
            XDG_CACHE_HOME=str(self.home / ".cache"),
            XDG_STATE_HOME=str(self.home / ".local" / "state"),
            NO_COLOR="1",
            CI="1",
        )
        env.update(extra)
        return env


@dataclass(frozen=True)
class TurnOutcome:
    exit_code: int  # the harness process' exit status (SDKs: 0 finished, 1 raised)
    output: str  # what it printed / answered (tail)
    detail: str = ""  # stderr tail or the exception
    tool_calls: int = 0  # tools the harness ran this turn, as it counts them (SDKs)
    elapsed_s: float = 0.0
    # False when this turn could not continue the harness's session and opened a new one:
    # the Agents SDK raises on an answer cut at the length limit and returns no response id
    # to chain from, so its next turn starts a new conversation (no previous_response_id).
    continues_session: bool = True


def run_cli(cmd: list[str], *, cwd: pathlib.Path, env: dict[str, str], timeout_s: float) -> TurnOutcome:
    """Run one non-interactive CLI turn; a timeout is exit code 124, as timeout(1) gives.

    The CLI runs in its own process group and a timeout kills the whole group: the npm
    entry points are Node shims around native binaries, which would outlive the shim
    (and hold the session's lock, failing the next turn's resume)."""
    start = time.monotonic()
    proc = subprocess.Popen(
        cmd, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        start_new_session=True,
    )  # fmt: skip
    try:
        out, err = proc.communicate(timeout=timeout_s)
        code = proc.returncode
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        try:
            out, err = proc.communicate(timeout=15)
        except subprocess.TimeoutExpired:  # a descendant that left the group still holds the pipes
            out, err = b"", b""
        code, err = 124, f"timed out after {timeout_s:.0f} s\n".encode() + err
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # what the CLI left running
    return TurnOutcome(
        code,
        out.decode("utf-8", "replace")[-4000:],
        err.decode("utf-8", "replace")[-4000:],
        0,
        time.monotonic() - start,
    )
