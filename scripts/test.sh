#!/usr/bin/env bash
# The whole suite: lint, type check, then unit, component and end-to-end tests.
set -uo pipefail
cd "$(dirname "$0")/.."
export PATH="$PWD/.venv/bin:$PATH"

status=0
echo "== ruff"
ruff check src tests examples || status=1
echo "== mypy"
mypy || status=1
echo "== pytest"
pytest -ra --durations=15 "$@"
rc=$?
# pytest's 5 means it collected no test: that is a failure of the suite, not a pass.
[ $rc -ne 0 ] && status=$rc
exit $status
