"""Containers of a rendered Helm chart as `podman run` arguments (pure).

tests/containers starts the product's images the way the chart starts them;
this module reads what to start from the rendered manifest, never from a
second copy of it: image, command and args (Kubernetes `$(VAR)` references
expanded), environment (plain values, Secret keys, the pod's own name), user,
read-only root filesystem, capabilities, no-new-privileges, volume mounts,
ports and the readiness probe.

Kubernetes semantics kept: `command` replaces the image's ENTRYPOINT and
`args` its CMD; the container's securityContext wins over the pod's;
`$(NAME)` expands only names defined earlier in the container's env and
`$$(NAME)` stays literal; of two env entries with one name the later wins.

What the caller decides (a pod network and a kubelet do not exist here):
where each volume lives on the host (`VolumeBinding`), and the host names
that stand in for cluster DNS (`add_hosts`). Nothing here runs a process.
"""

from __future__ import annotations

import base64
import re
from dataclasses import dataclass, field
from typing import Any

_VAR_REF = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")
MEMORY_UNITS = {"Ki": 1024, "Mi": 1024**2, "Gi": 1024**3, "Ti": 1024**4}


class ChartPodError(ValueError):
    """The rendered object lacks what the chart promised (a container, a Secret key, a volume)."""


@dataclass(frozen=True)
class Mount:
    """One volumeMount. `volume` is the pod volume's name; `source` its definition."""

    volume: str
    target: str
    read_only: bool
    source: dict[str, Any]

    @property
    def memory_backed(self) -> bool:
        return self.source.get("emptyDir", {}).get("medium") == "Memory"

    @property
    def size_limit_bytes(self) -> int | None:
        limit = self.source.get("emptyDir", {}).get("sizeLimit")
        return None if limit is None else quantity_bytes(str(limit))


@dataclass(frozen=True)
class Probe:
    path: str
    port: int


@dataclass(frozen=True)
class ContainerRun:
    """One container of one pod, as the kubelet would start it."""

    pod: str
    name: str
    image: str
    command: list[str]
    args: list[str]
    env: dict[str, str]
    user: str | None  # "uid:gid" from runAsUser/runAsGroup; None keeps the image's USER
    read_only_root: bool
    no_new_privileges: bool
    cap_drop: list[str]
    cap_add: list[str]
    mounts: list[Mount]
    ports: dict[str, int]
    readiness: Probe | None
    grace_s: int
    init: bool = False
    env_names: list[str] = field(default_factory=list)  # as rendered, in order (duplicates kept)

    @property
    def container_name(self) -> str:
        return f"{self.pod}-{self.name}"

    def podman_args(self, volumes: dict[str, VolumeBinding], add_hosts: dict[str, str]) -> list[str]:
        """`podman run` options and the image/command (everything after `podman run`)."""
        out = ["--name", self.container_name, "--network=host"]
        for host, address in sorted(add_hosts.items()):
            out += ["--add-host", f"{host}:{address}"]
        if self.user:
            out += ["--user", self.user]
        if self.read_only_root:
            # Podman would put tmpfs on /tmp, /var/tmp and /run of a read-only
            # container; Kubernetes does not, so neither do we: only the
            # chart's volumes are writable.
            out += ["--read-only", "--read-only-tmpfs=false"]
        if self.no_new_privileges:
            out += ["--security-opt", "no-new-privileges"]
        out += [f"--cap-drop={c}" for c in self.cap_drop]
        out += [f"--cap-add={c}" for c in self.cap_add]
        for mount in self.mounts:
            if mount.volume not in volumes:
                raise ChartPodError(f"{self.container_name}: no host binding for volume {mount.volume!r}")
            out += volumes[mount.volume].podman_args(mount)
        for name, value in self.env.items():
            out += ["--env", f"{name}={value}"]
        if self.command:
            # Kubernetes `command` replaces ENTRYPOINT; an empty list would keep it.
            out += ["--entrypoint", _json_list(self.command)]
        out += [self.image, *self.args]
        return out


@dataclass(frozen=True)
class VolumeBinding:
    """Where a pod volume lives on the host: a folder (bind) or memory (tmpfs)."""

    host_path: str | None = None
    tmpfs_bytes: int | None = None

    def podman_args(self, mount: Mount) -> list[str]:
        if self.host_path is not None:
            mode = "ro" if mount.read_only else "rw"
            return ["--volume", f"{self.host_path}:{mount.target}:{mode}"]
        size = f",tmpfs-size={self.tmpfs_bytes}" if self.tmpfs_bytes else ""
        ro = ",ro=true" if mount.read_only else ""
        # Mode 1777 as an emptyDir on memory: any user of the pod writes there.
        return ["--mount", f"type=tmpfs,destination={mount.target},tmpfs-mode=1777{size}{ro}"]


def _json_list(items: list[str]) -> str:
    import json

    return json.dumps(items)


def quantity_bytes(quantity: str) -> int:
    """A Kubernetes memory quantity ("8Gi", "512Mi", "1000") in bytes."""
    for suffix, factor in MEMORY_UNITS.items():
        if quantity.endswith(suffix):
            return int(float(quantity[: -len(suffix)]) * factor)
    return int(quantity)


