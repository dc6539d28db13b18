# specserve server image, CPU (default) or CUDA, from this repository:
#   docker build -t specserve:0.1.0-cpu .
#   docker build --build-arg VARIANT=cuda -t specserve:0.1.0-cuda .
# The image runs `specserve`; the default command serves the default catalog target.
ARG PYTHON_IMAGE=python:3.11.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY src ./src
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

FROM ${PYTHON_IMAGE}
ARG VARIANT=cpu
ARG TORCH_VERSION=2.13.0
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONUNBUFFERED=1 \
    SPECSERVE_CACHE_DIR=/cache
COPY --from=build /wheels /wheels
# torch first, so specserve's pin (torch==2.13.0) is already met: the CPU build from PyTorch's
# CPU index, or PyPI's default Linux build, which bundles the CUDA libraries (the node's
# NVIDIA container toolkit supplies the driver).
RUN if [ "${VARIANT}" = "cpu" ]; then \
      pip install --no-cache-dir --index-url https://download.pytorch.org/whl/cpu \
        "torch==${TORCH_VERSION}"; \
    elif [ "${VARIANT}" = "cuda" ]; then \
      pip install --no-cache-dir "torch==${TORCH_VERSION}"; \
    else \
      echo "VARIANT must be cpu or cuda, got ${VARIANT}" >&2; exit 1; \
    fi \
 && pip install --no-cache-dir /wheels/*.whl \
 && rm -rf /wheels \
 && useradd --create-home --uid 1000 specserve \
 && mkdir -p /cache \
 && chown specserve /cache
USER 1000
WORKDIR /home/specserve
EXPOSE 8000
ENTRYPOINT ["specserve"]
CMD ["serve", "--model", "qwen2.5-coder-1.5b-instruct", "--host", "0.0.0.0", "--port", "8000"]
