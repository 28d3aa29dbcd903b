# syntax=docker/dockerfile:1
# The spotrain image: the four services, the metadata agent, the chart's JetStream hook and
# the Ray nodes of the chart's RayCluster (same Ray and Python as the services, and the
# `shared` training helper for user scripts). Built with the `cloud` extra (GKE, Pub/Sub,
# GCS, Kubernetes clients).
#
#   docker build -t spotrain:0.1.0 .
#
# The base is pinned to an exact release; pin its digest too where your registry allows
# (docker buildx imagetools inspect python:3.11.14-slim-trixie).
ARG PYTHON_IMAGE=python:3.11.14-slim-trixie

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
RUN python -m venv /opt/spotrain
# Only what the wheel is built from: the tests, examples and benchmarks stay out.
COPY pyproject.toml README.md ./
COPY shared ./shared
COPY services ./services
RUN /opt/spotrain/bin/pip install --no-cache-dir ".[cloud]"

FROM ${PYTHON_IMAGE} AS runtime
RUN groupadd --system --gid 10001 spotrain \
    && useradd --system --uid 10001 --gid spotrain --create-home --home-dir /home/spotrain \
        --shell /bin/bash spotrain
COPY --from=build /opt/spotrain /opt/spotrain
ENV PATH=/opt/spotrain/bin:$PATH \
    HOME=/home/spotrain \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /home/spotrain
# A numeric user, so Kubernetes can check runAsNonRoot without reading /etc/passwd.
USER 10001:10001
# /healthz and /metrics of whichever service runs (the chart's httpPort).
EXPOSE 9460
# The chart runs each service with its own command: python -m services.<name>.
CMD ["python", "-m", "services.submitter"]
