"""pytest fixture `netns_testbed`: the multi-host testbed of cli/testbed.

Hosts `gw`, `w1`, `w2` (one network namespace each, joined by a bridge),
Redis and PostgreSQL relayed into each host's loopback, everything removed
when the module's tests end, also after a failure. Where no testbed can run
(not root, no `ip`, no namespace rights) the tests skip with that reason.
Tests using it are marked `testbed`.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from cli.testbed.netns import Testbed, unavailable_reason
from cli.testbed.relay import relay_services

PREFIX = "ei-tb-t"  # tests only: `testbed up` (ei-tb) and the bench (ei-tb-b) can run beside them
HOSTS = ["gw", "w1", "w2"]


def require_testbed() -> None:
    reason = unavailable_reason(PREFIX)
    if reason:
        pytest.skip(f"no network-namespace testbed here: {reason}")


@pytest.fixture(scope="module")
def netns_testbed() -> Iterator[Testbed]:
    require_testbed()
    with Testbed(HOSTS, prefix=PREFIX) as tb:
        relay_services(tb)
        yield tb
