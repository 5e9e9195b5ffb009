"""The launcher's one error type: a message a human can act on plus a machine-readable reason."""

from __future__ import annotations

# Reasons match the condition reasons the operator reports (status.conditions[].reason), so a
# failed launch can be explained in the CR without parsing the message.
REASONS = (
    "InvalidConfig",
    "GpuDiscoveryFailed",
    "GpuAccessDenied",
    "HugepagesUnavailable",
    "SsdUnavailable",
    "StandaloneServerUnavailable",
)


class LaunchError(RuntimeError):
    """A check failed; ``str(err)`` names the variable, the value, and the numbers involved."""

    def __init__(self, reason: str, message: str) -> None:
        if reason not in REASONS:
            raise ValueError(f"unknown launch error reason {reason!r}; allowed: {REASONS}")
        self.reason = reason
        super().__init__(message)
