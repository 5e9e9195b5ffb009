#!/usr/bin/env bash
# Builds the test engine environment (.cache/venvs/engine): production's pairing of one Python
# 3.12 holding torch (PyPI), SGLang 0.5.23 and the real amd-mori 1.2.4 (cp312), on a CPU-only
# Debian 12 machine. Used by the mori, sglang and pod test tiers and the engine benchmarks.
#
#   * Python 3.12: sglang 0.5.23 ships cp311-cp313 wheels, amd-mori 1.2.4 cp310/cp312; cp312 is
#     the one both have (and the one the engine image uses, images/engine/Dockerfile).
#   * amd-mori's cp312 wheel is manylinux_2_39 and its HIP build needs GLIBC_2.38; the host has
#     glibc 2.36. The interpreter runs under Debian trixie's loader with the pinned runtime
#     libraries of scripts/engine-runtime.lock unpacked into $ENV/sysroot (never installed):
#     $ENV/bin/engine-python is that command. It passes --argv0 so sys.executable is the wrapper
#     itself: the processes SGLang spawns (multiprocessing spawn re-runs sys.executable) and the
#     launcher's exec keep the loader. pip runs under it too, so it accepts the manylinux_2_39 wheel.
#   * Python packages: exactly scripts/engine-env.lock, installed with --no-deps (sglang's own
#     metadata pulls ~80 CUDA-only packages we never import); torch is PyPI's CUDA build, which
#     imports and runs on CPU (torch.cuda.is_available() is False), 5+ GB.
#   * tests/cpu_engine (test support: sgl_kernel stand-in, CPU plugin, tiny models) and this
#     project, editable, --no-deps. Never part of the engine image.
#   * g++, ninja and libssl-dev for SGLang's JIT page-hash extension (apt-get when root).
#
# Cached: the .debs under .cache/debs (then ../shared/debs/mori-cpu-runtime, then a private-apt
# download of the exact version); a stamp of this script and both lock files makes a rerun with
# nothing changed return at once. Env knobs (tests of this script): ENGINE_ENV_DIR,
# ENGINE_DEB_CACHE, ENGINE_SHARED_DEBS.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
env_dir=${ENGINE_ENV_DIR:-$root/.cache/venvs/engine}
deb_cache=${ENGINE_DEB_CACHE:-$root/.cache/debs}
shared_debs=${ENGINE_SHARED_DEBS:-$root/../shared/debs/mori-cpu-runtime}
runtime_lock=$root/scripts/engine-runtime.lock
pip_lock=$root/scripts/engine-env.lock
sysroot=$env_dir/sysroot
libdir=$sysroot/usr/lib/x86_64-linux-gnu
wrapper=$env_dir/bin/engine-python
stamp=$env_dir/.built
log() { echo "build-engine-env: $*" >&2; }
die() { echo "build-engine-env: ERROR: $*" >&2; exit 1; }

