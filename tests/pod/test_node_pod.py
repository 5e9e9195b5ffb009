"""The tier refuses what a real MI355X node refuses (tests of the imitation itself).

Each test runs one small container (the engine image's Python, no SGLang) on the tier's node and
checks it meets a node's limits: the host's CPUs but only its cpuset, containerd's
RuntimeDefault seccomp profile, capabilities as Kubernetes grants a non-root user, GPU device
files only for the pod's groups, a fresh writable layer per start, and the image's files
wherever the checkout lives. Real: the kernel's cpuset, seccomp filter, credentials, file
permissions and mount namespaces. Faked: the host's CPU count and the GPU device files (see
tests/pod/node.py).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .harness import run_container
from .image import Image
from .node import NODE_RENDER_GID

pytestmark = pytest.mark.pod

RESTRICTED = {"capabilities": {"drop": ["ALL"]}, "allowPrivilegeEscalation": False,
              "seccompProfile": {"type": "RuntimeDefault"}}
POD = {"runAsNonRoot": True, "runAsUser": 10001, "fsGroup": 10001}


def python(name: str, code: str, *, cpu: int = 2, caps: tuple[str, ...] = (),
           **extra: object) -> dict[str, Any]:
    sc = {**RESTRICTED, "capabilities": {"drop": ["ALL"], "add": list(caps)}}
    return {"name": name, "command": ["python", "-c", code], "securityContext": sc,
            "resources": {"limits": {"cpu": str(cpu), "memory": "1Gi"},
                          "requests": {"cpu": str(cpu), "memory": "1Gi"}}, **extra}


def report(log: str) -> dict[str, Any]:
    line = [x for x in log.splitlines() if x.startswith("{")][-1]
    return dict(json.loads(line))


def test_the_container_reads_the_hosts_cpus_but_runs_in_its_cpuset(node, image, workdir):
    """What SGLang's set_gpu_proc_affinity reads (psutil: 128 physical cores, 256 logical)
    and what the kernel enforces (the cpuset): pinning outside it is EINVAL, as under the
    static CPU manager."""
    code = """
import json, os, psutil
out = {"cpu_count": os.cpu_count(), "logical": psutil.cpu_count(),
       "physical": psutil.cpu_count(logical=False), "affinity": sorted(os.sched_getaffinity(0))}
try:
    os.sched_setaffinity(0, set(range(64, 128)))
    out["outside"] = "ok"
except OSError as e:
    out["outside"] = e.errno
os.sched_setaffinity(0, {0})
out["inside"] = sorted(os.sched_getaffinity(0))
print(json.dumps(out))
"""
    rc, log = run_container(node, image, workdir, python("cpus", code), pod_security=POD)
    assert rc == 0, log
    r = report(log)
    assert (r["cpu_count"], r["logical"], r["physical"]) == (256, 256, 128), r
    assert r["affinity"] == node.cpus.real_cpuset(2)
    assert r["outside"] == 22  # EINVAL
    assert r["inside"] == [0]


def test_runtime_default_seccomp_gates_numa_syscalls_on_sys_nice(node, image, workdir):
    """containerd's profile: get_mempolicy/mbind/set_mempolicy only for a container configured
    with CAP_SYS_NICE (even though a non-root process never holds it), io_uring never, clone3
    ENOSYS (glibc falls back to clone)."""
    code = """
import ctypes, json, os
libc = ctypes.CDLL(None, use_errno=True)
def call(nr, *args):
    r = libc.syscall(nr, *args)
    return 0 if r >= 0 else ctypes.get_errno()
mode = ctypes.c_int(0)
print(json.dumps({"get_mempolicy": call(239, ctypes.byref(mode), None, 0, None, 0),
                  "io_uring_setup": call(425, 1, ctypes.create_string_buffer(128)),
                  "clone3": call(435, None, 0)}))
"""
    results = {}
    for caps in ((), ("SYS_NICE",)):
        rc, log = run_container(node, image, workdir / "-".join(caps or ("none",)),
                                python("seccomp", code, caps=caps), pod_security=POD)
        assert rc == 0, log
        results[caps] = report(log)
    assert results[()]["get_mempolicy"] == 1  # EPERM
    assert results[("SYS_NICE",)]["get_mempolicy"] == 0
    for r in results.values():
        assert r["io_uring_setup"] == 1 and r["clone3"] == 38  # EPERM, ENOSYS


def test_a_non_root_user_gets_no_capability_it_was_granted(node, image, workdir):
    """Kubernetes (kubernetes/kubernetes#56374): added capabilities land in the bounding set of
    a non-root process, never in its effective, permitted or ambient sets."""
    code = """
import json
status = dict(l.split(":\\t", 1) for l in open("/proc/self/status").read().splitlines()
              if l.startswith("Cap"))
print(json.dumps({k: int(v, 16) for k, v in status.items()}))
"""
    rc, log = run_container(node, image, workdir, python("caps", code, caps=("IPC_LOCK",)),
                            pod_security=POD)
    assert rc == 0, log
    caps = report(log)
    ipc_lock = 1 << 14
    assert caps["CapBnd"] == ipc_lock
    assert caps["CapEff"] == caps["CapPrm"] == caps["CapAmb"] == caps["CapInh"] == 0


def test_gpu_device_files_open_only_for_the_nodes_render_group(node, image, workdir):
    """The device plugin passes the host's /dev/kfd and /dev/dri/renderD* (root:<render gid>
    0660); the image's own video/render gids do not match this host's."""
    code = """
