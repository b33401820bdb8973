# syntax=docker/dockerfile:1
FROM python:3.13-slim AS build
WORKDIR /src
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
COPY pyproject.toml README.md LICENSE ./
COPY exporter ./exporter
COPY analytics ./analytics
RUN pip install --no-cache-dir --upgrade pip && pip install --no-cache-dir .

FROM python:3.13-slim
COPY --from=build /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
USER 65532:65532
WORKDIR /tmp
EXPOSE 9090
ENTRYPOINT ["gke-gpu-exporter"]
CMD ["--help"]
