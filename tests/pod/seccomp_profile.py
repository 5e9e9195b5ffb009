"""containerd's ``RuntimeDefault`` seccomp profile, as containerd generates it for a container.

The data is containerd's ``contrib/seccomp/seccomp_default.go`` (``DefaultProfile``) at commit
0c23e946a784 (2026-05, "Block AF_ALG in default socket policy"), amd64, kernel >= 4.8: one list
of syscalls always allowed, ``socket`` and ``personality`` allowed only for some argument values,
groups allowed only when the container's *configured* (bounding) capabilities hold a capability,
and without ``CAP_SYS_ADMIN`` ``clone`` only without namespace flags and ``clone3`` failing with
``ENOSYS`` (so glibc falls back to ``clone``). Everything else fails with ``EPERM``. Note what is
not there: ``io_uring_*`` (removed from the default profile), and ``mbind``,
``set_mempolicy``, ``get_mempolicy`` unless the container is configured with ``CAP_SYS_NICE``.

runc, which loads the profile, answers syscalls newer than every one the profile names with
``ENOSYS`` rather than the default action, so a libc probing a new syscall falls back: the
shim does the same, above the highest number its libseccomp resolves from these names.

:func:`runtime_default` returns the profile as JSON-able rules for ``tests/pod/shim.py``, which
loads it with libseccomp (Debian's ``python3-seccomp``) just before it execs the container's
command.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

ALWAYS = (
    "accept", "accept4", "access", "adjtimex", "alarm", "bind", "brk", "cachestat", "capget",
    "capset", "chdir", "chmod", "chown", "chown32", "clock_adjtime", "clock_adjtime64",
    "clock_getres", "clock_getres_time64", "clock_gettime", "clock_gettime64", "clock_nanosleep",
    "clock_nanosleep_time64", "close", "close_range", "connect", "copy_file_range", "creat",
    "dup", "dup2", "dup3", "epoll_create", "epoll_create1", "epoll_ctl", "epoll_ctl_old",
    "epoll_pwait", "epoll_pwait2", "epoll_wait", "epoll_wait_old", "eventfd", "eventfd2",
    "execve", "execveat", "exit", "exit_group", "faccessat", "faccessat2", "fadvise64",
    "fadvise64_64", "fallocate", "fanotify_mark", "fchdir", "fchmod", "fchmodat", "fchmodat2",
    "fchown", "fchown32", "fchownat", "fcntl", "fcntl64", "fdatasync", "fgetxattr", "flistxattr",
    "flock", "fork", "fremovexattr", "fsetxattr", "fstat", "fstat64", "fstatat64", "fstatfs",
    "fstatfs64", "fsync", "ftruncate", "ftruncate64", "futex", "futex_requeue", "futex_time64",
    "futex_wait", "futex_waitv", "futex_wake", "futimesat", "getcpu", "getcwd", "getdents",
    "getdents64", "getegid", "getegid32", "geteuid", "geteuid32", "getgid", "getgid32",
    "getgroups", "getgroups32", "getitimer", "getpeername", "getpgid", "getpgrp", "getpid",
    "getppid", "getpriority", "getrandom", "getresgid", "getresgid32", "getresuid", "getresuid32",
    "getrlimit", "get_robust_list", "getrusage", "getsid", "getsockname", "getsockopt",
    "get_thread_area", "gettid", "gettimeofday", "getuid", "getuid32", "getxattr", "getxattrat",
    "inotify_add_watch", "inotify_init", "inotify_init1", "inotify_rm_watch", "io_cancel",
    "ioctl", "io_destroy", "io_getevents", "io_pgetevents", "io_pgetevents_time64", "ioprio_get",
    "ioprio_set", "io_setup", "io_submit", "ipc", "kill", "landlock_add_rule",
    "landlock_create_ruleset", "landlock_restrict_self", "lchown", "lchown32", "lgetxattr",
    "link", "linkat", "listen", "listmount", "listxattr", "listxattrat", "llistxattr", "_llseek",
    "lremovexattr", "lseek", "lsetxattr", "lsm_get_self_attr", "lsm_list_modules",
    "lsm_set_self_attr", "lstat", "lstat64", "madvise", "membarrier", "memfd_create",
    "memfd_secret", "mincore", "mkdir", "mkdirat", "mknod", "mknodat", "mlock", "mlock2",
    "mlockall", "map_shadow_stack", "mmap", "mmap2", "mprotect", "mq_getsetattr", "mq_notify",
    "mq_open", "mq_timedreceive", "mq_timedreceive_time64", "mq_timedsend", "mq_timedsend_time64",
    "mq_unlink", "mremap", "mseal", "msgctl", "msgget", "msgrcv", "msgsnd", "msync", "munlock",
    "munlockall", "munmap", "name_to_handle_at", "nanosleep", "newfstatat", "_newselect", "open",
    "openat", "openat2", "pause", "pidfd_open", "pidfd_send_signal", "pipe", "pipe2",
    "pkey_alloc", "pkey_free", "pkey_mprotect", "poll", "ppoll", "ppoll_time64", "prctl",
    "pread64", "preadv", "preadv2", "prlimit64", "process_mrelease", "pselect6",
    "pselect6_time64", "pwrite64", "pwritev", "pwritev2", "read", "readahead", "readlink",
    "readlinkat", "readv", "recv", "recvfrom", "recvmmsg", "recvmmsg_time64", "recvmsg",
    "remap_file_pages", "removexattr", "removexattrat", "rename", "renameat", "renameat2",
    "restart_syscall", "rmdir", "rseq", "rt_sigaction", "rt_sigpending", "rt_sigprocmask",
    "rt_sigqueueinfo", "rt_sigreturn", "rt_sigsuspend", "rt_sigtimedwait",
    "rt_sigtimedwait_time64", "rt_tgsigqueueinfo", "sched_getaffinity", "sched_getattr",
    "sched_getparam", "sched_get_priority_max", "sched_get_priority_min", "sched_getscheduler",
    "sched_rr_get_interval", "sched_rr_get_interval_time64", "sched_setaffinity", "sched_setattr",
    "sched_setparam", "sched_setscheduler", "sched_yield", "seccomp", "select", "semctl",
    "semget", "semop", "semtimedop", "semtimedop_time64", "send", "sendfile", "sendfile64",
    "sendmmsg", "sendmsg", "sendto", "setfsgid", "setfsgid32", "setfsuid", "setfsuid32", "setgid",
    "setgid32", "setgroups", "setgroups32", "setitimer", "setpgid", "setpriority", "setregid",
    "setregid32", "setresgid", "setresgid32", "setresuid", "setresuid32", "setreuid",
    "setreuid32", "setrlimit", "set_robust_list", "setsid", "setsockopt", "set_thread_area",
    "set_tid_address", "setuid", "setuid32", "setxattr", "setxattrat", "shmat", "shmctl", "shmdt",
    "shmget", "shutdown", "sigaltstack", "signalfd", "signalfd4", "sigprocmask", "sigreturn",
    "socketcall", "socketpair", "splice", "stat", "stat64", "statfs", "statfs64", "statmount",
    "statx", "symlink", "symlinkat", "sync", "sync_file_range", "syncfs", "sysinfo", "tee",
    "tgkill", "time", "timer_create", "timer_delete", "timer_getoverrun", "timer_gettime",
    "timer_gettime64", "timer_settime", "timer_settime64", "timerfd_create", "timerfd_gettime",
    "timerfd_gettime64", "timerfd_settime", "timerfd_settime64", "times", "tkill", "truncate",
    "truncate64", "ugetrlimit", "umask", "uname", "unlink", "unlinkat", "uretprobe", "utime",
    "utimensat", "utimensat_time64", "utimes", "vfork", "vmsplice", "wait4", "waitid", "waitpid",
    "write", "writev",
)
AMD64 = ("arch_prctl", "modify_ldt")
KERNEL_4_8 = ("process_vm_readv", "process_vm_writev", "ptrace")

BY_CAPABILITY: dict[str, tuple[str, ...]] = {
    "DAC_READ_SEARCH": ("open_by_handle_at",),
    "SYS_ADMIN": ("bpf", "clone", "clone3", "fanotify_init", "fsconfig", "fsmount", "fsopen",
                  "fspick", "lookup_dcookie", "mount", "mount_setattr", "move_mount",
                  "open_tree", "perf_event_open", "quotactl", "quotactl_fd", "setdomainname",
                  "sethostname", "setns", "syslog", "umount", "umount2", "unshare"),
    "SYS_BOOT": ("reboot",),
    "SYS_CHROOT": ("chroot",),
    "SYS_MODULE": ("delete_module", "init_module", "finit_module"),
    "SYS_PACCT": ("acct",),
    "SYS_PTRACE": ("kcmp", "pidfd_getfd", "process_madvise", "process_vm_readv",
                   "process_vm_writev", "ptrace"),
    "SYS_RAWIO": ("iopl", "ioperm"),
    "SYS_TIME": ("settimeofday", "stime", "clock_settime", "clock_settime64"),
    "SYS_TTY_CONFIG": ("vhangup",),
    "SYS_NICE": ("get_mempolicy", "mbind", "set_mempolicy", "set_mempolicy_home_node"),
    "SYSLOG": ("syslog",),
    "BPF": ("bpf",),
    "PERFMON": ("perf_event_open",),
}

AF_ALG, AF_VSOCK = 38, 40
PERSONALITIES = (0x0, 0x0008, 0x20000, 0x20008, 0xFFFFFFFF)
# CLONE_NEWNS | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWUSER | CLONE_NEWPID | CLONE_NEWNET |
# CLONE_NEWCGROUP
CLONE_NAMESPACE_FLAGS = 0x00020000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 \
    | 0x40000000 | 0x02000000
ARCHES = ("x86_64", "x86", "x32")


def _normalise(cap: str) -> str:
    cap = cap.strip().upper()
    return cap[4:] if cap.startswith("CAP_") else cap


def runtime_default(capabilities: Iterable[str]) -> dict[str, Any]:
    """The profile containerd generates for a container whose bounding set is ``capabilities``
    (``securityContext.capabilities.add`` after ``drop: [ALL]``).

    Rules are ``{"names": [...], "action": "allow" | "enosys", "args": [[index, op, value,
    value2], ...]}``; ``op`` is one of ``eq``, ``lt``, ``gt``, ``masked_eq``. Rules with
    several ``args`` AND them; separate rules OR.
    """
    caps = {_normalise(c) for c in capabilities}
    rules: list[dict[str, Any]] = [{"names": [*ALWAYS, *AMD64, *KERNEL_4_8], "action": "allow",
                                    "args": []}]
    rules += [{"names": ["socket"], "action": "allow", "args": [arg]} for arg in (
        [0, "lt", AF_ALG, 0], [0, "eq", AF_ALG + 1, 0], [0, "gt", AF_VSOCK, 0])]
    rules += [{"names": ["personality"], "action": "allow", "args": [[0, "eq", p, 0]]}
              for p in PERSONALITIES]
    for cap, names in BY_CAPABILITY.items():
        if cap in caps:
            rules.append({"names": list(names), "action": "allow", "args": []})
    if "SYS_ADMIN" not in caps:
        rules.append({"names": ["clone"], "action": "allow",
                      "args": [[0, "masked_eq", CLONE_NAMESPACE_FLAGS, 0]]})
        rules.append({"names": ["clone3"], "action": "enosys", "args": []})
    return {"default": "eperm", "arches": list(ARCHES), "rules": rules}
