"""What `up` prints once the cluster is up, from literal facts."""

from __future__ import annotations

import dataclasses

from cli.startup_text import StartupFacts, planner_line, startup_text

FACTS = StartupFacts(
    gateway_url="http://127.0.0.1:18000",
    console_url="http://127.0.0.1:18501",
    store="sqlite:///data/evolving.db",
    auth="keys",
    planner="evolving",
    mode="auto",
    mode_persisted=False,
    requested_mode="auto",
    model="demo-model",
    key="sk-ei-secret",
    key_file="data/demo-api-key",
    load="agent load running",
)


def test_the_planner_mode_is_said_and_so_is_a_persisted_choice_that_wins() -> None:
    assert planner_line(FACTS) == "planner:  evolving, mode auto (moves the split itself)"
    kept = dataclasses.replace(FACTS, mode="advisory", mode_persisted=True)
    line = planner_line(kept)
    assert "mode advisory (records what it would do" in line and "wins over --planner-mode auto" in line
    same = dataclasses.replace(FACTS, mode_persisted=True)  # persisted, but the same: nothing to explain
    assert "\n" not in planner_line(same)
    assert "none" in planner_line(dataclasses.replace(FACTS, planner="none"))


def test_the_snippet_uses_the_checked_key_and_finishes_its_branch() -> None:
    text = startup_text(FACTS, "admin token: ...")
    assert "console:  http://127.0.0.1:18501" in text
    assert 'api_key="sk-ei-secret"' in text and '"X-Branch-Finished": "true"' in text and '"X-Branch-ID"' in text
    assert "(checked against the store)" in text and text.endswith("load:     agent load running")
    code = text.split("try it:\n", 1)[1].split("\nload:", 1)[0]
    compile(code, "snippet", "exec")  # valid Python, as printed


def test_no_usable_key_gives_a_hint_and_a_placeholder_never_a_dead_key() -> None:
    bad = dataclasses.replace(FACTS, key=None, key_problem="the key in data/demo-api-key is not valid; delete it")
    text = startup_text(bad, "")
    assert "demo key: NONE — the key in data/demo-api-key is not valid; delete it" in text
    assert 'api_key="<API key>"' in text and "sk-ei-secret" not in text


def test_a_console_that_failed_is_said_instead_of_its_url() -> None:
    down = dataclasses.replace(FACTS, console_url=None, console_problem="the console exited at start (status 1)")
    text = startup_text(down, "")
    assert "console:  NOT RUNNING — the console exited at start (status 1)" in text and "18501" not in text
    assert "console:" not in startup_text(dataclasses.replace(FACTS, console_url=None), "")
