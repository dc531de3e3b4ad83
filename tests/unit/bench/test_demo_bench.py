"""The pure parts of `bench demo`: what it reads from `up`'s output and the admin API."""

from __future__ import annotations

from bench.demo_bench import admin_token, load_phase_lines, planner_switches

LOG = """\
starting 2 workers (1 prefill); logs in /tmp/x/logs
admin token (operator; shown only this once, store it now):
  eia-SECRET
  use it as `Authorization: Bearer <token>` on /admin and in the console
phase 1 prefill-heavy [####....] 30/150 s  done 12 (err 0)
phase 1 prefill-heavy: 150 s, 4 agents, 300 requests (0 errors), prompt 1990 tok (12% cached)
phase 2 decode-heavy: 150 s, 8 agents, 280 requests (0 errors), prompt 250 tok (80% cached)
"""


def test_reads_the_printed_token_and_the_phase_summaries() -> None:
    assert admin_token(LOG) == "eia-SECRET"
    assert admin_token("admin token: the one in EVOLVING_ADMIN_TOKEN") is None
    assert load_phase_lines(LOG) == LOG.splitlines()[5:7]


def test_counts_only_the_planners_finished_switches_oldest_first() -> None:
    items = [
        {"t": 3.0, "who": "planner:evolving", "outcome": "ok", "node_id": "w0"},
        {"t": 1.0, "who": "planner:evolving", "outcome": "ok", "node_id": "w1"},
        {"t": 2.0, "who": "planner:evolving", "outcome": "failed", "node_id": "w0"},
        {"t": 4.0, "who": "bootstrap", "outcome": "ok", "node_id": "w0"},
        {"t": 5.0, "who": "pin", "outcome": "ok", "node_id": "w0"},
    ]
    assert [s["t"] for s in planner_switches(items)] == [1.0, 3.0]
