# syntax=docker/dockerfile:1
# PDPair images, five targets from one file (docs/images.md):
#   operator     the kopf operator: no torch, no transport SDKs
#   agent        the data-plane agent for host-memory pools, with NIXL (and MoRI-IO on Python 3.12)
#   agent-cuda   the agent for CUDA pools: the same, plus torch (its wheels carry the CUDA runtime)
#   agent-rocm   the agent for MoRI on ROCm GPUs (amd-mori, torch for ROCm), on a ROCm base
#   sglang       the sglang engine with PDPair's transfer backend (the `sglang` extra), on a CUDA base
# Each target's base is a build argument: PYTHON_IMAGE (operator, agent, agent-cuda), ROCM_IMAGE, SGLANG_IMAGE.
# The install steps are the ones scripts/setup runs in CI (same pip pin, same extras, same NIXL wheel,
# --no-deps so torch stays out of `agent`); tests/integration/test_dockerfile.py keeps the two in step.
# Every pip step mounts two optional build secrets, so pip inside reaches the index the builder's pip
# uses: `pip.conf` (at /etc/pip.conf) and `pip-cert` (a CA bundle that pip.conf may name as
# /run/secrets/pip-cert); hack/images.sh passes them. pip's cache is a cache mount, never a layer.
# The build context (.dockerignore) leaves the benchmarks (dataplane/harness/bench) out of every target.
# Every target runs as uid/gid 65532, the uid the operator's pod templates require (runAsNonRoot).

ARG PYTHON_IMAGE=python:3.12.12-slim-trixie
ARG ROCM_IMAGE=rocm/dev-ubuntu-24.04:6.4.1
ARG SGLANG_IMAGE=nvidia/cuda:13.0.0-devel-ubuntu24.04

FROM ${PYTHON_IMAGE} AS base
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PATH=/opt/pdpair/bin:$PATH
RUN groupadd --system --gid 65532 pdpair \
 && useradd --system --uid 65532 --gid 65532 --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin pdpair

FROM base AS build-venv
WORKDIR /src
ENV REQUIREMENTS="import sys, tomllib; p = tomllib.load(open('pyproject.toml', 'rb'))['project']; \
print(*p['dependencies'], *(r for e in sys.argv[1:] for r in p['optional-dependencies'][e]), sep=chr(10))"
RUN --mount=type=secret,id=pip.conf,target=/etc/pip.conf --mount=type=secret,id=pip-cert \
    --mount=type=cache,id=pdpair-pip,target=/root/.cache/pip,sharing=locked \
    python -m venv /opt/pdpair \
 && pip install --upgrade pip==25.3

# The dependencies are installed first, from pyproject.toml alone (REQUIREMENTS prints them: the
# project's, then those of the extras named), so a change to the sources reinstalls only the project.
FROM build-venv AS build-operator
COPY pyproject.toml ./
RUN --mount=type=secret,id=pip.conf,target=/etc/pip.conf --mount=type=secret,id=pip-cert \
    --mount=type=cache,id=pdpair-pip,target=/root/.cache/pip,sharing=locked \
    python -c "$REQUIREMENTS" > /tmp/requirements.txt \
 && pip install -r /tmp/requirements.txt
COPY README.md ./
COPY dataplane ./dataplane
COPY operator ./operator
RUN --mount=type=secret,id=pip.conf,target=/etc/pip.conf --mount=type=secret,id=pip-cert \
    --mount=type=cache,id=pdpair-pip,target=/root/.cache/pip,sharing=locked \
    pip install --no-deps .

