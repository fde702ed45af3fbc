"""ValidationWorkflow on Kubernetes (kmock API server + the real ``kubernetes_asyncio``
client): the Job is pinned to the node and tolerates ``autorepair.io/repair:NoSchedule``.

kmock has no kubelet; the test plays it: when the validation Job appears it runs the
Job's container command for real (``autorepair-agent validate --json`` with the simulated
GPU backend), stores the output as the pod's log and marks the Job complete.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from temporalio import workflow
from temporalio.worker import Worker

with workflow.unsafe.imports_passed_through():
    import kmock

    from workflows.config import AutorepairConfig, ClusterConfig, NodeConfig, ValidationConfig
    from workflows.models import ValidationRequest, ValidationResult, Verdict
    from workflows.protocol import workflow_id_validation
    from workflows.validation import ValidationWorkflow

ROOT = Path(__file__).resolve().parents[2]
CLUSTER = "kvaltest"
NS = "autorepair"
JOBS = kmock.resource("batch", "v1", "jobs")
PODS = kmock.resource("", "v1", "pods")


def _config(tmp: Path) -> tuple[AutorepairConfig, Path]:
    faults = tmp / "faults"
    faults.mkdir()
    suite = tmp / "suite.yaml"
    suite.write_text(f"backend: simulated\nexpected_gpus: 8\nsim_faults_file: {faults}/{{node}}.json\n"
                     "checks: [gpu, dcgm, nccl, infiniband]\n")
    agent_cli = Path(sys.executable).parent / "autorepair-agent"
    cmd = ([str(agent_cli), "validate", "--json"] if agent_cli.exists()
           else [sys.executable, "-m", "agent.validation", "--json"])
    v = ValidationConfig(command=cmd, env={"AUTOREPAIR_VALIDATE_CONFIG": str(suite),
                                           "PYTHONPATH": str(ROOT)},
                         namespace=NS, timeout_s=60.0, poll_s=5.0, gpus=8)
    cfg = AutorepairConfig(clusters=[ClusterConfig(
        name=CLUSTER, scheduler="kubernetes", nodes=[NodeConfig(name="gpu-01", machine="gpu-01")],
        validation=v)])
    return cfg, faults


async def _kubelet(kube: Any, stop: asyncio.Event, created: list[dict[str, Any]]) -> None:
    """Run each validation Job's container on 'its node' and report like a kubelet."""
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
            node = tpl["spec"]["nodeName"]
            env = dict(os.environ, NODE_NAME=node,
                       **{e["name"]: e["value"] for e in c["env"] if "value" in e})
            proc = await asyncio.to_thread(subprocess.run, c["command"], capture_output=True,
                                           text=True, env=env, timeout=60, check=False)
            pod = f"{name}-x1"
            server.objects[PODS, ns, pod] = {
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": pod, "namespace": ns, "labels": tpl["metadata"]["labels"],
                             "resourceVersion": "1"},
                "spec": {"nodeName": node, "containers": [c]},
                "status": {"phase": "Succeeded" if proc.returncode == 0 else "Failed"},
            }
            server[f"get /api/v1/namespaces/{ns}/pods/{pod}/log"] << proc.stdout.encode()
            ok = proc.returncode == 0
            obj.patch({"status": {"succeeded": 1 if ok else 0, "failed": 0 if ok else 1,
                                  "conditions": [{"type": "Complete" if ok else "Failed",
                                                  "status": "True", "reason": "BackoffLimitExceeded"
                                                  if not ok else "Completed"}]}})
        await asyncio.sleep(0.1)


