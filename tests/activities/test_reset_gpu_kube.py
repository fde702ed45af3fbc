"""``reset_gpu`` on Kubernetes (kmock API server + the real ``kubernetes_asyncio`` client).

kmock has no kubelet; the test plays it: when the reset Job appears it runs the Job's
container command for real (``/bin/sh -c`` with ``autorepair-agent reset-gpu --json`` on
the simulated NVML backend), stores the output as the pod's log and marks the Job done.
Checked: the Job spec (pinned by ``nodeName``, tolerating the repair taint, privileged,
``hostPID``, no service account token, no GPU claimed), the parsed result, the Job
removed and the repair's cordon left as it was, and the API calls (only those the
chart's jobs Role grants).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import kmock
import pytest
from temporalio.testing import ActivityEnvironment

from activities.reset import ResetActivities
from workflows.activity_api import MachineActionInput
from workflows.config import AutorepairConfig, ClusterConfig, NodeConfig, ResetGpuConfig

ROOT = Path(__file__).resolve().parents[2]
NS = "autorepair"
JOBS = kmock.resource("batch", "v1", "jobs")
PODS = kmock.resource("", "v1", "pods")
TAINT = {"key": "autorepair.io/repair", "value": "r-1", "effect": "NoSchedule"}


async def _kubelet(kube: Any, stop: asyncio.Event, created: list[dict[str, Any]]) -> None:
    """Run each Job's container command on 'its node' and report like a kubelet."""
    server = kube.server
    seen: set[str] = set()
    while not stop.is_set():
        for (res, ns, name), obj in list(server.objects.items()):
            if res != JOBS or obj.deleted or name in seen:
                continue
            seen.add(name)
            job = dict(obj.raw)
            created.append(job)
            tpl = job["spec"]["template"]
            c = tpl["spec"]["containers"][0]
            env = dict(os.environ, **{e["name"]: e["value"] for e in c["env"] if "value" in e})
            proc = await asyncio.to_thread(subprocess.run, c["command"], capture_output=True,
                                           text=True, env=env, timeout=60, check=False)
            pod = f"{name}-x1"
            server.objects[PODS, ns, pod] = {
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": pod, "namespace": ns, "labels": tpl["metadata"]["labels"],
                             "resourceVersion": "1"},
                "spec": {"nodeName": tpl["spec"]["nodeName"], "containers": [c]},
                "status": {"phase": "Succeeded"},
            }
            server[f"get /api/v1/namespaces/{ns}/pods/{pod}/log"] << proc.stdout.encode()
            obj.patch({"status": {"succeeded": 1, "conditions": [
                {"type": "Complete", "status": "True", "reason": "Completed"}]}})
        await asyncio.sleep(0.1)


@pytest.fixture
async def kenv(kube_api: Any, tmp_path: Path) -> AsyncIterator[tuple[Any, list[Any], Path]]:
    kube_api.server.resources[JOBS] = kmock.ResourceInfo(kind="Job", namespaced=True)
    stop = asyncio.Event()
    created: list[dict[str, Any]] = []
    task = asyncio.create_task(_kubelet(kube_api, stop, created))
    try:
        yield kube_api, created, tmp_path
    finally:
        stop.set()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def _acts(kube: Any, tmp: Path) -> ResetActivities:
    agent = Path(sys.executable).parent / "autorepair-agent"
    run = str(agent) if agent.exists() else f"{sys.executable} -m agent.cli"
    cmd = ["/bin/sh", "-c", f"exec {run} reset-gpu --pci {{pci}} --json --backend simulated "
           f"--sim-faults {tmp}/faults.json --wait-timeout 5"]
    reset = ResetGpuConfig(command=cmd, env={"PYTHONPATH": str(ROOT)}, namespace=NS,
                           image="registry.example/autorepair-agent:1.0", timeout_s=60.0)
    cfg = AutorepairConfig(clusters=[ClusterConfig(
        name="krst", scheduler="kubernetes", nodes=[NodeConfig(name="gpu-01")],
        reset_gpu=reset)])
    return ResetActivities(cfg, kube_api_client=kube.api_client)


#: kmock request action → Kubernetes RBAC verb.
_VERB = {"CREATE": "create", "DELETE": "delete", "FETCH": "get", "LIST": "list",
         "UPDATE": "patch", "WATCH": "watch"}


def _api_calls(kube: Any) -> set[tuple[str, str]]:
    """(verb, resource[/subresource]) of every request the API server answered."""
    out = set()
    for r in kube.server._requests:
        if r.resource is None:
            continue
        sub = f"/{r.subresource}" if r.subresource else ""
        out.add((_VERB[r.action.name], f"{r.resource.plural}{sub}"))
    return out


