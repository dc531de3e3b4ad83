# Gateway and console image: the `evolving-infra` CLI with the project's
# pinned dependencies (pyproject.toml), without vLLM or torch. The Helm chart
# runs `evolving-infra gateway`, `evolving-infra db upgrade` and
# `evolving-infra console` from it (values.yaml: image.repository).
#
#   podman build --build-arg BASE_IMAGE=python:3.11-slim -t <registry>/evolving-infra/evolving-infra:0.1.0 .
#   make images     (here: builds the base from debootstrap when no registry is reachable)
#
# BASE_IMAGE is any Debian-like image with Python 3.11 and `python3 -m venv`:
# python:3.11-slim, or the Debian 12 base `images/base.sh` builds. Product code
# only: bench/ and testing/ stay out (.dockerignore). tests/containers runs this
# image with the commands, user and read-only root the chart renders.
ARG BASE_IMAGE=python:3.11-slim
FROM ${BASE_IMAGE}

# pip checks TLS against the system CA bundle, not its own copy, so a proxy's CA
# that `images/build.sh` mounts over it (CA_BUNDLE) is trusted during the build.
ARG PIP_CERT=/etc/ssl/certs/ca-certificates.crt
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /src
COPY pyproject.toml README.md ./
COPY core ./core
COPY routing ./routing
COPY planner ./planner
COPY sim ./sim
COPY kvpool ./kvpool
COPY workers ./workers
COPY gateway ./gateway
COPY admin_ui ./admin_ui
COPY cli ./cli
COPY migrations ./migrations
# A venv, not the system site-packages: Debian's Python refuses `pip install`
# there (PEP 668), python:3.11-slim does not; the venv behaves the same on both.
RUN python3 -m venv /opt/venv \
 && /opt/venv/bin/pip install . \
 && rm -rf /src
ENV PATH=/opt/venv/bin:$PATH

# The chart runs as 10001 with a read-only root filesystem and /tmp as an
# emptyDir; HOME points there so caches (Hugging Face, Streamlit) are writable.
RUN useradd --uid 10001 --user-group --no-create-home --home-dir /tmp evolving
USER 10001:10001
ENV HOME=/tmp HF_HOME=/tmp/hf
WORKDIR /tmp

EXPOSE 8000 8501
ENTRYPOINT []
CMD ["evolving-infra", "gateway", "--host", "0.0.0.0"]
