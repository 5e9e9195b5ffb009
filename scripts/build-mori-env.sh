#!/usr/bin/env bash
# Builds the real-mori test environment (DESIGN.md §7) under .cache/venvs/mori, reproducibly:
#   - a Python 3.10 venv with amd-mori 1.2.4 (cp310 wheel) and pinned test tools, plus this
#     project installed editable (--no-deps);
#   - the Debian runtime libraries mori needs (scripts/mori-runtime.lock: package, version,
#     suite, file, sha256), unpacked with `dpkg-deb -x` into .cache/venvs/mori/sysroot. Never
#     installed system-wide. Each .deb comes from, in order: .cache/debs/ (if its sha256
#     matches), ../shared/debs/mori-cpu-runtime/ (if verified), or a download of THE SAME version
#     through a private apt configuration (own sources.list, state and cache dirs).
# scripts/mori-python then runs the venv's python under the trixie loader from the sysroot.
# A stamp file makes a rerun with nothing changed take well under a second.
#
# Env knobs (for tests of this script): MORI_ENV_DIR (default .cache/venvs/mori),
# MORI_DEB_CACHE (default .cache/debs), MORI_SHARED_DEBS (default ../shared/debs/mori-cpu-runtime),
# MORI_RUNTIME_LOCK (default scripts/mori-runtime.lock).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
env_dir=${MORI_ENV_DIR:-$root/.cache/venvs/mori}
deb_cache=${MORI_DEB_CACHE:-$root/.cache/debs}
shared_debs=${MORI_SHARED_DEBS:-$root/../shared/debs/mori-cpu-runtime}
lock=${MORI_RUNTIME_LOCK:-$root/scripts/mori-runtime.lock}
sysroot=$env_dir/sysroot
stamp=$env_dir/.built
# Python packages of the mori venv; amd-mori ships only cp310/cp312 wheels (cp310 used here).
pip_pins=(amd-mori==1.2.4 numpy==2.2.6 pytest==9.2.0 pytest-timeout==2.4.0 hypothesis==6.168.5
          # ... and what those pull in, pinned too so a later rebuild gets the same venv
          exceptiongroup==1.3.2 iniconfig==2.3.1 packaging==26.4 pluggy==1.7.0 Pygments==2.21.0
          sortedcontainers==2.4.0 tomli==2.5.0 typing_extensions==4.16.0)

log() { echo "build-mori-env: $*" >&2; }
die() { echo "build-mori-env: ERROR: $*" >&2; exit 1; }

want_stamp=$(cat "$0" "$lock" | sha256sum | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want_stamp" ] \
   && [ -x "$env_dir/bin/python3.10" ] && [ -x "$sysroot/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2" ]; then
  log "up to date ($env_dir)"
  exit 0
fi

# --- Python 3.10 -----------------------------------------------------------------------------
py=""
for cand in python3.10 /root/.pyenv/versions/3.10*/bin/python3.10 "$HOME"/.pyenv/versions/3.10*/bin/python3.10; do
  if command -v "$cand" >/dev/null 2>&1 \
     && "$cand" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 10))' 2>/dev/null; then
    py=$(command -v "$cand"); break
  fi
done
[ -n "$py" ] || die "Python 3.10 not found (tried python3.10 on PATH and ~/.pyenv/versions/3.10*). \
amd-mori 1.2.4 ships cp310 wheels only for manylinux_2_35; install Python 3.10 (e.g. pyenv install 3.10)."
command -v dpkg-deb >/dev/null || die "dpkg-deb not found (needed to unpack the runtime .debs)"

# --- the pinned .debs ------------------------------------------------------------------------
mkdir -p "$deb_cache"
sha_ok() { [ -f "$1" ] && [ "$(sha256sum "$1" | cut -d' ' -f1)" = "$2" ]; }

