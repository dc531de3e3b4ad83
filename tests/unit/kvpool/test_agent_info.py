"""kvpool.agent_info: the node's kv-agent.json, written atomically and read back."""

from __future__ import annotations

import json
import pathlib

from kvpool.agent_info import FILE_NAME, AgentInfo

INFO = AgentInfo(
    node_id="n0",
    agent_name="agent-n0",
    metadata_b64="bWV0YQ==",
    region_base=140000000000,
    block_bytes=65536,
    capacity_blocks=128,
)


def test_write_then_read_round_trips(tmp_path: pathlib.Path) -> None:
    run_dir = tmp_path / "run" / "n0"  # created by write
    INFO.write(run_dir)
    assert AgentInfo.read(run_dir) == INFO
    assert json.loads((run_dir / "kv-agent.json").read_text()) == {
        "node_id": "n0",
        "agent_name": "agent-n0",
        "metadata_b64": "bWV0YQ==",
        "region_base": 140000000000,
        "block_bytes": 65536,
        "capacity_blocks": 128,
    }


def test_write_leaves_only_the_file(tmp_path: pathlib.Path) -> None:
    INFO.write(tmp_path)
    AgentInfo(node_id="n0", agent_name="", metadata_b64="", region_base=0, block_bytes=1, capacity_blocks=1).write(
        tmp_path
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == [FILE_NAME]
    assert AgentInfo.read(tmp_path) == AgentInfo("n0", "", "", 0, 1, 1)  # the second write replaced the first


def test_read_before_write_is_none(tmp_path: pathlib.Path) -> None:
    assert AgentInfo.read(tmp_path / "missing") is None
    assert AgentInfo.read(tmp_path) is None