def secrets_of(objects: list[dict[str, Any]]) -> dict[tuple[str, str], str]:
    """(Secret name, key) -> decoded value, over every rendered Secret."""
    out: dict[tuple[str, str], str] = {}
    for obj in objects:
        if obj.get("kind") != "Secret":
            continue
        name = obj["metadata"]["name"]
        for key, value in (obj.get("data") or {}).items():
            out[(name, key)] = base64.b64decode(value).decode()
        for key, value in (obj.get("stringData") or {}).items():
            out[(name, key)] = str(value)
    return out


def find_object(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    for obj in objects:
        if obj.get("kind") == kind and obj["metadata"]["name"] == name:
            return obj
    raise ChartPodError(f"the chart rendered no {kind} {name!r}")


def expand_refs(text: str, env: dict[str, str]) -> str:
    """Kubernetes' `$(VAR)` expansion: defined names expand, `$$` is a literal `$`,
    an undefined reference stays as written."""

    def sub(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name = match.group(1)
        return env.get(name, match.group(0))

    return _VAR_REF.sub(sub, text)


def _env(container: dict[str, Any], pod: str, secrets: dict[tuple[str, str], str]) -> dict[str, str]:
    env: dict[str, str] = {}
    for entry in container.get("env", []):
        name = entry["name"]
        if "value" in entry:
            env[name] = expand_refs(str(entry["value"]), env)
            continue
        source = entry.get("valueFrom", {})
        if "secretKeyRef" in source:
            ref = source["secretKeyRef"]
            key = (ref["name"], ref["key"])
            if key not in secrets:
                raise ChartPodError(f"{pod}/{container['name']}: env {name} needs Secret {key[0]} key {key[1]}")
            env[name] = secrets[key]
        elif source.get("fieldRef", {}).get("fieldPath") == "metadata.name":
            env[name] = pod
        else:
            raise ChartPodError(f"{pod}/{container['name']}: env {name} has a source this harness lacks: {source}")
    return env


def _port(probe_port: Any, ports: dict[str, int]) -> int:
    if isinstance(probe_port, int):
        return probe_port
    if probe_port not in ports:
        raise ChartPodError(f"probe port {probe_port!r} names no container port")
    return ports[probe_port]


def _container_run(
    container: dict[str, Any],
    pod_spec: dict[str, Any],
    pod: str,
    secrets: dict[tuple[str, str], str],
    *,
    init: bool,
) -> ContainerRun:
    env = _env(container, pod, secrets)
    pod_sc = pod_spec.get("securityContext") or {}
    sc = container.get("securityContext") or {}
    uid = sc.get("runAsUser", pod_sc.get("runAsUser"))
    gid = sc.get("runAsGroup", pod_sc.get("runAsGroup"))
    user = None if uid is None else (f"{uid}:{gid}" if gid is not None else str(uid))
    volumes = {v["name"]: {k: val for k, val in v.items() if k != "name"} for v in pod_spec.get("volumes", [])}
    mounts = []
    for m in container.get("volumeMounts", []):
        if m["name"] not in volumes:
            raise ChartPodError(f"{pod}/{container['name']}: mount of undefined volume {m['name']!r}")
        mounts.append(Mount(m["name"], m["mountPath"], bool(m.get("readOnly", False)), volumes[m["name"]]))
    ports = {p.get("name", str(p["containerPort"])): int(p["containerPort"]) for p in container.get("ports", [])}
    probe = (container.get("readinessProbe") or {}).get("httpGet")
    capabilities = sc.get("capabilities") or {}
    return ContainerRun(
        pod=pod,
        name=container["name"],
        image=container["image"],
        command=[expand_refs(str(c), env) for c in container.get("command", [])],
        args=[expand_refs(str(a), env) for a in container.get("args", [])],
        env=env,
        user=user,
        read_only_root=bool(sc.get("readOnlyRootFilesystem", False)),
        no_new_privileges=sc.get("allowPrivilegeEscalation") is False,
        cap_drop=list(capabilities.get("drop", [])),
        cap_add=list(capabilities.get("add", [])),
        mounts=mounts,
        ports=ports,
        readiness=None if probe is None else Probe(probe["path"], _port(probe["port"], ports)),
        grace_s=int(pod_spec.get("terminationGracePeriodSeconds", 30)),
        init=init,
        env_names=[e["name"] for e in container.get("env", [])],
    )


def pod_containers(workload: dict[str, Any], pod: str, secrets: dict[tuple[str, str], str]) -> list[ContainerRun]:
    """Init containers (in order) then containers of one pod of a Deployment or
    StatefulSet, named `pod` (a StatefulSet's pods are `<name>-<ordinal>`)."""
    spec = workload["spec"]["template"]["spec"]
    inits = [_container_run(c, spec, pod, secrets, init=True) for c in spec.get("initContainers", [])]
    mains = [_container_run(c, spec, pod, secrets, init=False) for c in spec["containers"]]
    return inits + mains


def service_hosts(objects: list[dict[str, Any]], namespace: str) -> list[str]:
    """Every DNS name a Service of the release answers to inside the cluster."""
    names = []
    for obj in objects:
        if obj.get("kind") == "Service":
            svc = obj["metadata"]["name"]
            names += [svc, f"{svc}.{namespace}", f"{svc}.{namespace}.svc", f"{svc}.{namespace}.svc.cluster.local"]
    return names
