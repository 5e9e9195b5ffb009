#!/usr/bin/env bash
# Runs one pytest tier (a marker) with the given interpreter. pytest's exit 5 ("no tests
# collected") fails the tier: every tier the CI builds must run real tests.
set -uo pipefail
tier=$1; py=$2; shift 2
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
"$py" -m pytest -m "$tier" --durations=10 "$@"
rc=$?
if [ "$rc" -eq 5 ]; then
  echo "pytest-tier: tier '$tier' collected no tests" >&2
fi
exit "$rc"
