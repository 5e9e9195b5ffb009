#!/usr/bin/env bash
# Fails when amd-mori cannot run in this environment: the engine image's build runs it (a
# missing library fails the build, not the pod), and tests/backend/test_image_runtime_mori.py
# runs it against the test engine environment, where no Docker engine exists.
#
# amd-mori's wheel does not carry the system libraries its ELF files need (libgrpc++.so.1.51,
# libgrpc.so.29, libupb, libprotobuf.so.32, libre2, libabsl_*.so.20220623, libcares, ...):
#   1. every ELF file of the installed mori package resolves every NEEDED library (ldd, or
#      "$MORI_CPU_LOADER --list" where mori runs under another loader);
#   2. "import mori.umbp" works;
#   3. umbp_standalone_server (the sidecars' binary) starts: the dynamic loader maps every
#      library it needs before it parses its arguments.
# Usage: check-mori-runtime.sh [PYTHON]   (default python3)
set -uo pipefail
python=${1:-python3}
loader=${MORI_CPU_LOADER:-}
fail=0
say() { echo "check-mori-runtime: $*" >&2; }

mori_dir=$("$python" -c "import importlib.util, os; \
print(os.path.dirname(importlib.util.find_spec('mori').origin))") \
  || { say "FAIL: $python cannot find the mori package (pip install amd-mori)"; exit 1; }

checked=0
while IFS= read -r -d '' f; do
  head -c 4 "$f" | grep -q 'ELF' || continue
  checked=$((checked + 1))
  if [ -n "$loader" ]; then
    out=$($loader --list "$f" 2>&1)
  else
    out=$(ldd "$f" 2>&1)
  fi
  # ldd prints "lib => not found"; the loader's --list stops at the first missing one.
  missing=$( { grep 'not found' <<<"$out" | awk '{print $1}';
               grep -o 'loading shared libraries: [^:]*' <<<"$out" | awk '{print $4}'; } \
             | sort -u | tr '\n' ' ')
  # The wheel's own libraries (libmori_shmem.so, ...) are found by mori itself, which loads
  # them from its package directory; only what the wheel does not ship counts as missing.
  for lib in $missing; do
    [ -e "$mori_dir/$lib" ] && missing=${missing/$lib /}
  done
  if [ -n "${missing// /}" ]; then
    say "FAIL: ${f#"$mori_dir"/} needs ${missing}(not found)"
    fail=1
  fi
done < <(find "$mori_dir" -type f \( -name '*.so' -o -name '*.so.*' -o -name 'umbp_*' \) -print0)
[ "$checked" -gt 0 ] || { say "FAIL: no ELF files under $mori_dir"; fail=1; }

if ! out=$("$python" -c "import mori.umbp" 2>&1); then
  say "FAIL: import mori.umbp: $(tail -n 1 <<<"$out")"
  fail=1
fi

server="$mori_dir/umbp_standalone_server"
# shellcheck disable=SC2086  # the loader prefix is a command line
out=$(timeout 30 $loader "$server" --help 2>&1)
rc=$?
if [ "$rc" -eq 127 ] || grep -q 'error while loading shared libraries' <<<"$out"; then
  say "FAIL: umbp_standalone_server does not start: $(grep -m1 'error' <<<"$out")"
  fail=1
fi

if [ "$fail" -ne 0 ]; then
  say "mori's runtime libraries are incomplete (see above)"
  exit 1
fi
say "ok: $checked ELF files resolve, mori.umbp imports, umbp_standalone_server starts"
