"""Container init: the part of a container runtime a kubelet test needs (run as root).

Started as ``unshare --mount --propagation private -- /usr/bin/python3 shim.py SPEC.json`` (the
host's Python, which has Debian's ``python3-seccomp``), so every mount below is private to this
container. Then, in order:

1. join the container's cgroups: memory (the limit holds for everything it starts) and cpuset
   (the CPUs the static CPU manager gave it);
2. give the container its own ``/dev`` (a tmpfs holding ``null``, ``zero``, ``random``, ...,
   and the device files the device plugin allocated, with the host's owner and mode);
3. merge the fake GPU sysfs into ``/sys/class`` (kfd, drm), ``/sys/bus/pci/devices`` and
   ``/sys/devices/pci0000:00``, and bind the host's CPU view over ``/sys/devices/system/cpu``,
   ``/proc/cpuinfo`` and ``/proc/stat``;
4. set the image's files aside (bound under the stage directory) before anything covers them;
5. a fresh writable layer: a new empty directory at the image's ``HOME`` and at ``/tmp`` for
   every start (a kubelet gives a restarted container a new layer);
6. bind the pod's volumes at their ``mountPath`` (read-only where the spec says so);
7. put the image's files back on top at their paths (a volume at ``/tmp`` does not hide the
   image's own files, as in a real image; mount points are made inside whatever covers them,
   as a runtime does for nested mounts), and replace any ancestor directory the container user
   could not traverse (a mode-0700 ``/root``) by a bare 0755 one holding only the image paths;
8. load containerd's RuntimeDefault seccomp profile (``pod.seccomp_profile``, resolved from the
   container's configured capabilities), then exec the command through ``setpriv`` with the
   pod's uid, gid and groups (the image's groups, fsGroup, supplementalGroups), the bounding
   set of the configured capabilities, no inheritable and no ambient capabilities (Kubernetes
   gives a non-root process none: kubernetes/kubernetes#56374) and ``no_new_privs``, in the
   container's working directory with exactly the container's environment.

Standard library and ``seccomp`` only; the spec is JSON written by :mod:`pod.runtime`.
"""

from __future__ import annotations

import errno
import json
import os
import stat
import subprocess
import sys
from typing import Any


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


def locked_ancestor(path: str, uid: int, gids: set[int]) -> str | None:
    """The outermost ancestor of ``path`` that ``uid`` (with ``gids``) cannot traverse."""
    parts = path.strip("/").split("/")[:-1]
    for i in range(1, len(parts) + 1):
        d = "/" + "/".join(parts[:i])
        if not os.path.exists(d):
            return None  # made below, as a mount point the user can traverse
        st = os.stat(d)
        ok = (st.st_mode & stat.S_IXOTH or (st.st_uid == uid and st.st_mode & stat.S_IXUSR)
              or (st.st_gid in gids and st.st_mode & stat.S_IXGRP))
        if not ok:
            return d
    return None


def load_seccomp(profile: dict[str, Any]) -> None:
    """Load the profile (``pod.seccomp_profile.runtime_default``) for this process and all it
    execs; libseccomp skips names it does not know, as runc does."""
    import seccomp

    ops = {"eq": seccomp.EQ, "lt": seccomp.LT, "gt": seccomp.GT,
           "masked_eq": seccomp.MASKED_EQ}
    actions = {"allow": seccomp.ALLOW, "enosys": seccomp.ERRNO(errno.ENOSYS)}
    f = seccomp.SyscallFilter(defaction=seccomp.ERRNO(errno.EPERM))
    for arch in profile["arches"]:
        a = {"x86_64": seccomp.Arch.X86_64, "x86": seccomp.Arch.X86,
             "x32": seccomp.Arch.X32}[arch]
        if a != seccomp.Arch.NATIVE and not f.exist_arch(a):
            f.add_arch(a)
    highest = 0
    for rule in profile["rules"]:
        for name in rule["names"]:
            try:
                nr = seccomp.resolve_syscall(seccomp.Arch.X86_64, name)
            except (ValueError, RuntimeError):
                continue
            if nr < 0:
                continue
            highest = max(highest, nr)
            args = [seccomp.Arg(i, ops[op], v, v2) if op == "masked_eq"
                    else seccomp.Arg(i, ops[op], v) for i, op, v, v2 in rule["args"]]
            f.add_rule(actions[rule["action"]], name, *args)
    # runc: syscalls newer than every one the profile knows answer ENOSYS, not the default.
    for nr in range(highest + 1, 512):
        try:
            f.add_rule(seccomp.ERRNO(errno.ENOSYS), nr)
        except (ValueError, RuntimeError, OSError):
            continue
    f.set_attr(seccomp.Attr.CTL_NNP, 0)
    f.load()