want_stamp=$(cat "$0" "$runtime_lock" "$pip_lock" tests/cpu_engine/pyproject.toml | sha256sum | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want_stamp" ] && [ -x "$wrapper" ]; then
  log "up to date ($env_dir)"
  exit 0
fi
start=$(date +%s)

# --- system tools: SGLang's JIT extension, dpkg-deb -------------------------------------------
need_apt=()
command -v g++ >/dev/null 2>&1 || need_apt+=(g++)
command -v ninja >/dev/null 2>&1 || need_apt+=(ninja-build)
[ -f /usr/include/openssl/sha.h ] || need_apt+=(libssl-dev)
if [ ${#need_apt[@]} -gt 0 ]; then
  [ "$(id -u)" -eq 0 ] || die "missing ${need_apt[*]} (run as root or install them)"
  log "apt-get install ${need_apt[*]}"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi
command -v dpkg-deb >/dev/null || die "dpkg-deb not found (needed to unpack the runtime .debs)"

# --- Python 3.12 --------------------------------------------------------------------------------
py=""
for cand in python3.12 /root/.pyenv/versions/3.12*/bin/python3.12 "$HOME"/.pyenv/versions/3.12*/bin/python3.12; do
  if command -v "$cand" >/dev/null 2>&1 \
     && "$cand" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))' 2>/dev/null; then
    py=$(command -v "$cand"); break
  fi
done
[ -n "$py" ] || die "Python 3.12 not found (python3.12 on PATH or ~/.pyenv/versions/3.12*): \
sglang 0.5.23 and amd-mori 1.2.4 share only cp312 wheels"

# --- the runtime libraries ------------------------------------------------------------------------
bash "$root/scripts/fetch-pinned-debs.sh" "$runtime_lock" "$deb_cache" "$shared_debs"
rm -rf "$sysroot.tmp"
mkdir -p "$sysroot.tmp"
while read -r pkg ver suite file sha; do
  [[ -z "$pkg" || "$pkg" == \#* ]] && continue
  [ "$(sha256sum "$deb_cache/$file" | cut -d' ' -f1)" = "$sha" ] \
    || die "$deb_cache/$file changed under us (sha256 mismatch)"
  dpkg-deb -x "$deb_cache/$file" "$sysroot.tmp"
done < "$runtime_lock"
# libmori_pybinds.so NEEDs libre2.so.10 but uses no re2 symbol (nm -D --undefined-only shows
# none); bookworm ships libre2.so.9, which libgrpc itself uses.
ln -sf libre2.so.9 "$sysroot.tmp/usr/lib/x86_64-linux-gnu/libre2.so.10"

# --- the venv and its wrapper ---------------------------------------------------------------------
[ -x "$env_dir/bin/python3.12" ] || "$py" -m venv "$env_dir"
rm -rf "$sysroot"
mv "$sysroot.tmp" "$sysroot"
real_py=$(readlink -f "$env_dir/bin/python3.12")
cat > "$wrapper.tmp" <<WRAP
#!/bin/sh
# The engine environment's Python under trixie's glibc loader (scripts/build-engine-env.sh).
# MORI_CPU_LOADER: the prefix mori binaries (umbp_standalone_server) must be started with.
export MORI_CPU_LOADER="$libdir/ld-linux-x86-64.so.2 --library-path $libdir"
exec $libdir/ld-linux-x86-64.so.2 --library-path $libdir --argv0 $wrapper $real_py "\$@"
WRAP
chmod +x "$wrapper.tmp" && mv "$wrapper.tmp" "$wrapper"
pip_env=(env PIP_DISABLE_PIP_VERSION_CHECK=1)
"${pip_env[@]}" "$wrapper" -m pip install -q --upgrade "pip>=24" "setuptools>=77" wheel
log "installing $(grep -c '==' "$pip_lock") pinned packages (torch is a 5 GB CUDA build)"
"${pip_env[@]}" "$wrapper" -m pip install -q --no-deps -r "$pip_lock"
"${pip_env[@]}" "$wrapper" -m pip install -q --no-deps -e "$root/tests/cpu_engine" -e "$root"

# Smoke: SGLang, the host pools, the cache controller, mori and the server entry in ONE process.
"$wrapper" - "$env_dir" <<'PY' || die "the environment was built but its smoke import fails"
import os, sys
import torch, torchvision, mori.umbp, sglang
import sglang.srt.managers.cache_controller, sglang.srt.entrypoints.http_server  # noqa: F401
from sglang.srt.mem_cache.storage.umbp import umbp_store  # noqa: F401
import hicache_umbp, hicache_cpu_engine  # noqa: F401
assert os.path.samefile(sys.prefix, sys.argv[1]), sys.prefix
assert sglang.__version__ == "0.5.23", sglang.__version__
assert not torch.cuda.is_available()
print("build-engine-env: torch", torch.__version__, "sglang", sglang.__version__, "mori.umbp OK",
      file=sys.stderr)
PY
echo "$want_stamp" > "$stamp"
log "ready: $env_dir ($(du -sh "$env_dir" | cut -f1), $(( $(date +%s) - start )) s); run with $wrapper"