import json, os
out = {}
for path in ("/dev/kfd", "/dev/dri/renderD128"):
    try:
        os.close(os.open(path, os.O_RDWR))
        out[path] = 0
    except OSError as e:
        out[path] = e.errno
print(json.dumps(out))
"""
    gpu = {"limits": {"amd.com/gpu": "1", "cpu": "1", "memory": "1Gi"}}
    denied = python("gpu", code, resources=gpu)
    rc, log = run_container(node, image, workdir / "denied", denied, pod_security=POD)
    assert rc == 0, log
    assert set(report(log).values()) == {13}  # EACCES
    rc, log = run_container(node, image, workdir / "granted", denied, pod_security={
        **POD, "supplementalGroups": [NODE_RENDER_GID]})
    assert rc == 0, log
    assert set(report(log).values()) == {0}


def test_a_restarted_container_gets_a_fresh_writable_layer(node, image, workdir):
    code = """
import json, os
home = os.environ["HOME"]
seen = {p: os.path.exists(p) for p in (home + "/.marker", "/tmp/marker")}
open(home + "/.marker", "w").close(); open("/tmp/marker", "w").close()
print(json.dumps(seen))
"""
    from .harness import Pod, PodMeta

    spec = {"securityContext": POD, "volumes": [], "initContainers": [],
            "containers": [python("layer", code)]}
    pod = Pod(PodMeta(name="layer", namespace="t"), spec, {}, node, image, workdir / "layer",
              backoff_initial_s=0.5)
    try:
        pod.start()
        c = pod.container("layer")
        pod.wait(lambda: c.restarts >= 1 and len(c.exit_codes) >= 2, 120, "restarted once")
    finally:
        pod.close()
    runs = [json.loads(x) for x in c.log_text(20000).splitlines() if x.startswith("{")]
    assert len(runs) >= 2 and not any(any(r.values()) for r in runs), runs


@pytest.fixture
def moved_image(image: Image) -> Iterator[Image]:
    """The image's bin directory moved under /tmp and under a mode-0700 directory (a clone
    under /tmp or /root): its ``python`` and ``umbp_standalone_server`` must still run."""
    homes = [Path(tempfile.mkdtemp(prefix="hicache-node-clone-", dir="/tmp")),
             Path(tempfile.mkdtemp(prefix="hicache-node-private-", dir="/var/tmp"))]
    os.chmod(homes[0], 0o755)  # a clone under /tmp: made with the usual umask
    os.chmod(homes[1], 0o700)  # a clone under a private home such as /root
    bins = []
    for home in homes:
        target = home / "clone" / "image-bin"
        shutil.copytree(image.bin_dir, target, symlinks=True)
        bins.append(str(target))
    env = {**image.env, "PATH": ":".join([*bins, image.env["PATH"]])}
    yield Image(bin_dir=Path(bins[0]), env=env, paths=(*image.paths, *bins),
                files=image.files)
    for home in homes:
        shutil.rmtree(home, ignore_errors=True)


def test_the_images_files_are_reachable_wherever_the_checkout_lives(node, moved_image,
                                                                      workdir):
    """A volume at /tmp (the sidecars have one) and a mode-0700 ancestor do not hide the image's
    files from its user, as in a real image."""
    paths = [p for p in moved_image.paths if "hicache-node-" in p]
    code = "import json, os; print(json.dumps({p: os.access(p + '/python', os.X_OK) for p in %r}))"
    container = python("moved", code % (paths,),
                       volumeMounts=[{"name": "tmp", "mountPath": "/tmp"}])
    container["command"] = [f"{paths[1]}/python", "-c", code % (paths,)]
    rc, log = run_container(node, moved_image, workdir, container, pod_security=POD,
                            volumes=[{"name": "tmp", "emptyDir": {}}])
    assert rc == 0, log
    assert all(report(log).values()), log


def test_a_checkout_under_tmp_leaves_the_containers_tmp_writable(node, moved_image, workdir):
    """The image's files under /tmp (a clone there) sit inside the fresh writable layer, whose
    /tmp stays 1777 as in a real image: the non-root user can write there."""
    under_tmp = next(p for p in moved_image.paths if p.startswith("/tmp/hicache-node-"))
    code = ("import json, os; open('/tmp/probe', 'w').close(); "
            f"print(json.dumps({{'python': os.access({under_tmp!r} + '/python', os.X_OK), "
            "'tmp_sticky_world_writable': os.stat('/tmp').st_mode & 0o1777 == 0o1777}))")
    container = python("tmpclone", code)
    container["command"] = [f"{under_tmp}/python", "-c", code]
    rc, log = run_container(node, moved_image, workdir, container, pod_security=POD)
    assert rc == 0, log
    assert all(report(log).values()), log
