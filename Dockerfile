# Gateway and console image: the `evolving-infra` CLI with the project's
# pinned dependencies (pyproject.toml), without vLLM or torch. The Helm chart
# runs `evolving-infra gateway`, `evolving-infra db upgrade` and
# `evolving-infra console` from it (values.yaml: image.repository).
#
#   docker build -t <registry>/evolving-infra/evolving-infra:0.1.0 .
#
# Not built or tested by CI here (no Docker engine on the project's machines).
FROM python:3.11-slim

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
COPY bench ./bench
COPY testing ./testing
COPY migrations ./migrations
RUN pip install . && rm -rf /src

# The chart runs as 10001 with a read-only root filesystem and /tmp as an
# emptyDir; HOME points there so caches (Hugging Face, Streamlit) are writable.
RUN useradd --uid 10001 --user-group --no-create-home --home-dir /tmp evolving
USER 10001:10001
ENV HOME=/tmp HF_HOME=/tmp/hf
WORKDIR /tmp

EXPOSE 8000 8501
ENTRYPOINT []
CMD ["evolving-infra", "gateway", "--host", "0.0.0.0"]
