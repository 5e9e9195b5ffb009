"""The test stand-in for the engine image: its files, its user and its environment.

The environment is the real image's: the base image's ENV (``images/engine/base-image.env``, the
upstream SGLang ROCm image's list) overlaid with the ENV lines of ``images/engine/Dockerfile``,
then ``PATH`` pointing at this image's binaries. So SGLang in a test container meets
``SGLANG_SET_CPU_AFFINITY=1`` and the rest exactly as in production.

The files are this machine's engine environment (``scripts/build-engine-env.sh``), the project
checkout (installed editable into it) and the interpreter it was made from. A real image's files
are visible to its user wherever they are and whatever is mounted: a volume at ``/tmp`` does not
hide ``/usr/lib``, and a directory's mode does not lock the image's user out. The tier gets the
same from any checkout (under ``/tmp``, under a mode-0700 ``/root``, ...): the shim binds every
path of :attr:`Image.paths` back on top of the container's writable layer and volumes, and
replaces an ancestor directory its user could not traverse by a bare 0755 one (see
``tests/pod/shim.py``). :attr:`Image.files` are image files at fixed paths (the prebuilt
torch extensions under ``/opt/sglang-hicache``), copied into each container start's writable
layer (``pod.runtime``), as a container writes its image's files copy-on-write.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BASE_ENV_FILE = ROOT / "images" / "engine" / "base-image.env"
DOCKERFILE = ROOT / "images" / "engine" / "Dockerfile"
# Group ids the image's /etc/group gives its user (useradd --groups video,render in the
# Dockerfile, on the base's group table): containerd adds them to the process like
# supplementalGroups. They match a node's device groups only by chance.
IMAGE_VIDEO_GID, IMAGE_RENDER_GID = 44, 109


def read_env_file(path: Path = BASE_ENV_FILE) -> tuple[str, dict[str, str]]:
    """(the ``# image:`` reference, KEY -> value) of an env file."""
    image, env = "", {}
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if line.startswith("# image:"):
            image = line.split(":", 1)[1].strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if not sep or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
            raise ValueError(f"{path}: {raw!r} is not KEY=VALUE")
        env[key] = value
    return image, env


def dockerfile_from(path: Path = DOCKERFILE) -> str:
    (ref,) = re.findall(r"^FROM\s+(\S+)", path.read_text(), re.M)
    return ref


def dockerfile_env(path: Path = DOCKERFILE, base: dict[str, str] | None = None) -> dict[str, str]:
    """The ENV instructions of a single-stage Dockerfile, in order, ``$VAR``/``${VAR}``
    expanded against ``base`` and earlier ENV (``KEY=VALUE`` forms, quotes stripped)."""
    env = dict(base or {})
    out: dict[str, str] = {}
    text = re.sub(r"\\\n", " ", path.read_text())
    for line in text.splitlines():
        m = re.match(r"\s*ENV\s+(.*)$", line)
        if not m:
            continue
        for key, value in re.findall(r'([A-Za-z_][A-Za-z0-9_]*)=("[^"]*"|\S*)', m.group(1)):
            value = re.sub(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?",
                           lambda v: env.get(v.group(1), ""), value.strip('"'))
            env[key] = out[key] = value
    return out


def image_env(bin_dir: Path) -> dict[str, str]:
    _, base = read_env_file()
    env = {**base, **dockerfile_env(base=base)}
    env["PATH"] = f"{bin_dir}:/usr/local/bin:/usr/bin:/bin"
    return env


@dataclass(frozen=True)
class Image:
    """What the engine image holds, as the tier's containers see it.

    ``bin_dir`` holds ``python`` (the engine environment's interpreter) and
    ``umbp_standalone_server`` (mori's binary under the environment's loader), first on PATH as
    /usr/local/bin is in the image; ``env``, ``home``, ``uid``/``gid`` and ``groups`` mirror the
    Dockerfile's ENV, USER and the image's group table; ``paths`` are host paths a container
    sees at the same path, ``files`` container path -> host path.
    """

    bin_dir: Path
    env: dict[str, str]
    home: str = "/home/sglang"
    uid: int = 10001
    gid: int = 0
    groups: tuple[int, ...] = (IMAGE_VIDEO_GID, IMAGE_RENDER_GID)
    paths: tuple[str, ...] = ()
    files: dict[str, str] = field(default_factory=dict)


def _outermost(paths: list[str]) -> tuple[str, ...]:
    out: list[str] = []
    for p in sorted(set(paths)):
        if not any(p == o or p.startswith(o.rstrip("/") + "/") for o in out):
            out.append(p)
    return tuple(out)


def prebuild_torch_extensions(target: Path, env: dict[str, str]) -> None:
    """Compile SGLang's JIT page-hash extension into ``target``, as the image build does
    (images/engine/Dockerfile), so a container start finds it built."""
    target.mkdir(parents=True, exist_ok=True)
    code = ("from sglang.srt.mem_cache.cpp_utils.native_hash import _load_native_hash_module;"
            "_load_native_hash_module()")
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                   env={**os.environ, **env, "TORCH_EXTENSIONS_DIR": str(target)})
    for lock in target.rglob("lock"):  # torch's build lock, left behind: not image content
        lock.unlink()
    for dirpath, dirs, files in os.walk(target):
        for name in [dirpath, *(os.path.join(dirpath, n) for n in dirs + files)]:
            os.chown(name, 10001, 0)


def make_image(workdir: Path) -> Image:
    """The engine image on this machine: ``python`` is the engine environment's interpreter,
    ``umbp_standalone_server`` mori's binary under the environment's loader."""
    from hicache_umbp.clients.runtime import mori_loader_prefix, standalone_server_binary

    bin_dir = workdir / "image-bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    python = bin_dir / "python"
    if not python.exists():
        python.symlink_to(sys.executable)
    server = bin_dir / "umbp_standalone_server"
    loader = " ".join(mori_loader_prefix())
    server.write_text(f"#!/bin/sh\nexec {loader} {standalone_server_binary()} \"$@\"\n")
    server.chmod(0o755)
    for d in (bin_dir, workdir):
        os.chmod(d, 0o755)
    env = image_env(bin_dir)
    files: dict[str, str] = {}
    ext_dir = env.get("TORCH_EXTENSIONS_DIR")
    if ext_dir:
        built = workdir / "torch-extensions"
        prebuild_torch_extensions(built, env)
        files[ext_dir] = str(built)
    paths = _outermost([str(bin_dir), str(ROOT), sys.prefix, sys.base_prefix,
                        os.path.dirname(os.path.realpath(sys.executable))])
    return Image(bin_dir=bin_dir, env=env, paths=paths, files=files)


def served_files(root: Path, arch: str = "llama") -> tuple[Path, Image]:
    """What a served pod needs under ``root``, readable by the pod's uid 10001: a tiny model
    generated here (``models/tiny-llama``, architecture ``arch``) and the engine image.
    Returns (the models directory, the image)."""
    from hicache_cpu_engine.tiny_model import make_model

    root.chmod(0o755)
    models = root / "models"
    make_model(models / "tiny-llama", arch)
    models.chmod(0o755)
    return models, make_image(root / "image")
