# syntax=docker/dockerfile:1
# satgate-mcp: two stages, so the final image carries the installed packages and nothing used to build them.
#   docker build -t satgate-mcp .
#   export SATGATE_ROOT_KEY="$(python3 -c 'import secrets; print(secrets.token_urlsafe(48))')"  # keep it safe
#   docker run --init --stop-timeout 35 -p 9100:9100 -e SATGATE_AUTH_MODE=header -e SATGATE_ROOT_KEY \
#     -e SATGATE_UPSTREAMS='{"docs":{"transport":"http","url":"http://docs.internal:3001/mcp"}}' satgate-mcp
#   docker run --rm -e SATGATE_ROOT_KEY satgate-mcp satgate-mcp token mint --id agent-1  # one agent's token
# (or --env-file satgate-mcp.env with the same variables). The image listens on 0.0.0.0, so it refuses to
# start in the default SATGATE_AUTH_MODE=none unless SATGATE_ALLOW_UNAUTHENTICATED=true says so on purpose.
# --stop-timeout must exceed SATGATE_DRAIN_SECONDS (default 25; Docker's own default is 10 s), and --init
# reaps any grandchild an upstream leaves behind (the gateway reaps its own children).

# The base image by digest (python:3.11-slim-bookworm at the time of pinning), so two builds start from the same
# bytes; move it on purpose: `docker buildx imagetools inspect python:3.11-slim-bookworm` prints the new digest.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm@sha256:2e32f7d302adc1c37428355c1e646897c0c53f4fd60b6a551245fb90ee129f91

FROM ${PYTHON_IMAGE} AS build
WORKDIR /src
# Every dependency at the lock's version and hash (requirements/runtime.txt, made by scripts/lock.sh), then the
# project itself with no dependency resolution and the locked setuptools, so nothing unpinned enters the image.
COPY requirements/runtime.txt ./requirements/runtime.txt
RUN python -m venv /opt/satgate \
    && /opt/satgate/bin/pip install --no-cache-dir --require-hashes -r requirements/runtime.txt
COPY pyproject.toml README.md ./
COPY satgate_mcp ./satgate_mcp
RUN /opt/satgate/bin/pip install --no-cache-dir --no-deps --no-build-isolation .

FROM ${PYTHON_IMAGE}
ENV PATH=/opt/satgate/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    SATGATE_HOST=0.0.0.0 \
    SATGATE_PORT=9100 \
    SATGATE_LOG_FORMAT=json
COPY --from=build /opt/satgate /opt/satgate
RUN useradd --system --uid 10001 --user-group --home-dir /var/lib/satgate-mcp --create-home \
       --shell /usr/sbin/nologin satgate
USER 10001:10001
WORKDIR /var/lib/satgate-mcp
EXPOSE 9100
STOPSIGNAL SIGTERM
# Liveness only; /readyz (upstreams initialized) is for the proxy in front, see fly.toml.
HEALTHCHECK --interval=15s --timeout=3s --start-period=20s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request as u; u.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('SATGATE_PORT', '9100'), timeout=2)"]
CMD ["satgate-mcp", "serve"]
