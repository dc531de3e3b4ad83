"""Fail when a commit subject is longer than 72 characters.

`make lint` runs it over the commits after BASE (history before it is left as
it is, not rewritten); `scripts/commit-msg` runs `check_message` on a
message as it is committed (`make hooks` installs it).

    python scripts/commit_subjects.py [BASE]    # exit 1 naming each long subject
"""

from __future__ import annotations

import subprocess
import sys

MAX_SUBJECT = 72
BASE = "316dc42"  # main when the rule came in; earlier subjects are history


def subject(message: str) -> str:
    """The first line that is not a git comment ('#') nor blank."""
    for line in message.splitlines():
        if line.strip() and not line.startswith("#"):
            return line.rstrip()
    return ""


def check_message(message: str) -> str | None:
    """Why the message's subject is refused, or None."""
    s = subject(message)
    if len(s) > MAX_SUBJECT:
        return f"subject is {len(s)} characters (at most {MAX_SUBJECT}): {s[:MAX_SUBJECT]}..."
    return None


def long_subjects(base: str = BASE) -> list[str]:
    """'<hash> <length>: <subject>' for each commit after `base` (to HEAD) over the limit."""
    out = subprocess.run(
        ["git", "log", "--no-merges", "--format=%h%x00%s", f"{base}..HEAD"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    found = []
    for row in out.splitlines():
        sha, _, s = row.partition("\0")
        if len(s) > MAX_SUBJECT:
            found.append(f"{sha} {len(s)}: {s[:MAX_SUBJECT]}...")
    return found


def main(argv: list[str]) -> int:
    base = argv[1] if len(argv) > 1 else BASE
    known = subprocess.run(["git", "cat-file", "-e", f"{base}^{{commit}}"], capture_output=True)
    if known.returncode != 0:
        print(f"commit subjects: base {base} is not in this clone (shallow?); nothing checked", file=sys.stderr)
        return 0
    found = long_subjects(base)
    for line in found:
        print(line, file=sys.stderr)
    if found:
        print(
            f"{len(found)} commit subject(s) over {MAX_SUBJECT} characters; the detail goes in the body",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