@pytest.fixture
async def kenv(temporal_env: Any, ledger_pool: Any, kube_api: Any,
               tmp_path: Path) -> AsyncIterator[tuple[Any, Any, Path, str, list[Any]]]:
    from activities.ledger_activities import LedgerActivities
    from activities.validation_activities import ValidationActivities

    kube_api.server.resources[JOBS] = kmock.ResourceInfo(kind="Job", namespaced=True)
    cfg, faults = _config(tmp_path)
    tq = f"kval-{uuid.uuid4().hex[:8]}"
    acts = (ValidationActivities(cfg, ledger_pool, kube_api_client=kube_api.api_client).all()
            + LedgerActivities(ledger_pool).all())
    stop = asyncio.Event()
    created: list[dict[str, Any]] = []
    task = asyncio.create_task(_kubelet(kube_api, stop, created))
    try:
        async with Worker(temporal_env.client, task_queue=tq, workflows=[ValidationWorkflow],
                          activities=acts):
            yield temporal_env.client, kube_api, faults, tq, created
    finally:
        stop.set()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def _run(client: Any, tq: str, n: str) -> ValidationResult:
    r: ValidationResult = await client.execute_workflow(
        ValidationWorkflow.run, ValidationRequest(cluster=CLUSTER, machine="gpu-01"),
        id=workflow_id_validation("gpu-01", n), task_queue=tq, result_type=ValidationResult)
    return r


def _live_jobs(kube: Any) -> list[str]:
    return [n for (res, _ns, n), o in kube.server.objects.items() if res == JOBS and not o.deleted]


async def test_kube_pass_uncordons_repair_cordon_and_pins_job(kenv: Any) -> None:
    client, kube, _faults, tq, created = kenv
    kube.add_node("gpu-01", unschedulable=True,
                  taints=[{"key": "autorepair.io/repair", "value": "r-1", "effect": "NoSchedule"}],
                  annotations={"autorepair.io/repair-id": "r-1",
                               "autorepair.io/cordoned-by": "autorepair"})
    result = await _run(client, tq, "k-pass")
    assert result.verdict == Verdict.passed, result.reason
    job = created[0]
    spec = job["spec"]["template"]["spec"]
    assert spec["nodeName"] == "gpu-01" and spec["restartPolicy"] == "Never"
    assert {"key": "autorepair.io/repair", "operator": "Exists",
            "effect": "NoSchedule"} in spec["tolerations"]
    assert spec["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "8"
    assert job["spec"]["backoffLimit"] == 0 and job["spec"]["activeDeadlineSeconds"] == 60
    assert _live_jobs(kube) == []  # released
    node = kube.node("gpu-01")
    assert not node["spec"].get("unschedulable")
    assert not any(t["key"] == "autorepair.io/repair" for t in node["spec"].get("taints") or [])


async def test_kube_fail_keeps_node_cordoned_with_ticket(kenv: Any, ledger_pool: Any) -> None:
    from activities.ledger import Ledger

    client, kube, faults, tq, _created = kenv
    kube.add_node("gpu-01")
    (faults / "gpu-01.json").write_text(json.dumps({"remap_failure": True}))
    result = await _run(client, tq, "k-fail")
    assert result.verdict == Verdict.failed and result.ticket_id
    node = kube.node("gpu-01")
    assert node["spec"]["unschedulable"] is True
    assert node["metadata"]["annotations"]["autorepair.io/validation-ticket"] == result.ticket_id
    assert [t["ticket_id"] for t in await Ledger(ledger_pool).open_tickets("gpu-01")] == [
        result.ticket_id]


async def test_kube_aborted_when_gpu_pod_runs_restores_state(kenv: Any,
                                                             ledger_pool: Any) -> None:
    from activities.ledger import Ledger

    client, kube, _faults, tq, created = kenv
    kube.add_node("gpu-01")
    kube.add_pod("team-a", "trainer-0", "gpu-01", gpus=8)
    result = await _run(client, tq, "k-abort")
    assert result.verdict == Verdict.aborted and "team-a/trainer-0" in result.reason
    node = kube.node("gpu-01")
    assert not node["spec"].get("unschedulable") and not node["spec"].get("taints")
    assert created == [] and _live_jobs(kube) == []
    assert await Ledger(ledger_pool).open_tickets("gpu-01") == []
