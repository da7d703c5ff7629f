#!/usr/bin/env bash
# The whole suite against the newest versions pyproject.toml allows, in a venv of its own (.venv-newest):
# a breaking release shows up here, on purpose, before a user meets it. Nothing is written to the lock.
# When it passes and the newest versions should become the pinned ones: bash scripts/lock.sh --upgrade.
set -euo pipefail
cd "$(dirname "$0")/.."
SATGATE_DEPS=newest SATGATE_TEST_VENV="${SATGATE_TEST_VENV:-.venv-newest}" exec bash scripts/test.sh "$@"
