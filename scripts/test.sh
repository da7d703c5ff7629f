#!/usr/bin/env bash
# The whole test suite, install included: lint, types, deploy-file checks, pytest, the install check on the
# oldest and newest supported Python, and the conformance runs.
# Usage: bash scripts/test.sh [extra pytest args]
#   SATGATE_DEPS=locked (default) installs exactly requirements/test.txt (hashes checked);
#   SATGATE_DEPS=newest installs the newest versions pyproject.toml allows (scripts/test-newest.sh).
set -euo pipefail
cd "$(dirname "$0")/.."

VENV="${SATGATE_TEST_VENV:-.venv}"
DEPS="${SATGATE_DEPS:-locked}"
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
fi
case "$DEPS" in
  locked)
    # pip-sync's effect with plain pip: what the lock names, at its versions and hashes; then the project itself,
    # with the locked setuptools (no build isolation, so nothing unpinned is fetched to build it).
    "$VENV/bin/python" -m pip install --quiet --require-hashes -r requirements/test.txt
    "$VENV/bin/python" -m pip install --quiet --no-deps --no-build-isolation -e .
    echo "== lock"
    SATGATE_UV="$VENV/bin/uv" bash scripts/lock.sh --check
    ;;
  newest)
    "$VENV/bin/python" -m pip install --quiet --upgrade pip
    "$VENV/bin/python" -m pip install --quiet --upgrade --upgrade-strategy eager -e ".[test]"
    "$VENV/bin/python" -m pip list --format=freeze > "$VENV/newest-versions.txt"
    echo "== newest allowed versions (list in $VENV/newest-versions.txt)"
    ;;
  *)
    echo "SATGATE_DEPS must be locked or newest, not '$DEPS'" >&2
    exit 2
    ;;
esac

# Tests that need a shared store use the machine's Redis; start one if it is installed but not running.
if command -v redis-cli >/dev/null 2>&1 && ! redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1; then
  if command -v redis-server >/dev/null 2>&1; then
    redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --appendonly no >/dev/null
  fi
fi

echo "== ruff"
"$VENV/bin/ruff" check satgate_mcp tests scripts bench
echo "== mypy --strict"
"$VENV/bin/mypy" --strict
if [ -f scripts/check-deploy.sh ]; then
  echo "== deploy files"
  PATH="$PWD/$VENV/bin:$PATH" bash scripts/check-deploy.sh
fi
# The console's browser tests (marker `browser`) drive Debian's chromium through Playwright (no browser download):
# installed with apt-get when it is missing and we are root, like systemd for the deploy check.
if ! command -v chromium >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "== installing chromium (the console's browser tests)"
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
  else
    echo "chromium is missing and cannot be installed here (needs root and apt-get): the browser tests will fail" >&2
  fi
fi
echo "== pytest"
"$VENV/bin/python" -m pytest -p no:cacheprovider "$@"
# The benchmark runs and every call succeeds (a few seconds; figures are printed, never asserted).
echo "== benchmark smoke"
"$VENV/bin/python" scripts/bench.py --clients 4 --calls 25
# Several faults at once under load: two gateways on one Redis, SDK clients, kills and pauses (about a minute).
echo "== chaos (short)"
if command -v redis-server >/dev/null 2>&1; then
  "$VENV/bin/python" scripts/chaos.py --short
else
  echo "skipped: redis-server is not installed"
fi
# The README's install command on the oldest and newest supported Python (each found on PATH), in fresh venvs.
echo "== install check"
"$VENV/bin/python" scripts/check_install.py
# The official MCP conformance suite, directly and through the gateway (npm install into .conformance/ once).
# SATGATE_CONFORMANCE=0 skips it for a quick local run; CI (.ci/run) always runs it.
if [ "${SATGATE_CONFORMANCE:-1}" != "0" ]; then
  echo "== conformance 2025-11-25"
  "$VENV/bin/python" scripts/conformance.py --spec-version 2025-11-25
  echo "== conformance 2026-07-28"
  "$VENV/bin/python" scripts/conformance.py --spec-version 2026-07-28
else
  echo "== conformance skipped (SATGATE_CONFORMANCE=0)"
fi
