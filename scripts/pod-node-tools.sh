#!/usr/bin/env bash
# Host tools the pod tier's container runtime needs (tests/pod/shim.py): util-linux's unshare,
# nsenter and setpriv, and Debian's python3-seccomp for /usr/bin/python3, with which the shim
# loads containerd's RuntimeDefault seccomp profile. Installs what is missing (as root).
set -euo pipefail
need=()
for tool in unshare nsenter setpriv; do
  command -v "$tool" >/dev/null 2>&1 || need+=(util-linux)
done
/usr/bin/python3 -c 'import seccomp' 2>/dev/null || need+=(python3-seccomp)
if [ ${#need[@]} -eq 0 ]; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "pod-node-tools: missing ${need[*]} (run as root or install them)" >&2
  exit 1
fi
echo "pod-node-tools: apt-get install ${need[*]}" >&2
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
