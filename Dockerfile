# syntax=docker/dockerfile:1
# PDPair images, two targets from one file:
#   docker build --target operator -t pdpair-operator .   # the kopf operator: no torch, no transfer engines
#   docker build --target agent    -t pdpair-agent .      # the data-plane agent, with NIXL (and MoRI-IO on 3.12)
# The install steps are the ones scripts/setup runs in CI (same pip pin, same extras, same NIXL wheel,
# --no-deps so torch stays out); tests/integration/test_dockerfile.py keeps the two in step.
# Both run as uid/gid 65532, the uid the operator's pod templates require (runAsNonRoot).

ARG PYTHON_IMAGE=python:3.12.12-slim-trixie

FROM ${PYTHON_IMAGE} AS base
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PATH=/opt/pdpair/bin:$PATH
RUN groupadd --system --gid 65532 pdpair \
 && useradd --system --uid 65532 --gid 65532 --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin pdpair

FROM base AS build-operator
WORKDIR /src
RUN python -m venv /opt/pdpair \
 && pip install --no-cache-dir --upgrade pip==25.3
COPY pyproject.toml README.md ./
COPY dataplane ./dataplane
COPY operator ./operator
RUN pip install --no-cache-dir .

FROM build-operator AS build-agent
# g++ builds the native NIXL posting thread (dataplane/transports/nixl/native) and gcc the agent's per-room
# modules compiled by mypyc (dataplane/compiled), both into the installed package, where the agent
# finds them (-P: the installed package, not /src); the compilers stay in this stage.
RUN apt-get update \
 && apt-get install -y --no-install-recommends gcc=4:14.2.0-1 g++=4:14.2.0-1 \
 && rm -rf /var/lib/apt/lists/*
# DL3013: '.[agent]' is this project; its extra's dependencies are pinned in pyproject.toml.
# hadolint ignore=DL3013
RUN pip install --no-cache-dir '.[agent]' \
 && pip install --no-cache-dir --no-deps nixl-cu12==1.5.1 \
 && python -P -m dataplane.transports.nixl.native \
 && python -P -m dataplane.compiled --in-place

FROM base AS operator
COPY --from=build-operator /opt/pdpair /opt/pdpair
USER 65532:65532
ENTRYPOINT ["pdpair-operator"]

FROM base AS agent
COPY --from=build-agent /opt/pdpair /opt/pdpair
# The planner's numba kernel (dataplane/planner/kernel.py) is compiled at start-up (~2 s) and cached
# here; the pods mount an emptyDir at /tmp (read-only root), so a restarted container loads it.
ENV NUMBA_CACHE_DIR=/tmp/pdpair-numba
USER 65532:65532
EXPOSE 8998 9400
ENTRYPOINT ["pdpair-agent"]
