"""The pod tier's kubelet derivations (pure, unit tier): ``$(VAR)`` in a container's command and
args expands from the environment its spec defines, as the kubelet does. The router Deployment
passes ``--mesh-advertise-host $(POD_IP)`` (downward API) when it runs two routers; a runtime
that passed the reference through unexpanded failed smg at start, where a node runs it."""

from __future__ import annotations

from .podspec import PodMeta, command_line, container_env


def test_command_and_args_expand_from_the_spec_environment() -> None:
    container = {
        "name": "router", "command": ["smg"],
        "args": ["--mesh-advertise-host", "$(POD_IP)", "--name=$(POD_NAME)-x", "$$(POD_IP)",
                 "$(UNDEFINED)", "$(FROM_MAP)"],
        "env": [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
        "envFrom": [{"configMapRef": {"name": "cm"}}],
    }
    meta = PodMeta(name="r-0", namespace="ns", pod_ip="198.18.0.7")
    env = container_env(container, {"cm": {"FROM_MAP": "v"}}, meta)
    assert command_line(container, env) == [
        "smg", "--mesh-advertise-host", "198.18.0.7", "--name=r-0-x", "$(POD_IP)",
        "$(UNDEFINED)", "v"]

