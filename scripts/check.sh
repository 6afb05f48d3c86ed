#!/usr/bin/env bash
# Lint, format and type checks (configured in pyproject.toml): ruff check, ruff format --check, mypy.
# Runs all three, then exits non-zero if any failed. Uses .venv's tools when there is one (`make setup`
# installs them with the `test` extra), else whatever ruff and mypy are on PATH.
#
#   bash scripts/check.sh          # from anywhere; it checks the repository it lives in
#   bash scripts/check.sh --fix    # first let ruff fix what it safely can and reformat, then check
set -uo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
bin=.venv/bin
[ -x "$bin/ruff" ] && [ -x "$bin/mypy" ] || bin=""
ruff=${bin:+$bin/}ruff
mypy=${bin:+$bin/}mypy
paths=(surprisegate tests scripts)

if [ "${1:-}" = "--fix" ]; then
    "$ruff" check --fix --quiet "${paths[@]}"
    "$ruff" format --quiet "${paths[@]}"
fi

failed=()
step() {
    local name=$1
    shift
    echo "== $name" >&2
    "$@" || failed+=("$name")
}
step "ruff check" "$ruff" check "${paths[@]}"
step "ruff format --check" "$ruff" format --check "${paths[@]}"
step "mypy" "$mypy"  # files, python version and options: [tool.mypy] in pyproject.toml

if [ ${#failed[@]} -gt 0 ]; then
    printf -v list '%s; ' "${failed[@]}"
    echo "check.sh: failed: ${list%; }" >&2
    exit 1
fi
echo "check.sh: ruff check, ruff format and mypy are clean" >&2
