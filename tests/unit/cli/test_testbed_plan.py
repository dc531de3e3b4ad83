"""cli.testbed.plan: names and addresses, leftovers by prefix, and reading back
what UCX used from its own log (literal log lines from UCX 1.23)."""

# ruff: noqa: E501  (the UCX log lines below are literal)
from __future__ import annotations

import pytest

from cli.testbed.plan import owned, parse_netns_list, parse_ucx_transport, plan_layout


def test_layout_names_and_addresses() -> None:
    lay = plan_layout("ei-tb", ["gw", "w1", "w2"])
    assert lay.bridge_ns == "ei-tb-br"
    assert [(h.name, h.netns, h.addr, h.veth) for h in lay.hosts] == [
        ("gw", "ei-tb-gw", "10.231.0.10", "v-gw"),
        ("w1", "ei-tb-w1", "10.231.0.11", "v-w1"),
        ("w2", "ei-tb-w2", "10.231.0.12", "v-w2"),
    ]
    assert lay.prefix_len == 24
    assert lay.namespaces == ["ei-tb-gw", "ei-tb-w1", "ei-tb-w2", "ei-tb-br"]
    assert lay.host("w2").addr == "10.231.0.12"
    with pytest.raises(KeyError, match="no host 'w9'"):
        lay.host("w9")


@pytest.mark.parametrize(
    ("prefix", "hosts", "message"),
    [
        ("Bad", ["a"], "bad testbed prefix 'Bad'"),
        ("ei-tb", ["has space"], "bad host name 'has space'"),
        ("ei-tb", ["a-b"], "bad host name 'a-b'"),
        ("ei-tb", ["averylonghost"], "bad host name 'averylonghost'"),
        ("ei-tb", ["br"], "host names must be distinct and not 'br'"),
        ("ei-tb", ["a", "a"], "host names must be distinct"),
    ],
)
def test_layout_refuses_bad_names(prefix: str, hosts: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        plan_layout(prefix, hosts)


def test_layout_refuses_a_subnet_too_small() -> None:
    with pytest.raises(ValueError, match="too small"):
        plan_layout("ei-tb", ["a", "b", "c", "d", "e"], subnet="10.0.0.0/28")


def test_netns_list_and_what_a_prefix_owns() -> None:
    names = parse_netns_list("ei-tb-gw (id: 2)\nei-tb-w1\nei-tb-t-gw (id: 0)\nother-ns\n\nei-tbx-gw\n")
    assert names == ["ei-tb-gw", "ei-tb-w1", "ei-tb-t-gw", "other-ns", "ei-tbx-gw"]
    assert owned(names, "ei-tb-t") == ["ei-tb-t-gw"]
    assert owned(names, "ei-tb") == ["ei-tb-gw", "ei-tb-w1"]  # not the tests' testbed beside it


TCP_LOG = """\
[1796157406.485124] [vm:11717:1]      ucp_worker.c:1997 UCX  INFO    dgB-11717-bc9320dc self cfg#0 rma_am(tcp/eth0)  am(tcp/eth0)
[1796157406.485124] [vm:11717:1]      ucp_worker.c:1997 UCX  INFO    dgB-11717-bc9320dc inter-node cfg#1 rma_am(tcp/eth0)  amo_am(tcp/eth0)  am(tcp/eth0)  ka(tcp/eth0)
[1796154512.185936] [vm:16124:0]   +--------+--------------------+------------------------------------+
[1796154512.185936] [vm:16124:0]   | reader self cfg#0                                                |
[1796154512.185936] [vm:16124:0]   | remote memory read by ucp_get*(multi) into host memory from host |
[1796154512.185936] [vm:16124:0]   +--------+--------------------+------------------------------------+
[1796154512.185936] [vm:16124:0]   | 0..inf | zero-copy          | tcp/eth0                           |
[1796154512.185936] [vm:16124:0]   +--------+--------------------+------------------------------------+
[1796154512.185936] [vm:16124:0]   | reader inter-node cfg#1                                          |
[1796154512.185936] [vm:16124:0]   | remote memory read by ucp_get*(multi) into host memory from host |
[1796154512.185936] [vm:16124:0]   +--------+--------------------+------------------------------------+
[1796154512.185936] [vm:16124:0]   | Range  |    Description     |               Config               |
[1796154512.185936] [vm:16124:0]   +--------+--------------------+------------------------------------+
[1796154512.185936] [vm:16124:0]   | 0..inf | software emulation | tcp/eth0                           |
[1796154512.185936] [vm:16124:0]   +--------+--------------------+------------------------------------+
"""

CMA_LOG = """\
[1796155733.183387] [vm:31731:0]      ucp_worker.c:1997 UCX  INFO    reader intra-node cfg#1 rma_am(tcp/eth0)  amo_am(tcp/eth0)  am(tcp/eth0 cma/memory)  ka(tcp/eth0)
[1796155733.343346] [vm:31731:0]   | reader intra-node cfg#1                                   |
[1796155733.343346] [vm:31731:0]   | remote memory read by ucp_get*(multi) into host memory from host |
[1796155733.343346] [vm:31731:0]   +--------+-------------+-------------------------------------------+
[1796155733.343346] [vm:31731:0]   | 0..inf | zero-copy   | cma/memory                                |
"""


def test_ucx_over_tcp_is_read_back_from_its_log() -> None:
    ucx = parse_ucx_transport(TCP_LOG)
    assert ucx is not None
    assert (ucx.peer_kind, ucx.lanes, ucx.get_protocol) == ("inter-node", ("tcp/eth0",), "software emulation tcp/eth0")
    assert ucx.shared_memory_free


def test_ucx_that_saw_the_same_host_shows_cma() -> None:
    ucx = parse_ucx_transport(CMA_LOG)
    assert ucx is not None
    assert (ucx.peer_kind, ucx.lanes, ucx.get_protocol) == (
        "intra-node",
        ("tcp/eth0", "cma/memory"),
        "zero-copy cma/memory",
    )
    assert not ucx.shared_memory_free


def test_protocol_tables_alone_name_the_peer_kind() -> None:
    tables = "\n".join(line for line in TCP_LOG.splitlines() if "UCX  INFO" not in line)
    ucx = parse_ucx_transport(tables)
    assert ucx is not None and (ucx.peer_kind, ucx.lanes) == ("inter-node", ("tcp/eth0",))


def test_a_log_without_any_endpoint_gives_nothing() -> None:
    assert parse_ucx_transport("[1] [vm:1:0]  UCX  INFO  UCX_* env variables: UCX_TLS=tcp\n") is None
