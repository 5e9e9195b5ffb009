"""Engine configuration revisions (updateStrategy InPlaceIfPossible): the names both sides use.

The operator's ConfigMap holds one key per revision, ``HICACHE_CONFIG_<revision>`` (a JSON
object of the engine's environment, loaded with ``envFrom``); the pod's annotation
``hicache.sglang.ai/config-hash`` names the revision the pod runs, and the engine container reads
it as ``HICACHE_CONFIG_REVISION`` (a ``fieldRef``). The launcher selects and watches the revision
(``hicache_umbp.launch.revision``); the pod's annotations reach the container through a downward
API volume at ``paths.POD_INFO_DIR``.
"""

from __future__ import annotations

from typing import Final

#: The pod annotation naming the configuration revision the pod runs.
CONFIG_ANNOTATION: Final = "hicache.sglang.ai/config-hash"
#: The engine container's variable holding that annotation (resolved at container start).
CONFIG_REVISION_ENV: Final = "HICACHE_CONFIG_REVISION"
#: ``kubectl rollout restart`` writes it into the pod template; the operator carries it to each
#: pod in place, and a new value restarts the engine like a new configuration revision does.
RESTARTED_AT_ANNOTATION: Final = "kubectl.kubernetes.io/restartedAt"
#: ConfigMap keys (so variables under ``envFrom``) holding one revision's environment each.
CONFIG_KEY_PREFIX: Final = "HICACHE_CONFIG_"


def config_key(revision: str) -> str:
    """The ConfigMap key (and variable) of one revision's environment."""
    return f"{CONFIG_KEY_PREFIX}{revision}"


def is_revision_variable(name: str) -> bool:
    """A variable of the revision scheme (the launcher removes them from the engine's env)."""
    return name == CONFIG_REVISION_ENV or name.startswith(CONFIG_KEY_PREFIX)