declare -a missing_pkgs=() missing_suites=()
while read -r pkg ver suite file sha; do
  [[ -z "$pkg" || "$pkg" == \#* ]] && continue
  if sha_ok "$deb_cache/$file" "$sha"; then continue; fi
  if sha_ok "$shared_debs/$file" "$sha"; then
    cp "$shared_debs/$file" "$deb_cache/$file.tmp" && mv "$deb_cache/$file.tmp" "$deb_cache/$file"
    continue
  fi
  missing_pkgs+=("$pkg=$ver@$suite@$file@$sha")
  missing_suites+=("$suite")
done < "$lock"

if [ "${#missing_pkgs[@]}" -gt 0 ]; then
  command -v apt-get >/dev/null || die "apt-get not found and these .debs are not cached: ${missing_pkgs[*]}"
  # A private, throw-away apt tree (removed on any exit, failures included).
  apt_dir=$(mktemp -d "${TMPDIR:-/tmp}/mori-apt.XXXXXX")
  trap 'rm -rf "$apt_dir"' EXIT
  mkdir -p "$apt_dir"/{state/lists/partial,cache/archives/partial,etc/sources.list.d,etc/preferences.d,dl}
  : > "$apt_dir/state/status"
  keyring=/usr/share/keyrings/debian-archive-keyring.gpg
  if [ -f "$keyring" ]; then opts="[arch=amd64 signed-by=$keyring]"; else
    # Without Debian's keyring the index is unauthenticated, but every file is still checked
    # against the sha256 pinned in mori-runtime.lock below.
    opts="[arch=amd64 trusted=yes]"; fi
  for suite in $(printf '%s\n' "${missing_suites[@]}" | sort -u); do
    case "$suite" in
      *-security) echo "deb $opts http://deb.debian.org/debian-security ${suite%-security}-security main" ;;
      *) echo "deb $opts http://deb.debian.org/debian $suite main" ;;
    esac
  done > "$apt_dir/etc/sources.list"
  apt_opts=(-o "Dir::State=$apt_dir/state" -o "Dir::State::status=$apt_dir/state/status"
            -o "Dir::Cache=$apt_dir/cache" -o "Dir::Etc::SourceList=$apt_dir/etc/sources.list"
            -o "Dir::Etc::SourceParts=$apt_dir/etc/sources.list.d"
            -o "Dir::Etc::Preferences=$apt_dir/etc/preferences"
            -o "Dir::Etc::PreferencesParts=$apt_dir/etc/preferences.d"
            -o "APT::Architecture=amd64" -o "APT::Architectures=amd64"
            -o "Acquire::Languages=none" -o "APT::Sandbox::User=root" -o "Debug::NoLocking=1")
  log "downloading ${#missing_pkgs[@]} pinned .deb(s) through a private apt configuration"
  apt-get -q "${apt_opts[@]}" update >&2 || die "apt-get update failed for suites: \
$(printf '%s\n' "${missing_suites[@]}" | sort -u | tr '\n' ' ')(is deb.debian.org reachable?)"
  gone=()
  for entry in "${missing_pkgs[@]}"; do
    IFS=@ read -r pkgver suite file sha <<< "$entry"
    if ! (cd "$apt_dir/dl" && apt-get -q "${apt_opts[@]}" download "$pkgver" >&2); then
      gone+=("$pkgver (Debian $suite)"); continue
    fi
    got=$(ls "$apt_dir/dl/${pkgver%%=*}_"*.deb 2>/dev/null | head -n1)
    sha_ok "$got" "$sha" || die "$pkgver (Debian $suite): downloaded file $got does not match the \
pinned sha256 $sha"
    mv "$got" "$deb_cache/$file"
  done
  [ "${#gone[@]}" -eq 0 ] || die "pinned package version(s) no longer available from Debian and \
not cached in $deb_cache or $shared_debs: ${gone[*]}. Obtain these exact .debs (e.g. from \
snapshot.debian.org) and put them in $deb_cache."
  rm -rf "$apt_dir"
fi

# --- the venv --------------------------------------------------------------------------------
if [ ! -x "$env_dir/bin/python3.10" ]; then
  log "creating venv with $py"
  "$py" -m venv "$env_dir"
fi
"$env_dir/bin/python3.10" -m pip install -q "${pip_pins[@]}"
"$env_dir/bin/python3.10" -m pip install -q --no-deps -e "$root"

# --- unpack the runtime into the sysroot -----------------------------------------------------
rm -rf "$sysroot.tmp"
mkdir -p "$sysroot.tmp"
while read -r pkg ver suite file sha; do
  [[ -z "$pkg" || "$pkg" == \#* ]] && continue
  sha_ok "$deb_cache/$file" "$sha" || die "$deb_cache/$file changed under us (sha256 mismatch)"
  dpkg-deb -x "$deb_cache/$file" "$sysroot.tmp"
done < "$lock"
rm -rf "$sysroot"
mv "$sysroot.tmp" "$sysroot"

# Smoke check through the wrapper: the loader, the libraries and the wheel fit together.
MORI_ENV_DIR=$env_dir "$root/scripts/mori-python" -c \
  'import os, sys, mori.umbp; assert os.path.samefile(sys.prefix, sys.argv[1]), sys.prefix' "$env_dir" \
  || die "the environment was built but 'import mori.umbp' fails under scripts/mori-python"
echo "$want_stamp" > "$stamp"
log "ready: $env_dir (run with scripts/mori-python)"
