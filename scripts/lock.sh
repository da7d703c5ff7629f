#!/usr/bin/env bash
# Make or move the lock files: requirements/runtime.txt (the daemon) and requirements/test.txt (the daemon,
# the test tools and uv), every package at an exact version with hashes, one universal file each for every
# Python we support (3.11 and newer), made by `uv pip compile` and installed by plain pip.
#
#   bash scripts/lock.sh                          re-resolve after pyproject.toml changed; pins kept where allowed
#   bash scripts/lock.sh --upgrade                every package to its newest allowed version
#   bash scripts/lock.sh --upgrade-package NAME   one package (repeatable), the rest stay
#   bash scripts/lock.sh --check                  exit 1 when the locks no longer match pyproject.toml (CI runs it)
#
# Then run `bash scripts/test.sh` (locked) and commit pyproject.toml and requirements/ together.
set -euo pipefail
cd "$(dirname "$0")/.."

UV="${SATGATE_UV:-}"
if [ -z "$UV" ]; then
  if [ -x .venv/bin/uv ]; then
    UV=.venv/bin/uv
  else
    # No test venv yet: the uv the test lock names, in a venv of its own.
    version=$(sed -n 's/^uv==\([^ ]*\).*/\1/p' requirements/test.txt)
    if [ ! -x .venv-lock/bin/uv ]; then
      python3 -m venv .venv-lock
      .venv-lock/bin/python -m pip install --quiet "uv==${version:?requirements/test.txt names no uv}"
    fi
    UV=.venv-lock/bin/uv
  fi
fi

check=0
args=()
for arg in "$@"; do
  if [ "$arg" = "--check" ]; then check=1; else args+=("$arg"); fi
done

compile() {  # compile OUTPUT EXTRA_ARGS..., from the folder that holds pyproject.toml and requirements/
  local out="$1"
  shift
  "$UV" pip compile --quiet --universal --python-version 3.11 --generate-hashes \
    --custom-compile-command "bash scripts/lock.sh" -o "$out" "$@" ${args[@]+"${args[@]}"}
}

lock() {  # both files; the test lock takes the runtime lock's versions, so the tests run what users install
  compile requirements/runtime.txt pyproject.toml requirements/build.in
  compile requirements/test.txt pyproject.toml requirements/build.in --extra test -c requirements/runtime.txt
}

if [ "$check" = 1 ]; then
  # Lock a copy, with today's pins as the preference: any difference means pyproject.toml moved without the lock.
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  UV=$(realpath "$UV")
  mkdir "$work/requirements"
  cp pyproject.toml README.md "$work/"
  cp requirements/build.in requirements/runtime.txt requirements/test.txt "$work/requirements/"
  (cd "$work" && lock)
  if ! diff -u requirements/runtime.txt "$work/requirements/runtime.txt" \
      || ! diff -u requirements/test.txt "$work/requirements/test.txt"; then
    echo "the lock files do not match pyproject.toml: run 'bash scripts/lock.sh' and commit requirements/" >&2
    exit 1
  fi
  echo "lock files match pyproject.toml"
else
  lock
fi