FROM build-venv AS build-agent
# g++ builds the native NIXL posting thread (dataplane/transports/nixl/native) and gcc the agent's per-room
# modules compiled by mypyc (dataplane/compiled), both into the installed package, where the agent
# finds them (-P: the installed package, not /src); the compilers stay in this stage. They are
# installed before the sources are copied, so a source change rebuilds only the steps below.
RUN apt-get update \
 && apt-get install -y --no-install-recommends gcc=4:14.2.0-1 g++=4:14.2.0-1 \
 && rm -rf /var/lib/apt/lists/*
COPY pyproject.toml ./
RUN --mount=type=secret,id=pip.conf,target=/etc/pip.conf --mount=type=secret,id=pip-cert \
    --mount=type=cache,id=pdpair-pip,target=/root/.cache/pip,sharing=locked \
    python -c "$REQUIREMENTS" agent > /tmp/requirements.txt \
 && pip install -r /tmp/requirements.txt \
 && pip install --no-deps nixl-cu12==1.5.1
COPY README.md ./
COPY dataplane ./dataplane
COPY operator ./operator
# DL3013: '.[agent]' is this project; its extra's dependencies are pinned in pyproject.toml.
# hadolint ignore=DL3013
RUN --mount=type=secret,id=pip.conf,target=/etc/pip.conf --mount=type=secret,id=pip-cert \
    --mount=type=cache,id=pdpair-pip,target=/root/.cache/pip,sharing=locked \
    pip install --no-deps '.[agent]' \
 && python -P -m dataplane.transports.nixl.native \
 && python -P -m dataplane.compiled --in-place

FROM build-agent AS build-agent-cuda
# torch for CUDA pools (transfer.device: cuda); its PyPI wheels bring the CUDA runtime libraries, the
# node's driver (the NVIDIA container toolkit) brings libcuda. The same torch as the sglang target's.
RUN --mount=type=secret,id=pip.conf,target=/etc/pip.conf --mount=type=secret,id=pip-cert \
    --mount=type=cache,id=pdpair-pip,target=/root/.cache/pip,sharing=locked \
    pip install torch==2.14.1

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

FROM base AS agent-cuda
COPY --from=build-agent-cuda /opt/pdpair /opt/pdpair
ENV NUMBA_CACHE_DIR=/tmp/pdpair-numba
USER 65532:65532
EXPOSE 8998 9400
ENTRYPOINT ["pdpair-agent"]

# The ROCm and sglang targets start from a vendor base (Ubuntu 24.04, Python 3.12 from its packages):
# the agent or engine is built in the same image it runs in, so the venv's interpreter is the base's.
FROM ${ROCM_IMAGE} AS rocm-base
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    DEBIAN_FRONTEND=noninteractive \
    PATH=/opt/pdpair/bin:$PATH
# DL3008: the base's own Python and compilers; their versions follow the ROCM_IMAGE tag.
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv python3-dev gcc g++ \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid 65532 pdpair \
 && useradd --system --uid 65532 --gid 65532 --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin pdpair

FROM rocm-base AS agent-rocm
# torch for the pools in GPU memory (transfer.device: cuda is HIP on ROCm): PyTorch's ROCm wheels come
# from its own index, not PyPI; the same torch version as the other targets.
ARG TORCH_ROCM_INDEX=https://download.pytorch.org/whl/rocm6.4
WORKDIR /src
COPY pyproject.toml README.md ./
COPY dataplane ./dataplane
COPY operator ./operator
# '.[agent]' on Python 3.12 installs amd-mori (MoRI-IO, transfer.backend: mori) with the agent.
# hadolint ignore=DL3013
RUN --mount=type=secret,id=pip.conf,target=/etc/pip.conf --mount=type=secret,id=pip-cert \
    --mount=type=cache,id=pdpair-pip,target=/root/.cache/pip,sharing=locked \
    python3 -m venv /opt/pdpair \
 && pip install --upgrade pip==25.3 \
 && pip install '.[agent]' \
 && pip install --index-url "$TORCH_ROCM_INDEX" torch==2.14.1 \
 && pip show --quiet amd-mori \
 && python -P -m dataplane.compiled --in-place
WORKDIR /
ENV NUMBA_CACHE_DIR=/tmp/pdpair-numba
USER 65532:65532
EXPOSE 8998 9400
ENTRYPOINT ["pdpair-agent"]

FROM ${SGLANG_IMAGE} AS sglang
# HOME: sglang's and its kernels' caches (Triton, FlashInfer JIT) under /tmp, the pod's writable emptyDir.
ENV PYTHONDONTWRITEBYTECODE=1 \
    HOME=/tmp \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    DEBIAN_FRONTEND=noninteractive \
    PATH=/opt/pdpair/bin:$PATH
# DL3008: the base's own Python; its version follows the SGLANG_IMAGE tag.
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv python3-dev \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid 65532 pdpair \
 && useradd --system --uid 65532 --gid 65532 --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin pdpair
WORKDIR /src
COPY pyproject.toml README.md ./
COPY dataplane ./dataplane
COPY operator ./operator
# sglang at the version the plugin is written against, then this project with its `sglang` extra
# (the plugin, registered under sglang's plugin entry points).
# hadolint ignore=DL3013
RUN --mount=type=secret,id=pip.conf,target=/etc/pip.conf --mount=type=secret,id=pip-cert \
    --mount=type=cache,id=pdpair-pip,target=/root/.cache/pip,sharing=locked \
    python3 -m venv /opt/pdpair \
 && pip install --upgrade pip==25.3 \
 && pip install sglang==0.5.23 \
 && pip install '.[sglang]'
WORKDIR /
USER 65532:65532
EXPOSE 30000
ENTRYPOINT ["python", "-m", "sglang.launch_server"]
