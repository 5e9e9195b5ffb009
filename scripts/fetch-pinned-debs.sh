#!/usr/bin/env bash
# Makes every .deb of a lock file (package version suite filename sha256) present and verified in
# a cache directory, from, in order: the cache itself (sha256 matches), a shared read-only copy
# (../shared/debs/mori-cpu-runtime by default), or a download of THE SAME version through a
# private, throw-away apt configuration (own sources.list, state and cache; the system's apt is
# never touched). Fails naming the package and version when an exact version is gone.
#
# usage: fetch-pinned-debs.sh LOCK CACHE_DIR [SHARED_DIR]
set -euo pipefail
lock=$1; deb_cache=$2; shared_debs=${3:-}
log() { echo "fetch-pinned-debs: $*" >&2; }
die() { echo "fetch-pinned-debs: ERROR: $*" >&2; exit 1; }
sha_ok() { [ -f "$1" ] && [ "$(sha256sum "$1" | cut -d' ' -f1)" = "$2" ]; }

mkdir -p "$deb_cache"
declare -a missing_pkgs=() missing_suites=()
while read -r pkg ver suite file sha; do
  [[ -z "$pkg" || "$pkg" == \#* ]] && continue
  if sha_ok "$deb_cache/$file" "$sha"; then continue; fi
  if [ -n "$shared_debs" ] && sha_ok "$shared_debs/$file" "$sha"; then
    cp "$shared_debs/$file" "$deb_cache/$file.tmp" && mv "$deb_cache/$file.tmp" "$deb_cache/$file"
    continue
  fi
  missing_pkgs+=("$pkg=$ver@$suite@$file@$sha")
  missing_suites+=("$suite")
done < "$lock"
[ "${#missing_pkgs[@]}" -eq 0 ] && exit 0

command -v apt-get >/dev/null || die "apt-get not found and these .debs are not cached: ${missing_pkgs[*]}"
apt_dir=$(mktemp -d "${TMPDIR:-/tmp}/pinned-apt.XXXXXX")
trap 'rm -rf "$apt_dir"' EXIT
mkdir -p "$apt_dir"/{state/lists/partial,cache/archives/partial,etc/sources.list.d,etc/preferences.d,dl}
: > "$apt_dir/state/status"
keyring=/usr/share/keyrings/debian-archive-keyring.gpg
if [ -f "$keyring" ]; then opts="[arch=amd64 signed-by=$keyring]"; else
  # Without Debian's keyring the index is unauthenticated, but every file is still checked
  # against the sha256 pinned in the lock file below.
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
not cached in $deb_cache${shared_debs:+ or $shared_debs}: ${gone[*]}. Obtain these exact .debs \
(e.g. from snapshot.debian.org) and put them in $deb_cache."
