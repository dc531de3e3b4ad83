#!/usr/bin/env bash
# `make images`: the product image and the CPU worker image (the `product` and
# `worker-cpu` targets of Dockerfile), built with podman from the repository root.
#
#   images/build.sh                       base from debootstrap (images/base.sh), cached
#   BASE_IMAGE=python:3.11-slim images/build.sh   a registry base instead
#
# Variables: IMAGE_REPO (localhost/evolving-infra), IMAGE_TAG (0.1.0, the
# chart's appVersion), TORCH_INDEX (PyTorch CPU wheel index; empty: the CPU
# torch wheel from WHEELS_DIR, default /opt/wheels), NO_CACHE=1 (build every
# layer again, pip's download cache and all), REPORT (JSON lines of name, image, size_mb, build_s; default
# bench-output/images-build.jsonl), CA_BUNDLE (host CA bundle mounted into
# the build; default the system one). Prints each image's size.
set -euo pipefail

cd "$(dirname "$0")/.."
export CONTAINERS_CONF=${CONTAINERS_CONF:-$PWD/images/containers.conf}
IMAGE_REPO=${IMAGE_REPO:-localhost/evolving-infra}
IMAGE_TAG=${IMAGE_TAG:-0.1.0}
BASE_TAG=${BASE_TAG:-localhost/evolving-infra-base:bookworm}
WHEELS_DIR=${WHEELS_DIR:-/opt/wheels}
TORCH_INDEX=${TORCH_INDEX:-}
REPORT=${REPORT:-bench-output/images-build.jsonl}
# Mounted over the build containers' CA bundle: a TLS-intercepting proxy's CA
# (as on this project's machines) is then trusted by pip inside the build.
CA_BUNDLE=${CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}

command -v podman >/dev/null || { echo "images: need podman (apt-get install podman runc)" >&2; exit 2; }

base_s=0
if [[ -z ${BASE_IMAGE:-} ]]; then
  start=$(date +%s)
  images/base.sh "$BASE_TAG"
  base_s=$(( $(date +%s) - start ))
  BASE_IMAGE=$BASE_TAG
fi

# The CPU torch wheel for the worker build; without TORCH_INDEX it must be here.
rm -rf images/wheels && mkdir -p images/wheels
if [[ -z $TORCH_INDEX ]]; then
  shopt -s nullglob
  wheels=("$WHEELS_DIR"/torch-*+cpu-cp311-*.whl)
  if (( ${#wheels[@]} == 0 )); then
    echo "images: no CPU torch wheel in $WHEELS_DIR; set TORCH_INDEX=https://download.pytorch.org/whl/cpu" >&2
    exit 2
  fi
  cp "${wheels[@]}" images/wheels/
fi

# NO_CACHE: pip's download cache too (the Dockerfile's cache mount lives in
# buildah's cache folder, which --no-cache does not touch).
if [[ -n ${NO_CACHE:-} ]]; then rm -rf "${TMPDIR:-/var/tmp}/buildah-cache-$(id -u)"; fi

mkdir -p "$(dirname "$REPORT")"
: > "$REPORT"
build() {  # name target
  local name=$1 target=$2 image="$IMAGE_REPO/$1:$IMAGE_TAG" start elapsed bytes
  start=$(date +%s)
  local ca=()
  [[ -f $CA_BUNDLE ]] && ca=(-v "$CA_BUNDLE:/etc/ssl/certs/ca-certificates.crt:ro")
  nice -n 15 podman build --network=host ${no_cache:+--no-cache} "${ca[@]}" \
    --build-arg BASE_IMAGE="$BASE_IMAGE" --build-arg TORCH_INDEX="$TORCH_INDEX" \
    --target "$target" -t "$image" .
  elapsed=$(( $(date +%s) - start ))
  bytes=$(podman image inspect --format '{{.Size}}' "$image")
  printf '{"name": "%s", "image": "%s", "size_mb": %d, "build_s": %d, "base": "%s", "base_s": %d}\n' \
    "$name" "$image" $(( bytes / 1000000 )) "$elapsed" "$BASE_IMAGE" "$base_s" >> "$REPORT"
}
# The worker first: the product target then finds every heavy layer cached.
# NO_CACHE applies to the first build only: the second then reuses the layers
# just built, as a build from a cold cache does.
no_cache=${NO_CACHE:-}
build evolving-infra-worker-cpu worker-cpu
no_cache=
build evolving-infra product
rm -rf images/wheels
# Layers of the images this build replaced take GBs.
if [[ ${PRUNE:-1} == 1 ]]; then podman image prune -f >/dev/null; fi

echo "images (size, build time):"
python3 - "$REPORT" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    print(f"  {r['image']}: {r['size_mb']} MB, {r['build_s']} s")
PY
