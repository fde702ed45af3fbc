"""Issue 27 item 11: annotation requests are keyed by (detector, source), so an annotation
under an allowed detector's name neither pre-claims that detector's API request ids (a
409 for the real request) nor spends its cap.

Real parts: kmock + ``kubernetes_asyncio`` for the annotation, the real ``KubeWatcher``
and ``RepairIntake`` over the ledger (embedded PostgreSQL), repairs started on the
project harness (time-skipping Temporal)."""

from __future__ import annotations

import json

from tests.fixtures.kube import NODES, KubeApi
from tests.security.conftest import Harness
from workers.repairs.intake import RepairIntake, request_key
from workers.repairs.models import RepairCreate
from workers.watchers.kube import REQUEST_ANNOTATION, REQUEST_LABEL, RESULT_ANNOTATION, KubeWatcher
from workflows.config import AutorepairConfig
from workflows.models import Alert, Requester, RequesterKind


class ListSink:
    def __init__(self) -> None:
        self.alerts: list[Alert] = []

    async def submit(self, alert: Alert) -> None:
        self.alerts.append(alert)


async def test_annotation_cannot_preclaim_or_spend_an_api_detectors_ids(
    harness: Harness, kube_api: KubeApi
) -> None:
    h = harness
    c = h.cluster.cluster
    cfg = AutorepairConfig.model_validate({
        "temporal": {"task_queue": h.task_queue},
        "clusters": [{"name": c, "scheduler": "kubernetes",
                      "nodes": [{"name": "gpu-01"}, {"name": "gpu-02"}],
                      "detectors": {"allowed": {"dcgm-scanner": {"cap": 1}}}}]})
    intake = RepairIntake(cfg, h.ledger, h.client)
    for n in ("gpu-01", "gpu-02"):
        kube_api.add_node(n)
    # root on gpu-01 (the kubelet may patch its own Node) writes a request under the
    # allowed detector's name, with the request id the real detector will use next
    doc = {"detector": "dcgm-scanner", "request_id": "dcgm-42", "mode": "reboot",
           "reason": "forged by gpu-01"}
    kube_api.server.objects[NODES, None, "gpu-01"].patch({"metadata": {
        "labels": {REQUEST_LABEL: "true"},
        "annotations": {REQUEST_ANNOTATION: json.dumps(doc)}}})
    w = KubeWatcher(cfg, cfg.clusters[0], ListSink(), kube_api.api_client, intake=intake)
    await w.scan_once()
    res = json.loads(kube_api.node("gpu-01")["metadata"]["annotations"][RESULT_ANNOTATION])
    assert res["repair_id"] and not res["refused"], res
    row = await h.ledger.get_repair(res["repair_id"])
    assert row is not None and row["detector"] == request_key("dcgm-scanner", "annotation")

    # the real detector, through the API, with the same request id on another node: its
    # own repair (not a 409), and its own cap is not spent by the annotation
    made = await intake.create(
        RepairCreate(node="gpu-02", request_id="dcgm-42", mode="reboot",
                     reason="DCGM diag failed"),
        Requester(kind=RequesterKind.detector, name="dcgm-scanner"))
    assert made.created and not made.refused, made.refused_reason
    assert made.repair.node == "gpu-02" and made.repair.repair_id != res["repair_id"]
    # the API detector's second request meets its own cap (1), not the annotation's
    again = await intake.create(
        RepairCreate(node="gpu-01", request_id="dcgm-43", mode="reboot", reason="again"),
        Requester(kind=RequesterKind.detector, name="dcgm-scanner"))
    assert again.refused and "per-detector cap" in again.refused_reason


def test_request_key_cannot_be_named_by_an_api_detector() -> None:
    from pydantic import ValidationError

    key = request_key("dcgm-scanner", "annotation")
    assert key != "dcgm-scanner" and request_key("dcgm-scanner") == "dcgm-scanner"
    try:
        RepairCreate(node="gpu-01", request_id="x", mode="reboot", reason="r", detector=key)
    except ValidationError as e:
        assert e.errors()[0]["loc"] == ("detector",)
    else:
        raise AssertionError("an API detector may not be named like an annotation key")
