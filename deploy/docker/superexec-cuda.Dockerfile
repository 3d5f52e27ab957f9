# privfed SuperExec image, CUDA (NVIDIA GPUs on x86_64 hosts): for ClientApps on
# edge boxes with a GPU; run the ClientApp with run config device=cuda (or auto).
#
#   docker build -f deploy/docker/superexec-cuda.Dockerfile -t privfed-superexec:cuda .
#
# Decision: same official flwr/superexec base as the CPU image, with PyTorch's
# CUDA wheels instead of the CPU ones, rather than an nvidia/cuda base image.
# The CUDA wheels carry their own CUDA runtime, cuBLAS and cuDNN as pip
# packages, so the image needs no CUDA toolkit; the host needs only the NVIDIA
# driver and the NVIDIA Container Toolkit, which mounts the driver into the
# container when the compose service reserves a GPU (docker-compose.gpu.yml).
# Pick the wheel index matching the host driver (https://pytorch.org/get-started),
# e.g. --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cu126 ; left
# empty, pip's default index gives the CUDA build PyTorch publishes for Linux x86_64.
# Jetson / other aarch64 boxes: see deploy/EDGE-GPU.md (these wheels do not fit).
ARG FLWR_VERSION=1.41.0
FROM flwr/superexec:${FLWR_VERSION}

ARG TORCH_INDEX_URL=

WORKDIR /app
COPY --chown=app:app pyproject.toml /tmp/privfed-pyproject.toml

RUN python -c "import tomllib; deps = tomllib.load(open('/tmp/privfed-pyproject.toml', 'rb'))['project']['dependencies']; print('\n'.join(d for d in deps if not d.lower().startswith('flwr')))" \
        > /tmp/privfed-requirements.txt \
    && python -m pip install --no-cache-dir ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"} torch \
    && python -m pip install --no-cache-dir -r /tmp/privfed-requirements.txt \
    && python -c "import torch; assert torch.version.cuda, 'got a CPU-only torch build'; print('torch', torch.__version__, 'CUDA', torch.version.cuda)" \
    && rm -f /tmp/privfed-pyproject.toml /tmp/privfed-requirements.txt \
    && mkdir -p /app/data /app/state /app/results

ENV FLWR_DISABLE_UPDATE_CHECK=1 \
    FLWR_TELEMETRY_ENABLED=0 \
    FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1 \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility

ENTRYPOINT ["flower-superexec"]
