# syntax=docker/dockerfile:1
# The image installs the project's wheel without extras, as tests/test_package.py does.
FROM python:3.13-slim AS build
WORKDIR /src
COPY pyproject.toml README.md LICENSE ./
COPY exporter ./exporter
COPY analytics ./analytics
COPY simulator ./simulator
RUN python -m pip wheel --no-cache-dir --no-deps --wheel-dir /dist . \
 && python -m venv /opt/venv \
 && /opt/venv/bin/pip install --no-cache-dir /dist/*.whl

FROM python:3.13-slim
COPY --from=build /opt/venv /opt/venv
# Runs with a read-only root file system: only /tmp and the warehouse volume are written.
# HOME and matplotlib's config and font cache point into /tmp.
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HOME=/tmp \
    MPLCONFIGDIR=/tmp/matplotlib
USER 65532:65532
WORKDIR /tmp
EXPOSE 9808
ENTRYPOINT ["gke-gpu-exporter"]
CMD ["--help"]
