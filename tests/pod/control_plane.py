"""The pod tier's control plane, run with the project venv (kopf, kmock, the operator are not in
the engine environment): the API emulator listening on the pod network's bridge address, the
chart's CRDs, the namespace, and the real operator (kopf) watching it.

``python tests/pod/control_plane.py HOST NAMESPACE KUBECONFIG [CONFIG_JSON]``: writes the
kubeconfig, runs the operator with the operator configuration CONFIG_JSON (the admin's chart
values, ``harness.admin_config``) and a 2 s resync, prints ``READY <api url>`` once the operator
watches, and runs until its standard input closes.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))


def main(host: str, namespace: str, kubeconfig: Path, config_json: str = "{}") -> None:
    import json

    from emulator import EmulatorThread
    from kopf.testing import KopfRunner

    crds = [doc for path in sorted((ROOT / "charts/sglang-hicache-operator/crds").glob("*.yaml"))
            for doc in yaml.safe_load_all(path.read_text()) if doc]
    with EmulatorThread(crds=crds, bookmark_interval=0.5, host=host) as emu:
        emu.create("v1", "namespaces", {"metadata": {"name": namespace}})
        emu.write_kubeconfig(kubeconfig, namespace)
        os.environ["KUBECONFIG"] = str(kubeconfig)
        # The admin's configuration with a 2 s resync (status.router, status.cache).
        config = kubeconfig.with_name("operator.yaml")
        config.write_text(yaml.safe_dump({**json.loads(config_json), "resyncSeconds": 2}))
        os.environ["SGLANG_HICACHE_OPERATOR_CONFIG"] = str(config)
        with KopfRunner(["run", "--standalone", "-n", namespace, "-m",
                         "hicache_operator.controller.handlers"], timeout=60):
            emu.wait_for(lambda: any(r.watch and r.plural == "sglanghicaches"
                                     for r in emu.requests()), what="the operator's watch")
            # KopfRunner captures sys.stdout (click's test runner): write to the real one.
            os.write(1, f"READY {emu.url}\n".encode())
            os.read(0, 1)  # until the test closes our standard input


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], Path(sys.argv[3]), *sys.argv[4:5])
