"""What an update strategy means for this CR's pods: the planner's warnings and the summary's
rollout line. (The rollout itself is run by the controller: ``controller/rollout.py``.)"""

from __future__ import annotations

from ..api.k8s import IN_PLACE
from ..api.spec import SGLangHiCacheSpec


def rollout_warnings(spec: SGLangHiCacheSpec) -> list[str]:
    out: list[str] = []
    standalone = spec.l3.mode == "standalone"
    if spec.l3.image and not standalone:
        out.append("l3.image is the image of the standalone UMBP sidecars; l3.mode embedded "
                   "runs none, so it is not used")
    if spec.update_strategy.type == IN_PLACE and standalone and not spec.l3.image:
        out.append(
            "updateStrategy InPlaceIfPossible: the UMBP sidecars run the engine image "
            "(l3.image is empty), so a new spec.image changes them too and replaces the pods, "
            "losing their L3; set l3.image to the image the sidecars run to roll out new "
            "engine images in place"
        )
    return out


def rollout_summary(spec: SGLangHiCacheSpec) -> str:
    """One line: what a change of the pod template does to running pods."""
    strategy = spec.update_strategy.type
    if strategy == "OnDelete":
        return ("updateStrategy OnDelete: pods keep their template until you delete them "
                "(each new pod loads the model and refills its pools; its L3 starts cold)")
    if strategy != IN_PLACE:
        return ("updateStrategy RollingUpdate: any template change replaces the pods one by "
                "one (each new pod loads the model and refills its pools; its L3 starts cold); "
                "InPlaceIfPossible restarts only the engine for engine-only changes")
    if spec.l3.mode == "standalone":
        return ("updateStrategy InPlaceIfPossible: an engine-only change (image, engine args "
                "or env, the launcher's configuration) restarts the engine container in place: "
                "same pod, node, hugepages and UMBP sidecars, so the L3 stays warm; other "
                "changes replace the pods")
    return ("updateStrategy InPlaceIfPossible: an engine-only change restarts the engine "
            "container in place (same pod, node and hugepages), but in embedded mode the L3 "
            "lives in the engine process and starts cold after each restart; use l3.mode "
            "standalone for rollouts that keep the cache")
