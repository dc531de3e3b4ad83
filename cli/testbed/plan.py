"""The testbed's layout and what it reads back, as pure data (no I/O).

Names: a `prefix` (default "ei-tb") owns the bridge namespace `<prefix>-br`
and one namespace `<prefix>-<host>` per host; a crashed run's leftovers are
found by that prefix. Addresses come from one /24 subnet, host i gets
.10+i on its `eth0`; the bridge has no address. UCX is limited to TCP on
that interface, so neither shared memory nor CMA can carry a block.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field

IFNAME = "eth0"
BRIDGE = "br0"
_PREFIX = re.compile(r"^[a-z][a-z0-9-]{0,10}$")
# No '-' in a host name: `<prefix>-<host>` then never matches a longer prefix's
# names ("ei-tb" does not own "ei-tb-t-gw"); short enough for "v-<host>" (IFNAMSIZ).
_HOST = re.compile(r"^[a-z][a-z0-9]{0,10}$")

# TCP only, on the host's own interface. Bigger segments: 16 MiB reads went
# from 0.17 to ~1.3 GB/s across namespaces (docs/benchmarks-history.md).
NETWORK_UCX_ENV = {
    "UCX_TLS": "tcp",
    "UCX_NET_DEVICES": IFNAME,
    "UCX_TCP_TX_SEG_SIZE": "4mb",
    "UCX_TCP_RX_SEG_SIZE": "4mb",
}


@dataclass(frozen=True)
class Host:
    name: str  # as the user names it ("gw", "w1", ...)
    netns: str  # <prefix>-<name>
    addr: str  # its address on eth0
    veth: str  # its cable's end in the bridge namespace


@dataclass(frozen=True)
class Layout:
    prefix: str
    hosts: tuple[Host, ...]
    prefix_len: int
    bridge_ns: str = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "bridge_ns", f"{self.prefix}-br")

    def host(self, name: str) -> Host:
        for h in self.hosts:
            if h.name == name:
                return h
        raise KeyError(f"no host {name!r} in the testbed (hosts: {', '.join(h.name for h in self.hosts)})")

    @property
    def namespaces(self) -> list[str]:
        return [h.netns for h in self.hosts] + [self.bridge_ns]


def plan_layout(prefix: str, hosts: list[str], subnet: str = "10.231.0.0/24") -> Layout:
    """Names and addresses for `hosts`; raises ValueError on bad names or too many hosts."""
    if not _PREFIX.match(prefix):
        raise ValueError(f"bad testbed prefix {prefix!r}: lowercase letters, digits and '-', at most 11 characters")
    for name in hosts:
        if not _HOST.match(name):
            raise ValueError(f"bad host name {name!r}: lowercase letters and digits, at most 11 characters")
    if "br" in hosts or len(set(hosts)) != len(hosts):
        raise ValueError("host names must be distinct and not 'br' (the bridge namespace)")
    net = ipaddress.ip_network(subnet)
    if net.num_addresses < len(hosts) + 12:
        raise ValueError(f"subnet {subnet} is too small for {len(hosts)} hosts")
    return Layout(
        prefix,
        tuple(
            Host(name, f"{prefix}-{name}", str(net.network_address + 10 + i), f"v-{name}")
            for i, name in enumerate(hosts)
        ),
        net.prefixlen,
    )


def owned(netns_names: list[str], prefix: str) -> list[str]:
    """The namespaces in `ip netns list` that a testbed with `prefix` created."""
    return [n for n in netns_names if n.startswith(prefix + "-") and _HOST.match(n[len(prefix) + 1 :])]


def parse_netns_list(text: str) -> list[str]:
    """Names from `ip netns list` ("name" or "name (id: N)" per line)."""
    return [line.split()[0] for line in text.splitlines() if line.strip()]


@dataclass(frozen=True)
class UcxTransport:
    """What UCX reported it used (from its own log at info level)."""

    peer_kind: str  # "inter-node" (network) or "intra-node" (UCX saw the same host)
    lanes: tuple[str, ...]  # transports/devices of the endpoint's lanes, e.g. ("tcp/eth0",)
    get_protocol: str  # how a READ (ucp_get) moves: "software emulation tcp/eth0", "zero-copy cma/memory"

    @property
    def shared_memory_free(self) -> bool:
        """No lane nor READ protocol uses shared memory or CMA."""
        text = " ".join((*self.lanes, self.get_protocol))
        return not any(t in text for t in ("cma", "posix", "sysv", "xpmem", "knem"))


_LANES = re.compile(r"UCX\s+INFO\s+\S+ (inter-node|intra-node) cfg#\d+ (.+)$")
_LANE_ITEM = re.compile(r"\(([^)]*)\)")
_TITLE = re.compile(r"\|\s*\S+ (self|inter-node|intra-node) cfg#\d+\s*\|")
_ROW = re.compile(r"\|\s*(\d+\.\.\S+)\s*\|\s*([^|]+?)\s*\|\s*([^|]+?)\s*\|")


def parse_ucx_transport(log_text: str) -> UcxTransport | None:
    """What the first endpoint to a peer used: its lanes (UCX_LOG_LEVEL=info)
    and the READ protocol (UCX_PROTO_INFO=y), from a UCX log. None when the
    log shows no endpoint to another process."""
    kind, lanes = "", tuple[str, ...]()
    for line in log_text.splitlines():
        m = _LANES.search(line)
        if m:
            kind = m.group(1)
            found: list[str] = []
            for item in _LANE_ITEM.findall(m.group(2)):
                found += [tl for tl in item.split() if tl not in found]
            lanes = tuple(found)
            break
    get = _get_protocol(log_text)
    if not kind:  # UCX_PROTO_INFO without the info level: the tables name the peer's kind
        titles = [m.group(1) for m in map(_TITLE.search, log_text.splitlines()) if m and m.group(1) != "self"]
        if not titles:
            return None
        kind = titles[0]
        lanes = tuple(dict.fromkeys(row.rsplit(" ", 1)[-1] for row in get.split("; ") if row))
    return UcxTransport(kind, lanes, get)


def _get_protocol(log_text: str) -> str:
    """Rows of the first `ucp_get` protocol table of an endpoint to a peer."""
    title, reading = "", False
    rows: list[str] = []
    for line in log_text.splitlines():
        m = _TITLE.search(line)
        if m:
            title = m.group(1)
            if reading:
                break
            continue
        if "remote memory read by ucp_get" in line:
            if rows:
                break
            reading = title != "self"
            continue
        if reading:
            row = _ROW.search(line)
            if row:
                rows.append(f"{row.group(2)} {row.group(3)}")
            elif rows and "+--" not in line and "Range" not in line:
                break
    return "; ".join(dict.fromkeys(rows))
