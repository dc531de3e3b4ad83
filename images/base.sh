#!/usr/bin/env bash
# The base image for Dockerfile where no registry
# base image is reachable: Debian 12 (bookworm) minbase from debootstrap with
# Python 3.11 and venv from Debian's packages, imported into podman as
# $BASE_TAG. Cached: an existing $BASE_TAG is kept (FORCE=1 rebuilds it).
#
#   images/base.sh [BASE_TAG]        (root; needs debootstrap and podman)
set -euo pipefail

BASE_TAG=${1:-${BASE_TAG:-localhost/evolving-infra-base:bookworm}}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
export CONTAINERS_CONF=${CONTAINERS_CONF:-$(cd "$(dirname "$0")" && pwd)/containers.conf}

if [[ -z ${FORCE:-} ]] && podman image exists "$BASE_TAG"; then
  echo "base: $BASE_TAG exists (FORCE=1 rebuilds it)"
  exit 0
fi
root=$(mktemp -d /var/tmp/evolving-base.XXXXXX)
trap 'rm -rf "$root"' EXIT
start=$(date +%s)
# python3-venv gives `python3 -m venv` (python:3.11-slim has it built in);
# ca-certificates lets pip reach an https index.
nice -n 15 debootstrap --variant=minbase \
  --include=python3,python3-venv,ca-certificates \
  bookworm "$root" "$MIRROR"
# Leave out what an image does not need: the apt lists and the package cache.
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/archives/*.deb
tar -C "$root" -c . | podman import \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'ENV LANG=C.UTF-8' \
  --change 'CMD ["/bin/bash"]' \
  - "$BASE_TAG"
echo "base: $BASE_TAG built in $(( $(date +%s) - start )) s"
