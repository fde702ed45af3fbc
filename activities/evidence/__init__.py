"""The ``capture_evidence`` activity: what a fault left behind, captured before a disruptive
action destroys it (docs/design.md §5: "evidence capture before a disruptive action:
bounded, never blocks"; contract: :mod:`workflows.evidence`).

Registered on the BMC task queue with the machine actions (it reads the BMC and places a
job on the drained node, like ``reset_gpu``). One call runs both parts at once, each
bounded, the whole within ``EvidenceCaptureInput.timeout_s``:

- node (:mod:`activities.evidence.node`): ``autorepair-agent capture`` through the
  reset job's placement → :class:`~workflows.evidence.NodeCapture`;
- BMC (:mod:`activities.evidence.bmc`): the newest ``bmc_entries`` System Event Log
  entries through Redfish → :class:`~workflows.evidence.BmcCapture` (skipped when
  ``bmc_entries`` is 0 or the node has no BMC configured).

A part that fails, finds nothing or runs out of time is ``None`` with a note; the
activity then still returns (it never fails the repair). Only invalid input raises: a
cluster the worker does not know (non-retryable ``ERR_UNKNOWN_NODE``); pydantic rejects
malformed fields before the call.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from temporalio import activity

from activities.evidence.bmc import SelReader, SelUnavailable, bmc_of
from activities.evidence.node import NodeCaptureFailed, capture_on_node
from workflows.activity_api import ACT, ERR_UNKNOWN_NODE, permanent
from workflows.config import AutorepairConfig, ClusterConfig
from workflows.evidence import BmcCapture, EvidenceCapture, EvidenceCaptureInput, NodeCapture

log = logging.getLogger(__name__)

BMC_SHARE = 0.5
"""Share of the budget the BMC part may take at most (a SEL read is a few requests; a
BMC that hangs must not eat the node part's time — they run side by side anyway)."""
BMC_REQUEST_S = 15.0
"""Bound on one Redfish request, seconds."""


class EvidenceActivities:
    """``capture_evidence`` for every configured cluster; ``kube_api_client``: optional
    ``kubernetes_asyncio`` ``ApiClient`` of the capture Jobs (default: from the cluster's
    kubeconfig)."""

    def __init__(self, config: AutorepairConfig, kube_api_client: Any = None) -> None:
        self.config = config
        self.kube_api_client = kube_api_client

    def _cluster(self, name: str) -> ClusterConfig:
        try:
            return self.config.cluster(name)
        except KeyError as e:
            raise permanent(ERR_UNKNOWN_NODE, str(e)) from e

    async def _node(self, cluster: ClusterConfig, inp: EvidenceCaptureInput,
                    notes: list[str]) -> NodeCapture | None:
        try:
            got, agent_notes = await asyncio.wait_for(
                capture_on_node(cluster, inp, inp.timeout_s, self.kube_api_client),
                inp.timeout_s)
        except TimeoutError:
            notes.append(f"node: capture did not finish within {inp.timeout_s:g} s")
        except NodeCaptureFailed as e:
            notes.append(f"node: {e}")
        except Exception as e:  # the scheduler unreachable, a refused call: a note
            notes.append(f"node: capture failed: {type(e).__name__}: {str(e)[:200]}")
        else:
            notes.extend(agent_notes)
            return got
        return None

    async def _bmc(self, inp: EvidenceCaptureInput, notes: list[str]) -> BmcCapture | None:
        if inp.bmc_entries == 0:
            return None
        machine = inp.machine_id or inp.node
        bmc = bmc_of(self.config, inp.cluster, inp.node, machine)
        if bmc is None:
            notes.append(f"BMC: no BMC configured for machine {machine}")
            return None
        bound = max(1.0, inp.timeout_s * BMC_SHARE)
        try:
            reader = SelReader(self.config, bmc, min(BMC_REQUEST_S, bound))
            return await asyncio.wait_for(reader.read(inp.bmc_entries), bound)
        except TimeoutError:
            notes.append(f"BMC: System Event Log not read within {bound:g} s")
        except SelUnavailable as e:
            notes.append(f"BMC: {e}")
        except Exception as e:
            notes.append(f"BMC: SEL read failed: {type(e).__name__}")
        return None

    @activity.defn(name=ACT.capture_evidence)
    async def capture_evidence(self, inp: EvidenceCaptureInput) -> EvidenceCapture:
        """Capture the node's and the BMC's evidence (see the module docstring)."""
        cluster = self._cluster(inp.cluster)
        node_notes: list[str] = []
        bmc_notes: list[str] = []
        node, bmc = await asyncio.gather(self._node(cluster, inp, node_notes),
                                         self._bmc(inp, bmc_notes))
        cap = EvidenceCapture(node=node, bmc=bmc, notes=[*node_notes, *bmc_notes])
        log.info("event=evidence_captured cluster=%s node=%s repair=%s action=%s "
                 "node_archive=%s bmc_entries=%s notes=%d", inp.cluster, inp.node,
                 inp.repair_id, inp.action.value, node.path if node else None,
                 len(bmc.entries) if bmc else None, len(cap.notes))
        return cap

    def all(self) -> list[Callable[..., Any]]:
        """The activity methods of this class."""
        return [self.capture_evidence]