def main() -> None:
    with open(sys.argv[1]) as f:
        spec = json.load(f)
    for procs in spec.get("cgroup_procs", []):
        with open(procs, "w") as f:
            f.write(str(os.getpid()))
    stage = spec["stage_dir"]
    os.makedirs(stage, exist_ok=True)
    user = spec["user"]
    gids = {user["gid"], *user["groups"]}

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

    # 3. fake GPU sysfs merged over the real directories (the machine's own entries stay: gloo
    # follows /sys/class/net/<if>/device into /sys/devices/pci0000:00); the host's CPU view.
    for target, fake in spec.get("sys_merge", {}).items():
        merge(target, fake, stage)
    for target, fake in spec.get("host_views", {}).items():
        bind(fake, target, read_only=True)

    # 4. the image's files, set aside before the layer and the volumes cover anything
    image = [(path, os.path.join(stage, "image", str(i)))
             for i, path in enumerate(spec.get("image_paths", []))]
    image += [(target, os.path.join(stage, "image-files", str(i)))
              for i, (target, _) in enumerate(spec.get("image_files", {}).items())]
    sources = [*spec.get("image_paths", []), *spec.get("image_files", {}).values()]
    locked = {a for path, _ in image if (a := locked_ancestor(path, user["uid"], gids))}
    for (_, saved), source in zip(image, sources, strict=True):
        bind(source, saved)

    # 5. a fresh writable layer
    for target, layer in spec.get("layer", {}).items():
        bind(layer, target)

    # 6. the pod's volumes
    for m in spec["mounts"]:
        bind(m["source"], m["target"], m.get("readOnly", False))

    # 7. the image's files back on top, reachable by the container user. A path the machine
    # lacks (/opt/sglang-hicache) gets a 0755 tmpfs on its deepest existing ancestor below /,
    # so nothing is created on the machine's own filesystem. Inside the writable layer or a
    # volume (a checkout under /tmp) the mount points are made in it, as a runtime does: a
    # tmpfs there would cover the layer's 1777 /tmp with a 0755 one the user cannot write.
    covered = [*spec.get("layer", {}), *(m["target"] for m in spec["mounts"])]
    for target, _ in image:
        base = os.path.dirname(target)
        while not os.path.exists(base):
            base = os.path.dirname(base)
        inside = any(base == c or base.startswith(c.rstrip("/") + "/") for c in covered)
        if base != "/" and not os.path.exists(target) and base not in locked and not inside:
            locked.add(base)
    for d in sorted(locked, key=len):
        if not any(d.startswith(o + "/") for o in locked if o != d):
            os.makedirs(d, exist_ok=True)  # covered by the layer or a volume: a mount point
            sh("mount", "-t", "tmpfs", "-o", "mode=755,size=1m", "tmpfs", d)
    for target, saved in image:
        bind(saved, target)

    # 8. seccomp, then exec as the container user
    os.chdir(spec["cwd"])
    caps = ",".join(f"+{c}" for c in spec["capabilities"])
    argv = ["setpriv", f"--reuid={user['uid']}", f"--regid={user['gid']}"]
    groups = ",".join(map(str, user["groups"]))
    argv += [f"--groups={groups}"] if groups else ["--clear-groups"]
    argv += [f"--bounding-set=-all{',' + caps if caps else ''}", "--inh-caps=-all"]
    if spec.get("no_new_privs"):
        argv.append("--no-new-privs")
    argv += ["--", *spec["argv"]]
    if spec.get("seccomp"):
        load_seccomp(spec["seccomp"])
    os.execvpe("setpriv", argv, spec["env"])


if __name__ == "__main__":
    main()
