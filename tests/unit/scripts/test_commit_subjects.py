"""The commit subject rule (scripts/commit_subjects.py, run by `make lint` and the commit-msg hook)."""

import importlib.util
import pathlib
import subprocess
import sys

import pytest

SCRIPTS = pathlib.Path(__file__).resolve().parents[3] / "scripts"
_spec = importlib.util.spec_from_file_location("commit_subjects", SCRIPTS / "commit_subjects.py")
assert _spec is not None and _spec.loader is not None
commit_subjects = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(commit_subjects)


@pytest.mark.parametrize(
    ("message", "subject"),
    [
        ("Add a thing\n\nwhy it was added\n", "Add a thing"),
        ("# Please enter the commit message\n\nFix the pin rule\n", "Fix the pin rule"),
        ("\n\n", ""),
    ],
)
def test_the_subject_is_the_first_line_that_is_not_a_comment(message: str, subject: str) -> None:
    assert commit_subjects.subject(message) == subject


def test_72_characters_pass_and_73_are_refused() -> None:
    assert commit_subjects.check_message("x" * 72 + "\n\nbody " * 50) is None
    assert "73 characters" in commit_subjects.check_message("x" * 73)


def test_the_hook_refuses_a_long_subject_and_takes_a_short_one(tmp_path: pathlib.Path) -> None:
    long_msg, short_msg = tmp_path / "long", tmp_path / "short"
    long_msg.write_text("y" * 80 + "\n")
    short_msg.write_text("Short subject\n\n" + "z" * 200 + "\n")
    hook = [sys.executable, str(SCRIPTS / "commit-msg")]
    refused = subprocess.run([*hook, str(long_msg)], capture_output=True, text=True)
    assert refused.returncode == 1 and "80 characters" in refused.stderr
    assert subprocess.run([*hook, str(short_msg)], capture_output=True).returncode == 0
