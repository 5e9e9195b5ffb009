"""Stopping a process group a test started (its own session): SIGTERM, then SIGKILL."""

from __future__ import annotations

import os
import signal
import subprocess


def stop_group(proc: subprocess.Popen[bytes] | None, grace_s: float = 15) -> None:
    """SIGTERM ``proc``'s process group, SIGKILL it after ``grace_s``; a finished one is left."""
    if proc is None or proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
