#!/usr/bin/env bash
# `make render-chart`: prints the chart rendered by real helm with default values (the objects a
# `helm install` would create, CRDs included). Extra arguments go to `helm template`
# (e.g. --set operatorConfig.watchNamespaces={models}).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
helm=.cache/bin/helm
[ -x "$helm" ] || { echo "render-chart: $helm missing; run make chart-tools" >&2; exit 1; }
exec "$helm" template sglang-hicache charts/sglang-hicache-operator \
  --namespace sglang-hicache-system --include-crds "$@"
