# syntax=docker/dockerfile:1
# satgate-mcp: two stages, so the final image carries the installed wheels and nothing used to build them.
#   docker build -t satgate-mcp .
#   export SATGATE_ROOT_KEY="$(python3 -c 'import secrets; print(secrets.token_urlsafe(48))')"  # keep it safe
#   docker run --init --stop-timeout 35 -p 9100:9100 -e SATGATE_AUTH_MODE=header -e SATGATE_ROOT_KEY \
#     -e SATGATE_UPSTREAMS='{"docs":{"transport":"http","url":"http://docs.internal:3001/mcp"}}' satgate-mcp
#   docker run --rm -e SATGATE_ROOT_KEY satgate-mcp satgate-mcp token mint --id agent-1  # one agent's token
# (or --env-file satgate-mcp.env with the same variables). The image listens on 0.0.0.0, so it refuses to
# start in the default SATGATE_AUTH_MODE=none unless SATGATE_ALLOW_UNAUTHENTICATED=true says so on purpose.
# --stop-timeout must exceed SATGATE_DRAIN_SECONDS (default 25; Docker's own default is 10 s), and --init
# reaps any grandchild an upstream leaves behind (the gateway reaps its own children).

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY satgate_mcp ./satgate_mcp
# Every dependency as a wheel (redis included for SATGATE_REDIS_URL); all are pure or ship binary wheels.
RUN pip wheel --no-cache-dir --wheel-dir /wheels ".[redis]"

FROM ${PYTHON_IMAGE}
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    SATGATE_HOST=0.0.0.0 \
    SATGATE_PORT=9100 \
    SATGATE_LOG_FORMAT=json
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    pip install --no-cache-dir --no-index /wheels/*.whl \
    && useradd --system --uid 10001 --user-group --home-dir /var/lib/satgate-mcp --create-home \
       --shell /usr/sbin/nologin satgate
USER 10001:10001
WORKDIR /var/lib/satgate-mcp
EXPOSE 9100
STOPSIGNAL SIGTERM
# Liveness only; /readyz (upstreams initialized) is for the proxy in front, see fly.toml.
HEALTHCHECK --interval=15s --timeout=3s --start-period=20s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request as u; u.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('SATGATE_PORT', '9100'), timeout=2)"]
CMD ["satgate-mcp", "serve"]
