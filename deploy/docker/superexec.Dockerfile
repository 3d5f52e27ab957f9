# privfed SuperExec image, CPU: runs privfed's ServerApp or ClientApp processes
# next to a SuperLink or SuperNode started with `--isolation process`.
#
#   docker build -f deploy/docker/superexec.Dockerfile -t privfed-superexec:cpu .
#
# Built on the official Flower SuperExec image (Python, flwr, non-root user `app`,
# uid 49999, HOME=/app, entrypoint flower-superexec). It only adds privfed's
# Python dependencies: the app's code itself arrives in the FAB that `flwr run`
# ships, so rebuilding is needed only when pyproject.toml's dependencies change.
# FLWR_VERSION must satisfy the flwr range in pyproject.toml (tests check it).
ARG FLWR_VERSION=1.41.0
FROM flwr/superexec:${FLWR_VERSION}

# CPU-only PyTorch wheels (~200 MB instead of several GB of CUDA libraries).
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu

WORKDIR /app
COPY --chown=app:app pyproject.toml /tmp/privfed-pyproject.toml

# [project].dependencies minus flwr (the base image's flwr is kept, and its
# simulation extra, Ray, is not needed in deployment).
RUN python -c "import tomllib; deps = tomllib.load(open('/tmp/privfed-pyproject.toml', 'rb'))['project']['dependencies']; print('\n'.join(d for d in deps if not d.lower().startswith('flwr')))" \
        > /tmp/privfed-requirements.txt \
    && python -m pip install --no-cache-dir --index-url "${TORCH_INDEX_URL}" torch \
    && python -m pip install --no-cache-dir -r /tmp/privfed-requirements.txt \
    && python -c "import torch, opacus, dp_accounting, cryptography, flwr; print('torch', torch.__version__)" \
    && rm -f /tmp/privfed-pyproject.toml /tmp/privfed-requirements.txt \
    && mkdir -p /app/data /app/state /app/results

# Offline operation: no update check, no telemetry, no `uv sync` at run time.
ENV FLWR_DISABLE_UPDATE_CHECK=1 \
    FLWR_TELEMETRY_ENABLED=0 \
    FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1

ENTRYPOINT ["flower-superexec"]