def _chart_grants() -> set[tuple[str, str]]:
    """(verb, resource) pairs the chart's Roles/ClusterRoles grant (templates/rbac.yaml)."""
    text = (ROOT / "deploy/helm/autorepair/templates/rbac.yaml").read_text()
    grants: set[tuple[str, str]] = set()
    resources: list[str] = []
    for line in text.splitlines():
        s = line.strip()
        if s.startswith("resources:"):
            resources = json.loads(s.split(":", 1)[1])
        elif s.startswith("verbs:") and resources:
            grants |= {(v, r) for v in json.loads(s.split(":", 1)[1]) for r in resources}
            resources = []
    return grants


def _inp(gpus: list[str]) -> MachineActionInput:
    return MachineActionInput(cluster="krst", node="gpu-01", machine="gpu-01", repair_id="r-1",
                              gpu=gpus[0], gpus=gpus)


def _cordoned(kube: Any) -> None:
    kube.add_node("gpu-01", unschedulable=True, taints=[TAINT],
                  annotations={"autorepair.io/repair-id": "r-1",
                               "autorepair.io/cordoned-by": "autorepair"})


async def test_reset_job_spec_and_result(kenv: Any) -> None:
    kube, created, tmp = kenv
    _cordoned(kube)
    (tmp / "faults.json").write_text(json.dumps({"recovery_action": 1}))
    res = await ActivityEnvironment().run(_acts(kube, tmp).reset_gpu,
                                          _inp(["00000000:18:00.0"]))
    assert res.done, res
    assert "GPU 0000:18:00: done (exit 0): GPU reset and back; read-back clean" in res.detail

    (job,) = created
    assert job["metadata"]["name"].startswith("autorepair-reset-")
    assert job["metadata"]["namespace"] == NS
    assert job["spec"]["backoffLimit"] == 0 and job["spec"]["activeDeadlineSeconds"] == 60
    spec = job["spec"]["template"]["spec"]
    # pinned to the drained node, tolerating the repair's taint
    assert spec["nodeName"] == "gpu-01" and spec["restartPolicy"] == "Never"
    assert spec["tolerations"] == [{"key": "autorepair.io/repair", "operator": "Exists",
                                    "effect": "NoSchedule"}]
    # what the NVIDIA reset needs: root with the device nodes, the node's processes
    assert spec["hostPID"] is True and spec["runtimeClassName"] == "nvidia"
    (c,) = spec["containers"]
    assert c["name"] == "reset" and c["securityContext"] == {"privileged": True}
    assert c["image"] == "registry.example/autorepair-agent:1.0"
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert env["NVIDIA_DRIVER_CAPABILITIES"] == "utility"
    # nothing beyond that: no GPU claimed, no API token, no host network or volumes
    assert "resources" not in c
    assert spec["automountServiceAccountToken"] is False and "serviceAccountName" not in spec
    assert not {"hostNetwork", "hostIPC", "volumes"} & set(spec)
    assert c["command"][:2] == ["/bin/sh", "-c"] and "--pci 0000:18:00" in c["command"][2]

    # the Job is gone; the repair's cordon and taint are as they were
    assert not any(r == JOBS and not o.deleted for (r, _n, _x), o in kube.server.objects.items())
    node = kube.node("gpu-01")
    assert node["spec"]["unschedulable"] is True and TAINT in node["spec"]["taints"]
    assert node["metadata"]["annotations"]["autorepair.io/repair-id"] == "r-1"

    # the API calls made are exactly these, and the chart grants each (no extra RBAC)
    used = _api_calls(kube)
    assert used == {("create", "jobs"), ("get", "jobs"), ("delete", "jobs"), ("get", "nodes"),
                    ("list", "pods"), ("get", "pods/log")}
    granted = _chart_grants()
    assert used <= granted, used - granted


async def test_two_gpus_one_cannot_run(kenv: Any) -> None:
    kube, created, tmp = kenv
    _cordoned(kube)
    # GPU 1 (0000:28:00) is held by a process → exit 2 for it, and for GPU 0 too: on an
    # NVLink board every peer must be idle for a single-GPU reset (the agent's nvlink check)
    (tmp / "faults.json").write_text(json.dumps({"recovery_action": 1,
                                                 "gpu_processes": {"1": [4242]}}))
    res = await ActivityEnvironment().run(_acts(kube, tmp).reset_gpu,
                                          _inp(["0000:18:00", "0000:28:00"]))
    assert not res.done
    assert "GPU 0000:18:00: cannot_run (exit 2): nvlink:" in res.not_run
    assert "GPU 0000:28:00: cannot_run (exit 2): processes:" in res.not_run
    assert "pid 4242" in res.not_run
    assert len(created) == 1  # one Job runs the command for both GPUs in turn

