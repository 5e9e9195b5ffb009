#!/usr/bin/env bash
# Builds the router's test environment under .cache (git-ignored), the same two real programs a
# cluster runs in front of and beside the engines:
#   .cache/venvs/router   SGLang's model gateway `smg` (PyPI, Rust extension, runs on CPU), the
#                         binary images/router/Dockerfile installs; .cache/bin/smg runs it
#   .cache/bin/prometheus Debian's prometheus package (server and promtool), unpacked from its
#   .cache/bin/promtool   .deb with `dpkg-deb -x` (nothing installed system-wide, no service)
# Used by the e2e tier (the gateway's Kubernetes discovery against the API emulator), the chart
# tier (promtool on the chart's rules) and the pod tier (Prometheus scraping served pods).
# Idempotent: a stamp of the pins makes a rerun with nothing changed return at once.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

SMG_PIN="smg==1.13.0"
PROMETHEUS_DEB="prometheus=2.42.0+ds-5+deb12u1"
PINS="$SMG_PIN $PROMETHEUS_DEB"
venv=.cache/venvs/router
bin=.cache/bin
debs=.cache/debs/prometheus
stamp=$venv/.router-env-stamp
log() { echo "build-router-env: $*" >&2; }

if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$PINS" ] && [ -x "$bin/smg" ] \
   && [ -x "$bin/prometheus" ] && [ -x "$bin/promtool" ]; then
  log "up to date ($PINS)"
  exit 0
fi

py=""
for cand in python3.11 /root/.pyenv/versions/3.11*/bin/python3.11 python3; do
  if command -v "$cand" >/dev/null 2>&1 \
     && "$cand" -c 'import sys; sys.exit(sys.version_info[:2] < (3, 9))'; then
    py=$(command -v "$cand"); break
  fi
done
[ -n "$py" ] || { log "need Python >= 3.9"; exit 1; }
mkdir -p .cache/venvs "$bin" "$debs"
[ -x "$venv/bin/python" ] || "$py" -m venv "$venv"
"$venv/bin/python" -m pip install -q --upgrade "pip>=24"
"$venv/bin/python" -m pip install -q "$SMG_PIN"
ln -sf "$root/$venv/bin/smg" "$bin/smg"
"$bin/smg" launch --help >/dev/null

# Debian's prometheus: download the pinned .deb (no dependencies: both binaries are static Go
# programs; the web console assets it depends on are not needed) and unpack the two binaries.
deb=$(ls "$debs"/prometheus_2.42.0*_amd64.deb 2>/dev/null | head -n1 || true)
if [ -z "$deb" ]; then
  if ! (cd "$debs" && apt-get download -q "$PROMETHEUS_DEB" >/dev/null 2>&1); then
    log "apt-get download failed; updating the package lists once"
    apt-get update -qq >/dev/null
    (cd "$debs" && apt-get download -q "$PROMETHEUS_DEB" >/dev/null)
  fi
  deb=$(ls "$debs"/prometheus_2.42.0*_amd64.deb | head -n1)
fi
unpack=.cache/prometheus-deb
rm -rf "$unpack"
dpkg-deb -x "$deb" "$unpack"
install -m 0755 "$unpack/usr/bin/prometheus" "$bin/prometheus"
install -m 0755 "$unpack/usr/bin/promtool" "$bin/promtool"
rm -rf "$unpack"
"$bin/promtool" --version 2>&1 | head -n1 >&2
echo "$PINS" > "$stamp"
log "ready: $bin/smg, $bin/prometheus, $bin/promtool"
