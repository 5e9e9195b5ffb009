#!/usr/bin/env bash
# Builds .cache/venvs/sglang: a Python 3.11 venv with real SGLang 0.5.23 on CPU torch, for the
# `sglang` test tier (tests/backend/test_*_sglang.py) and `make bench-sglang`.
#
# What is installed and why:
#   * torch==2.13.0 CPU build. Pinned on EVERY pip call through a constraints file: sglang pins
#     torch==2.14.1 and anything that depends on torch would otherwise pull a multi-GB CUDA build.
#     The CPU wheel is the local one this machine kind ships (/opt/wheels, or $TORCH_CPU_WHEEL);
#     PyPI carries only CUDA builds of torch for Linux, so without it the script stops.
#   * sglang==0.5.23 with --no-deps: its metadata pulls flashinfer, deep-gemm, CUDA kernels and
#     ~80 other packages; we install only what the imports of the host pools, the HiCache
#     controller, the storage backend factory and the server-args module demand, following
#     sglang's own pins where it has one (transformers, tokenizers, sentencepiece,
#     compressed-tensors, apache-tvm-ffi).
#   * the project itself (`pip install -e . --no-deps`) and pytest, pytest-timeout, hypothesis.
#
# CPU stand-ins (scripts/sglang-cpu-stubs/, put on sys.path by a .pth file in the venv):
#   * torchvision: PyPI has only CUDA builds of torchvision and they cannot import beside CPU
#     torch (the C++ ops do not load). transformers imports torchvision.transforms at import
#     time and enumerates `InterpolationMode`, so the stand-in provides that as a real Enum and
#     nothing else; any real use of torchvision fails with ImportError-like errors.
#   * triton: no stand-in. sglang.srt.utils.common imports triton at module level and SGLang's
#     own stub (sglang/_platform_stubs.py) only activates on macOS arm64, so the real triton wheel
#     (PyPI, ~200 MB) is installed: importing it works on a CPU-only machine and nothing in the
#     code paths the tier runs compiles a kernel.
#
# The page-hash helper of SGLang JIT-compiles a C++ extension on first use: g++, ninja and
# libssl-dev are installed with apt-get when missing (CI runs as root on a fresh machine).
#
# Idempotent: a stamp file records the hash of this script, the stand-ins and pyproject.toml;
# a rerun with nothing changed returns in well under a second.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
venv=${SGLANG_ENV_DIR:-$root/.cache/venvs/sglang}  # override only to test a fresh build
stamp="$venv/.hicache-stamp"
stubs="$root/scripts/sglang-cpu-stubs"

TORCH_VERSION=2.13.0
SGLANG_VERSION=0.5.23
TRITON_VERSION=3.7.1

want=$( { cat "$0" pyproject.toml; find "$stubs" -type f -name '*.py' | sort | xargs cat; } \
        | sha256sum | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -x "$venv/bin/python" ]; then
  echo "build-sglang-env: $venv up to date"
  exit 0
fi

