"""`evolving-infra bench images`: build the container images, run them as the
Helm chart starts them (testing.chart_scenario), print one JSON object.

    evolving-infra bench images --json [--build] [--no-cache] [--base-image IMG]

Keys: `images` (per image: `size_mb`, `build_s`), `base_s` (debootstrap base;
0 when cached or a registry base was used), `started`, `request_ok`,
`switch_ok`, `switch_s`, `model` (the id served), `nixl_ok` (every worker
started its NIXL agent), `all_prefill_ok` (a request served with every
worker pinned to prefill), `stop_s`, `clean_stop`, `read_only_root`,
`bench_or_testing_in_images`, `ready_s`. Without --build the last build's
times come from bench-output/images-build.jsonl (`make images` writes it).
Needs root and podman; see docs/operations.md, "Container images".
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys

from testing import podman
from testing.chart_scenario import DEMO_MODEL, ScenarioConfig, run_scenario
from testing.vllm_cluster import free_port

ROOT = pathlib.Path(__file__).resolve().parents[1]
BUILD_REPORT = ROOT / "bench-output" / "images-build.jsonl"


def build(no_cache: bool, base_image: str | None) -> None:
    env = dict(os.environ, REPORT=str(BUILD_REPORT))
    if no_cache:
        env["NO_CACHE"] = "1"
        env["FORCE"] = "1"  # the debootstrap base too
    if base_image:
        env["BASE_IMAGE"] = base_image
    # The build's own log goes to stderr: stdout is the JSON object.
    subprocess.run([str(ROOT / "images" / "build.sh")], env=env, stdout=sys.stderr, check=True)


def read_builds() -> dict[str, dict]:
    if not BUILD_REPORT.exists():
        return {}
    rows = [json.loads(line) for line in BUILD_REPORT.read_text().splitlines() if line.strip()]
    return {r["image"]: r for r in rows}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="evolving-infra bench images", description=__doc__.splitlines()[0])
    p.add_argument("--json", action="store_true", help="print only the JSON object")
    p.add_argument("--build", action="store_true", help="run images/build.sh first (cached layers reused)")
    p.add_argument("--no-cache", action="store_true", help="with --build: every layer and the base again")
    p.add_argument("--base-image", default=None, help="registry base instead of the debootstrap one")
    p.add_argument("--repo", default=os.environ.get("IMAGE_REPO", "localhost/evolving-infra"))
    p.add_argument("--tag", default=os.environ.get("IMAGE_TAG", "0.1.0"))
    p.add_argument("--model", default=str(DEMO_MODEL), help="model folder mounted read-only (default data/demo-model)")
    args = p.parse_args(argv)
    reason = podman.available()
    if reason:
        print(f"bench images: {reason}", file=sys.stderr)
        return 2
    if args.build:
        build(args.no_cache, args.base_image)
    product = f"{args.repo}/evolving-infra:{args.tag}"
    worker = f"{args.repo}/evolving-infra-worker-cpu:{args.tag}"
    builds = read_builds()
    images = {}
    for image in (product, worker):
        if not podman.image_exists(image):
            print(f"bench images: {image} is not built; run `make images` or pass --build", file=sys.stderr)
            return 2
        row = builds.get(image, {})
        images[image] = {"size_mb": podman.image_size_mb(image), "build_s": row.get("build_s")}
    ports = sorted({free_port() for _ in range(8)})
    cfg = ScenarioConfig(
        model_dir=pathlib.Path(args.model).resolve(),
        product_image=product,
        worker_image=worker,
        gateway_port=ports[0],
        console_port=ports[1],
        worker_ports=(ports[2], ports[3]),
    )
    run = run_scenario(cfg)
    checked = run.get("images_checked", {})
    out = {
        "images": images,
        "base_s": max((r.get("base_s", 0) for r in builds.values()), default=0),
        "started": run["started"],
        "request_ok": run["request_ok"],
        "switch_ok": run["switch_ok"],
        "switch_s": run.get("switch", {}).get("s"),
        "model": run.get("model"),
        "nixl_ok": run["nixl_ok"],
        "all_prefill_ok": run.get("all_prefill_request", {}).get("ok", False),
        "stop_s": run.get("stop_s"),
        "clean_stop": run.get("clean_stop", False),
        "read_only_root": run["read_only_root"],
        "bench_or_testing_in_images": sorted({p for c in checked.values() for p in c["bench_or_testing"]}),
        "missing_in_images": {i: c["missing_env"] + c["missing_commands"] for i, c in checked.items()},
        "ready_s": run.get("ready_s"),
    }
    if not args.json:
        print(json.dumps(run, indent=1), file=sys.stderr)
    print(json.dumps(out))
    return 0 if out["request_ok"] and out["switch_ok"] and out["read_only_root"] and out["nixl_ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
