"""The test stand-in for the router image (``images/router/Dockerfile``), as ``pod.image`` is the
engine image's: its files, its user and its environment.

The files are this machine's router environment (``make router-env``: a venv with the same smg
wheel the image's ``/opt/venv`` holds) and the interpreter it was made from, bound into each
container at their paths (``pod.shim``); ``smg`` is first on ``PATH`` as ``/opt/venv/bin`` is in
the image. The user is the Dockerfile's ``USER`` (10001:10001, no supplementary groups), the
working directory its ``WORKDIR`` (``/tmp``, the container's own writable layer), the environment
its runtime stage's ``ENV``. ``KUBECONFIG``, naming the API emulator, stands in for the
service-account token and CA the kubelet mounts (``automountServiceAccountToken``): the emulator
serves plain HTTP, and kube-rs' in-cluster configuration needs HTTPS. Not imitated: the image's
read-only root filesystem (as for the engine image).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from .image import ROOT, Image, dockerfile_env

DOCKERFILE = ROOT / "images" / "router" / "Dockerfile"
SMG = ROOT / ".cache" / "venvs" / "router" / "bin" / "smg"


def _runtime_stage(dockerfile: Path, workdir: Path) -> Path:
    """The last stage of a multi-stage Dockerfile as a file of its own (what the image is)."""
    text = dockerfile.read_text()
    starts = [m.start() for m in re.finditer(r"^FROM\s", text, re.M)]
    out = workdir / "Dockerfile.runtime"
    out.write_text(text[starts[-1]:])
    return out


def _user(dockerfile: Path) -> tuple[int, int]:
    (uid, gid), = re.findall(r"^USER\s+(\d+):(\d+)", dockerfile.read_text(), re.M)
    return int(uid), int(gid)


def _workdir(dockerfile: Path) -> str:
    return str(re.findall(r"^WORKDIR\s+(\S+)", dockerfile.read_text(), re.M)[-1])


def make_router_image(workdir: Path, kubeconfig: Path) -> Image:
    """The router image on this machine; ``kubeconfig``: the API the router pods watch."""
    if not SMG.exists():
        raise AssertionError(f"{SMG} missing: run `make router-env`")
    bin_dir = workdir / "image-bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    smg = bin_dir / "smg"
    if not smg.exists():
        smg.symlink_to(SMG)
    for d in (bin_dir, workdir):
        os.chmod(d, 0o755)
    env = dockerfile_env(_runtime_stage(DOCKERFILE, workdir))
    env["PATH"] = f"{bin_dir}:/usr/local/bin:/usr/bin:/bin"
    env["KUBECONFIG"] = str(kubeconfig)
    env.setdefault("HOME", "/")  # Docker's HOME for a USER without a passwd entry
    venv_python = SMG.parent / "python"
    base = Path(os.path.realpath(venv_python)).parents[1]  # <prefix>/bin/python3.x
    uid, gid = _user(DOCKERFILE)
    paths = (str(bin_dir), str(SMG.parents[1]), str(base))
    return Image(bin_dir=bin_dir, env=env, home=_workdir(DOCKERFILE), uid=uid, gid=gid,
                 groups=(), paths=paths)
