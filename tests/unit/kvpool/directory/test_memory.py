"""The BlockDirectory contract, one suite for every backend.

`DirectoryContract` holds the tests; each backend subclasses it with a
`directory` fixture (memory here; Redis in tests/integration/test_kvpool_redis.py).
"""

from __future__ import annotations

import pytest

from kvpool.directory import BlockDirectory, BranchState, BranchStateError, MemoryDirectory
from kvpool.directory.base import BRANCH_TRANSITIONS, BranchEvent, next_branch_state
from testing.directory_contract import DirectoryContract


class TestMemoryDirectory(DirectoryContract):
    @pytest.fixture
    def directory(self) -> BlockDirectory:
        return MemoryDirectory()


def test_transition_table_is_the_only_truth() -> None:
    assert next_branch_state(None, BranchEvent.OPEN, "b") is BranchState.ACTIVE
    assert next_branch_state(BranchState.ACTIVE, BranchEvent.EXPIRE, "b") is BranchState.EXPIRED
    for event in (BranchEvent.TOUCH, BranchEvent.REFERENCE, BranchEvent.FINISH, BranchEvent.EXPIRE):
        with pytest.raises(BranchStateError):
            next_branch_state(None, event, "b")
    terminal = {BranchState.FINISHED, BranchState.EXPIRED}
    assert not any(state in terminal for state, _ in BRANCH_TRANSITIONS)
