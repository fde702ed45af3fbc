"""``capture_evidence`` on Kubernetes (issue 31 item 3, node side): kmock API server + the
real ``kubernetes_asyncio`` client, as the reset tests do. kmock has no kubelet; the
reset tests' kubelet (``tests/activities/test_reset_gpu_kube.py``) runs the Job's
container command for real — ``autorepair-agent capture`` with a fake
``nvidia-smi``/``journalctl`` on ``PATH`` — stores its output as the pod's log and marks
the Job done. Checked: the Job (its own name, pinned to the node, privileged with
``hostPID``, the repair taint tolerated), the archive on disk equal to what the activity
returns, the Job removed and the repair's cordon as it was, no API call the chart's jobs
Role does not grant."""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path
from typing import Any

from temporalio.testing import ActivityEnvironment

from activities.evidence import EvidenceActivities
from tests.activities.test_reset_gpu_kube import (  # noqa: F401  (kenv: fixture)
    JOBS,
    NS,
    TAINT,
    _api_calls,
    _chart_grants,
    _cordoned,
    kenv,
)
from workflows.config import AutorepairConfig, ClusterConfig, NodeConfig, ResetGpuConfig
from workflows.evidence import EvidenceCaptureInput
from workflows.models import Action

ROOT = Path(__file__).resolve().parents[2]


def _tools(tmp: Path) -> Path:
    bin_dir = tmp / "bin"
    bin_dir.mkdir()
    for name, body in (("nvidia-smi", 'echo "==NVSMI LOG== Remapped Rows Pending: Yes"'),
                       ("journalctl", 'echo "NVRM: Xid (PCI:0000:18:00): 79, GPU has fallen '
                                      'off the bus."')):
        p = bin_dir / name
        p.write_text(f"#!/bin/sh\n{body}\n")
        p.chmod(0o755)
    return bin_dir


def _acts(kube: Any, tmp: Path) -> EvidenceActivities:
    agent = Path(sys.executable).parent / "autorepair-agent"
    run = str(agent) if agent.exists() else f"{sys.executable} -m agent.cli"
    script = (f"PATH={_tools(tmp)}:/usr/bin:/bin exec {run} capture --dir {{dir}} "
              f"--repair {{repair}} --tool-timeout {{tool_timeout}} --json --backend simulated")
    reset = ResetGpuConfig(capture_command=["/bin/sh", "-c", script],
                           env={"PYTHONPATH": str(ROOT)}, namespace=NS,
                           image="registry.example/autorepair-agent:1.0")
    cfg = AutorepairConfig(clusters=[ClusterConfig(
        name="krst", scheduler="kubernetes", nodes=[NodeConfig(name="gpu-01")],
        reset_gpu=reset)])
    return EvidenceActivities(cfg, kube_api_client=kube.api_client)


def _archive(path: str) -> tuple[int, str]:
    data = Path(path).read_bytes()
    return len(data), hashlib.sha256(data).hexdigest()


async def test_capture_job_on_the_cordoned_node(kenv: Any) -> None:  # noqa: F811
    kube, created, tmp = kenv
    _cordoned(kube)
    inp = EvidenceCaptureInput(cluster="krst", node="gpu-01", repair_id="r-1",
                               action=Action.reprovision, timeout_s=60.0,
                               dir=str(tmp / "evidence"))
    cap = await ActivityEnvironment().run(_acts(kube, tmp).capture_evidence, inp)
    # no BMC configured for the node: that part is a note; the node part is complete
    assert cap.notes == ["BMC: no BMC configured for machine gpu-01"], cap.notes
    assert cap.node is not None and cap.node.tool == "fallback"
    assert Path(cap.node.path).parent == tmp / "evidence"
    assert _archive(cap.node.path) == (cap.node.size_bytes, cap.node.sha256)

    (job,) = created
    assert job["metadata"]["name"].startswith("autorepair-evidence-")
    spec = job["spec"]["template"]["spec"]
    assert spec["nodeName"] == "gpu-01" and spec["hostPID"] is True
    assert spec["tolerations"] == [{"key": "autorepair.io/repair", "operator": "Exists",
                                    "effect": "NoSchedule"}]
    (c,) = spec["containers"]
    assert c["name"] == "capture" and c["securityContext"] == {"privileged": True}
    assert "capture --dir " + str(tmp / "evidence") + " --repair r-1" in c["command"][2]
    assert "--tool-timeout 36 " in c["command"][2]        # (60 - 15 s margin) x 0.8
    # the archive lands on the node's disk, not in the pod's
    assert spec["volumes"] == [{"name": "evidence", "hostPath": {
        "path": str(tmp / "evidence"), "type": "DirectoryOrCreate"}}]
    assert c["volumeMounts"] == [{"name": "evidence", "mountPath": str(tmp / "evidence")}]
    # the Job is gone; the repair's cordon and taint are as they were
    assert not any(r == JOBS and not o.deleted for (r, _n, _x), o in kube.server.objects.items())
    node = kube.node("gpu-01")
    assert node["spec"]["unschedulable"] is True and TAINT in node["spec"]["taints"]
    used = _api_calls(kube)
    assert used <= _chart_grants(), used - _chart_grants()
