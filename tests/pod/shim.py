"""Container init: the part of a container runtime a kubelet test needs (run as root).

Started as ``unshare --mount --propagation private -- PYTHON shim.py SPEC.json`` so every mount
below is private to this container. Then, in order:

1. join the container's memory cgroup (write our pid to ``cgroup.procs``): the limit holds for
   this process and everything it starts, exactly as for a container's processes;
2. give the container its own ``/dev`` (a tmpfs holding ``null``, ``zero``, ``random``, ...,
   and the device files the device plugin allocated: ``/dev/dri/renderD*`` and ``/dev/kfd``);
3. merge the fake GPU sysfs into ``/sys/class`` (kfd, drm), ``/sys/bus/pci/devices`` and
   ``/sys/devices/pci0000:00``, so the launcher reads a MI355X node's topology at the real paths
   while the machine's own devices stay visible;
4. bind the pod's volumes at their ``mountPath`` (read-only where the spec says so);
5. ``/root`` becomes a 0755 tmpfs holding only the interpreter tree, so a non-root container
   user can run the (test) image's Python, as in an image where Python lives outside /root;
6. exec the container's command through ``setpriv`` with the pod's uid, gid, supplementary
   groups (fsGroup included), capabilities (bounding, inheritable and ambient: exactly the
   ``securityContext`` ones) and ``no_new_privs``, in the container's working directory with
   exactly the container's environment.

Standard library only; the spec is JSON written by :mod:`pod.runtime`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys


def sh(*args: str) -> None:
    subprocess.run(args, check=True)


def bind(source: str, target: str, read_only: bool = False) -> None:
    if os.path.isdir(source):
        os.makedirs(target, exist_ok=True)
    elif not os.path.exists(target):
        os.makedirs(os.path.dirname(target), exist_ok=True)
        open(target, "a").close()
    sh("mount", "--bind", source, target)
    if read_only:
        sh("mount", "-o", "remount,bind,ro", target)


def _copy_entry(source: str, target: str) -> None:
    if os.path.islink(source):
        os.symlink(os.readlink(source), target)
    else:
        bind(source, target)


def merge(target: str, fake: str, stage: str) -> None:
    """``target`` becomes a tmpfs holding its real entries and ``fake``'s (fake wins)."""
    real = os.path.join(stage, "merge" + target.replace("/", "_"))
    bind(target, real)
    sh("mount", "-t", "tmpfs", "-o", "mode=755,size=1m", "tmpfs", target)
    fake_names = set(os.listdir(fake))
    for name in sorted(os.listdir(real)):
        if name not in fake_names:
            _copy_entry(os.path.join(real, name), os.path.join(target, name))
    for name in sorted(fake_names):
        _copy_entry(os.path.join(fake, name), os.path.join(target, name))


def main() -> None:
    with open(sys.argv[1]) as f:
        spec = json.load(f)
    if spec.get("cgroup_procs"):
        with open(spec["cgroup_procs"], "w") as f:
            f.write(str(os.getpid()))
    stage = spec["stage_dir"]
    os.makedirs(stage, exist_ok=True)

    # 2. /dev
    dev = os.path.join(stage, "dev")
    os.makedirs(dev, exist_ok=True)
    sh("mount", "-t", "tmpfs", "-o", "mode=755,size=1m", "tmpfs", dev)
    for node in ("null", "zero", "full", "random", "urandom", "tty"):
        bind(f"/dev/{node}", f"{dev}/{node}")
    for d in ("shm", "pts", "dri"):
        os.makedirs(f"{dev}/{d}", exist_ok=True)
    bind("/dev/pts", f"{dev}/pts")
    for name in ("fd", "stdin", "stdout", "stderr"):
        target = "/proc/self/fd" + {"fd": "", "stdin": "/0", "stdout": "/1", "stderr": "/2"}[name]
        os.symlink(target, f"{dev}/{name}")
    for rel, source in spec.get("devices", {}).items():
        bind(source, f"{dev}/{rel}")
    sh("mount", "--move", dev, "/dev")

    # 3. fake GPU sysfs, merged over the real directories: the machine's own entries stay
    # (gloo follows /sys/class/net/<if>/device into /sys/devices/pci0000:00), the node's GPUs
    # (which this machine does not have) are added.
    for target, fake in spec.get("sys_merge", {}).items():
        merge(target, fake, stage)

    # 4. the pod's volumes
    for m in spec["mounts"]:
        bind(m["source"], m["target"], m.get("readOnly", False))

    # 5. the interpreter tree for a non-root user
    keep = [p for p in spec.get("root_keep", []) if os.path.exists(p)]
    if keep:
        saved = os.path.join(stage, "root-keep")
        for i, path in enumerate(keep):
            bind(path, f"{saved}/{i}")
        sh("mount", "-t", "tmpfs", "-o", "mode=755,size=1m", "tmpfs", "/root")
        for i, path in enumerate(keep):
            bind(f"{saved}/{i}", path)

    # 6. exec as the container user
    os.chdir(spec["cwd"])
    user = spec["user"]
    caps = ",".join(f"+{c}" for c in spec["capabilities"])
    argv = ["setpriv", f"--reuid={user['uid']}", f"--regid={user['gid']}"]
    groups = ",".join(map(str, user["groups"]))
    argv += [f"--groups={groups}"] if groups else ["--clear-groups"]
    argv += [f"--bounding-set=-all{',' + caps if caps else ''}",
             f"--inh-caps=-all{',' + caps if caps else ''}"]
    if caps:
        argv.append(f"--ambient-caps={caps}")
    if spec.get("no_new_privs"):
        argv.append("--no-new-privs")
    argv += ["--", *spec["argv"]]
    os.execvpe("setpriv", argv, spec["env"])


if __name__ == "__main__":
    main()
