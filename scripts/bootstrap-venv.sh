#!/usr/bin/env bash
# Builds the project venv (Python 3.11) with every extra the unit, e2e and chart tiers need.
set -euo pipefail
venv=${1:-.venv}
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
py=""
for cand in python3.11 /root/.pyenv/versions/3.11*/bin/python3.11 python3; do
  if command -v "$cand" >/dev/null 2>&1 && "$cand" -c 'import sys; sys.exit(sys.version_info[:2] < (3, 10))'; then
    py=$(command -v "$cand"); break
  fi
done
[ -n "$py" ] || { echo "bootstrap-venv: need Python >= 3.10 (python3.11 preferred)" >&2; exit 1; }
[ -x "$venv/bin/python" ] || "$py" -m venv "$venv"
"$venv/bin/python" -m pip install -q --upgrade "pip>=24" "setuptools>=77"
"$venv/bin/python" -m pip install -q -e ".[operator,backend,test,dev]"
echo "bootstrap-venv: $venv ready ($("$venv/bin/python" --version))"