# --- system build tools for SGLang's JIT C++ extension ------------------------------------------
need_apt=()
command -v g++ >/dev/null 2>&1 || need_apt+=(g++)
command -v ninja >/dev/null 2>&1 || need_apt+=(ninja-build)
[ -f /usr/include/openssl/sha.h ] || need_apt+=(libssl-dev)
if [ ${#need_apt[@]} -gt 0 ]; then
  if [ "$(id -u)" -eq 0 ]; then
    echo "build-sglang-env: apt-get install ${need_apt[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" >/dev/null
  else
    echo "build-sglang-env: missing ${need_apt[*]} (run as root or install them)" >&2
    exit 1
  fi
fi

# --- interpreter ---------------------------------------------------------------------------------
py=""
for cand in python3.11 /root/.pyenv/versions/3.11*/bin/python3.11; do
  if command -v "$cand" >/dev/null 2>&1 \
     && "$cand" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' 2>/dev/null; then
    py=$(command -v "$cand"); break
  fi
done
[ -n "$py" ] || { echo "build-sglang-env: need python3.11" >&2; exit 1; }
[ -x "$venv/bin/python" ] || "$py" -m venv "$venv"
vpy="$venv/bin/python"

# --- torch pin on every pip call -----------------------------------------------------------------
constraints="$venv/hicache-constraints.txt"
local_wheel=${TORCH_CPU_WHEEL:-$(ls /opt/wheels/torch-"$TORCH_VERSION"+cpu-cp311-*.whl \
                                   2>/dev/null | head -n1 || true)}
if [ -z "$local_wheel" ] || [ ! -f "$local_wheel" ]; then
  echo "build-sglang-env: no CPU wheel of torch $TORCH_VERSION for cp311 (looked in /opt/wheels;" \
       "set TORCH_CPU_WHEEL=/path/torch-$TORCH_VERSION+cpu-cp311-...whl). PyPI has only CUDA" \
       "builds, which would pull several GB of CUDA libraries." >&2
  exit 1
fi
torch_src=("$local_wheel" --find-links "$(dirname "$local_wheel")")
echo "torch==$TORCH_VERSION+cpu" >"$constraints"
cat >>"$constraints" <<EOF
triton==$TRITON_VERSION
sglang==$SGLANG_VERSION
transformers==5.19.0
tokenizers==0.23.2
sentencepiece==0.2.1
compressed-tensors==0.18.0
apache-tvm-ffi==0.1.11
EOF
# Everything else the venv holds (direct and transitive), as resolved when the tier was built
# (2026-11-29), so a rebuild months later gets the same packages; one pin per word.
cat >>"$constraints" <<'PINS'
aiohappyeyeballs==2.7.1 aiohttp==3.14.5 aiosignal==1.4.0 annotated-doc==0.0.7
annotated-types==0.8.0 anyio==4.16.0 asttokens==3.0.2 attrs==26.1.0 certifi==2026.10.19.post1
charset-normalizer==3.5.3 click==8.5.1 dill==0.4.1 einops==0.8.2 executing==2.3.0
filelock==4.3.1 frozenlist==1.8.0 fsspec==2026.9.0 gguf==0.19.0 h11==0.16.0 hf-xet==1.8.0
httpcore==1.0.9 httpx==0.28.1 huggingface_hub==1.33.0 hypothesis==6.170.17 idna==3.20
iniconfig==2.3.1 ipython==9.18.1 ipython_pygments_lexers==1.1.1 jedi==0.20.1 Jinja2==3.1.6
loguru==0.7.3 markdown-it-py==4.3.0 MarkupSafe==3.0.4 matplotlib-inline==0.2.2 mdurl==0.1.2
mpmath==1.3.0 msgspec==0.23.0 multidict==7.2.1 networkx==3.6.1 ninja==1.13.2 numpy==2.4.6
orjson==3.13.0 packaging==26.4 parso==0.8.7 pexpect==4.9.0 pillow==13.0.0 pluggy==1.7.0
prompt_toolkit==3.0.53 propcache==0.5.4 psutil==7.2.2 ptyprocess==0.7.0 pure_eval==0.2.4
pybase64==1.5.1 pydantic==2.14.4 pydantic_core==2.50.5 Pygments==2.21.0 pytest==9.2.0
pytest-timeout==2.4.0 PyYAML==6.0.4 pyzmq==27.3.0 regex==2026.11.19 requests==2.34.2
rich==15.0.0 safetensors==0.8.0 setproctitle==1.3.8 shellingham==1.5.4 sortedcontainers==2.4.0
stack-data==0.6.3 starlette==1.10.0 sympy==1.14.0 tqdm==4.70.1 traitlets==5.16.1 typer==0.29.2
typing_extensions==4.16.0 typing-inspection==0.4.5 urllib3==2.8.0 wcwidth==0.9.4 xxhash==4.1.0
yarl==1.25.1
PINS
sed -i 's/  */\n/g' "$constraints"  # the block above: one pin per line
pip_install() { "$vpy" -m pip install -q --disable-pip-version-check -c "$constraints" "$@"; }

"$vpy" -m pip install -q --disable-pip-version-check --upgrade "pip>=24" "setuptools>=77" wheel
pip_install "${torch_src[@]}"
"$vpy" -c "import torch, sys; v = torch.__version__; sys.exit(0 if v.startswith('$TORCH_VERSION') and not torch.version.cuda else 'wrong torch ' + v)"

pip_install --no-deps "sglang==$SGLANG_VERSION"
# What the imports of sglang.srt (server args, host pools, cache controller, storage backends,
# page hashing) demand; versions follow sglang's own pins where it pins.
pip_install \
  numpy orjson psutil pybase64 requests packaging pillow starlette msgspec pydantic \
  "pyzmq>=25.1.2" tqdm dill IPython gguf "apache-tvm-ffi==0.1.11" "transformers==5.19.0" \
  "tokenizers==0.23.2" "sentencepiece==0.2.1" "compressed-tensors==0.18.0" aiohttp \
  "triton==$TRITON_VERSION" setproctitle ninja einops xxhash regex \
  pytest pytest-timeout hypothesis
pip_install --no-deps -e "$root"

# CPU stand-ins go on sys.path *after* site-packages so a real package always wins.
site=$("$vpy" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "$stubs" >"$site/zz-hicache-cpu-stubs.pth"

# Smoke: the modules the sglang tier uses import on this machine.
"$vpy" - <<'EOF'
import sglang.srt.mem_cache.memory_pool_host as host
import sglang.srt.managers.cache_controller as cc
import sglang.srt.mem_cache.storage.backend_factory as bf
import sglang.version as v
assert v.__version__ == "0.5.23", v.__version__
print("build-sglang-env: sglang", v.__version__, "imports OK")
EOF
echo "$want" >"$stamp"
echo "build-sglang-env: $venv ready"
