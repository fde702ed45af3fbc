"""The read-only queries behind ``autorepair mcp``: the ledger, Temporal visibility and the
repair policy, answered as the models of :mod:`workers.fleet_models`.

:class:`FleetQuery` reads

- the ledger through a read-only pool (:func:`activities.ledger_queries.connect_read_only`:
  PostgreSQL refuses any write on it);
- Temporal, when a client is given: visibility (``list_workflows`` / ``count_workflows``
  over the search attributes of docs/design.md §4.4) and the ``status`` queries of
  ``NodeWorkflow`` and ``RepairWorkflow`` (queries never change a workflow). Temporal is
  optional: when it does not answer, the ledger still does and the answer's ``notes``
  say what is missing;
- the policy of the configuration (``policy.catalogue``, ``policy.rails``,
  ``policy.ladder``, ``policy.migrate_gate``, ``policy.consent``), applied with the very
  functions the workflows use (:mod:`workflows.policy`, :func:`workflows.catalogue.entry_for`),
  so an explanation is what the worker would decide under the same configuration.

Errors: :class:`QueryError` for a request the data cannot answer (unknown repair id,
alert of another node, a node the ledger does not know without its cluster); its message
names the input field and value. Database errors propagate.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
from prometheus_client import CollectorRegistry
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from activities import ledger_queries as q
from activities.ledger import Ledger
from activities.ledger_reports import fleet_report
from activities.reliability import fleet_gpus
from activities.spares import MachineBindings
from workers.fleet_models import (
    AlertList,
    AlertOut,
    AttemptOut,
    CatalogueRow,
    ExplainInput,
    ExplanationOut,
    FaultExplanation,
    FaultOut,
    FleetSummaryInput,
    FleetSummaryOut,
    ListAlertsInput,
    ListRepairsInput,
    NodeInput,
    NodeStatusOut,
    RepairHistory,
    RepairHistoryInput,
    RepairList,
    RepairOut,
    TransitionOut,
    WorkflowOut,
    clip,
    parse_since,
)
from workflows.activity_api import AttemptQuery
from workflows.catalogue import entry_for
from workflows.catalogue.vocabulary import count_window_s
from workflows.config import AutorepairConfig
from workflows.models import (
    ACTION_WEIGHT,
    TERMINAL_STAGES,
    Action,
    Alert,
    RepairStatus,
    Requester,
    RequesterKind,
    Stage,
)
from workflows.policy import (
    consent_decision,
    count_in_window,
    decide_node_action,
    in_cooldown,
    ladder_decision,
    migrate_gate,
    persistence_for,
    received_time,
)
from workflows.protocol import (
    NODE_QUERY_STATUS,
    NODE_WORKFLOW,
    REPAIR_QUERY_STATUS,
    REPAIR_WORKFLOW,
    SA_CLUSTER,
    SA_NODE,
    SA_STATE,
    STATE_AWAITING_APPROVAL,
    STATE_IN_PROGRESS,
    NodeStatus,
    fault_key,
    repair_state,
    workflow_id_node,
)

log = logging.getLogger("autorepair.mcp")

_TERMINAL = frozenset(s.value for s in TERMINAL_STAGES)
_OPEN_STAGES = sorted(s.value for s in Stage if s not in TERMINAL_STAGES)
#: Evidence alerts shown per repair (the ledger keeps them all).
EVIDENCE_CAP = 20
#: Newest alerts and repairs shown by ``node_status``; running repairs listed per node.
RECENT_ALERTS = 10
RECENT_REPAIRS = 5
RUNNING_CAP = 10
#: Faults explained per call when no alert id is given (the newest distinct faults).
EXPLAIN_CAP = 10


class QueryError(Exception):
    """A request the data cannot answer; the message names the field and value."""


def _repair_out(row: dict[str, Any]) -> RepairOut:
    return RepairOut(
        repair_id=row["repair_id"], cluster=row["cluster"], node=row["node"],
        machine_id=row.get("machine_id"), action=row["action"], stage=row["stage"],
        state=repair_state(row["stage"], row.get("approval_pending")),
        requester=f"{row['requester_kind']}:{row['requester_name']}",
        detector=row.get("detector"), reason=clip(row.get("reason")),
        approved_by=row.get("approved_by"), decided_by_rule=row.get("decided_by_rule"),
        alert_ids=list(row.get("alert_ids") or [])[:EVIDENCE_CAP],
        workflow_id=row.get("workflow_id"), created_at=row["created_at"],
        updated_at=row["updated_at"],
    )


def _attrs(wf: Any) -> dict[str, str]:
    out: dict[str, str] = {}
    for k, v in (wf.search_attributes or {}).items():
        if isinstance(v, list):
            v = v[0] if v else None
        if v is not None:
            out[str(k)] = str(v)
    return out


class FleetQuery:
    """Read-only answers over the ledger, Temporal and the policy (module docstring).

    ``config``: the configuration the worker runs with (policy and clusters); ``pool``: a
    read-only ledger pool; ``client``: Temporal client with the pydantic data converter,
    or None (ledger only); ``clock``: timezone-aware now, for tests; ``rpc_timeout``:
    limit of each Temporal call, seconds (default 3).
    """

    def __init__(
        self,
        config: AutorepairConfig,
        pool: asyncpg.Pool,
        client: Client | None = None,
        *,
        clock: Callable[[], datetime] | None = None,
        rpc_timeout: float = 3.0,
    ) -> None:
        self.config = config
        self.pool = pool
        self.ledger = Ledger(pool)
        self.client = client
        self.clock = clock or (lambda: datetime.now(UTC))
        self.rpc_timeout = timedelta(seconds=rpc_timeout)
        # a lazy client's first call also connects: bound the whole call, not only the RPC
        self._limit_s = 2 * rpc_timeout
        self._bindings = MachineBindings(pool, CollectorRegistry())

    # -- Temporal (best effort) --------------------------------------------------------
    def _no_temporal(self, notes: list[str]) -> bool:
        if self.client is None:
            notes.append("Temporal: not connected (ledger only)")
            return True
        return False

    async def _visible(self, query: str, limit: int, notes: list[str]) -> list[WorkflowOut]:
        if self._no_temporal(notes):
            return []
        assert self.client is not None
        out: list[WorkflowOut] = []
        try:
            async with asyncio.timeout(self._limit_s):
                async for wf in self.client.list_workflows(
                        query, limit=limit, rpc_timeout=self.rpc_timeout):
                    out.append(WorkflowOut(
                        workflow_id=wf.id, workflow_type=wf.workflow_type,
                        status=wf.status.name if wf.status else "UNKNOWN",
                        start_time=wf.start_time, search_attributes=_attrs(wf)))
        except (RPCError, TimeoutError, RuntimeError) as e:
            notes.append(f"Temporal visibility did not answer: {type(e).__name__}: {e}")
        return out

    async def _count(self, query: str, notes: list[str]) -> int | None:
        assert self.client is not None
        try:
            async with asyncio.timeout(self._limit_s):
                res = await self.client.count_workflows(query, rpc_timeout=self.rpc_timeout)
        except (RPCError, RuntimeError, TimeoutError) as e:
            notes.append(f"Temporal visibility did not count: {type(e).__name__}: {e}")
            return None
        return int(res.count)

    async def _node_status(self, cluster: str, node: str, notes: list[str]) -> NodeStatus | None:
        if self._no_temporal(notes):
            return None
        assert self.client is not None
        h = self.client.get_workflow_handle(workflow_id_node(cluster, node))
        try:
            async with asyncio.timeout(self._limit_s):
                st: NodeStatus = await h.query(NODE_QUERY_STATUS, result_type=NodeStatus,
                                               rpc_timeout=self.rpc_timeout)
        except RPCError as e:
            if e.status == RPCStatusCode.NOT_FOUND:
                notes.append(f"no {NODE_WORKFLOW} {workflow_id_node(cluster, node)} "
                             "(the node has sent no alert yet)")
            else:
                notes.append(f"{NODE_WORKFLOW} status query failed: {e}")
            return None
        except Exception as e:  # a query can fail in many ways; the ledger still answers
            notes.append(f"{NODE_WORKFLOW} status query failed: {type(e).__name__}: {e}")
            return None
        return st

    # -- lookups -----------------------------------------------------------------------
    async def resolve_cluster(self, cluster: str | None, node: str) -> str:
        """``cluster`` when given, else the one cluster that the ledger or the config knows
        ``node`` in. Raises :class:`QueryError` naming ``node`` or ``cluster``."""
        if cluster is not None:
            return cluster
        found = set(await q.clusters_of_node(self.pool, node))
        found |= {c.name for c in self.config.clusters if node in {n.name for n in c.nodes}}
        if len(found) == 1:
            return found.pop()
        if not found:
            raise QueryError(f"node: no alert or repair of node {node!r} in the ledger and no "
                             "configured cluster lists it; pass cluster")
        raise QueryError(f"cluster: node {node!r} is known in clusters {sorted(found)}; "
                         "pass cluster")

    async def machine_of(self, cluster: str, node: str) -> str | None:
        """The machine under ``node``, as the worker's ``load_policy`` sees it: a migrate's
        binding, else the configured machine (the node name when none), else None."""
        bound = await self._bindings.machine_of(cluster, node)
        if bound is not None:
            return bound
        for c in self.config.clusters:
            if c.name == cluster:
                for n in c.nodes:
                    if n.name == node:
                        return n.machine or n.name
        return None

    # -- tools -------------------------------------------------------------------------
    async def list_alerts(self, inp: ListAlertsInput) -> AlertList:
        """Alerts newest first under the filters of ``inp``."""
        since = parse_since(inp.since, self.clock()) if inp.since else None
        alerts = await q.find_alerts(
            self.pool, cluster=inp.cluster, node=inp.node, kind=inp.kind,
            severity=inp.severity.value if inp.severity else None, active=inp.active,
            since=since, limit=inp.limit)
        return AlertList(alerts=[AlertOut.of(a) for a in alerts], count=len(alerts),
                         truncated=len(alerts) == inp.limit)

    async def list_repairs(self, inp: ListRepairsInput) -> RepairList:
        """Repairs newest first under the filters of ``inp`` (``state`` ``open``: every
        unfinished stage; ``in_progress``: unfinished and not awaiting approval)."""
        stages: list[str] | None = None
        if inp.state == "open":
            stages = _OPEN_STAGES
        elif inp.state == STATE_IN_PROGRESS:
            # an approved repair keeps the stage awaiting_approval while it waits for its
            # lease or a window (the documented order): in progress (``asked=False``)
            stages = list(_OPEN_STAGES)
        elif inp.state is not None:
            stages = [inp.state]
        rows = await q.find_repairs(
            self.pool, cluster=inp.cluster, node=inp.node, stages=stages,
            action=inp.action.value if inp.action else None, requester=inp.requester,
            limit=inp.limit,
            asked={STATE_IN_PROGRESS: False, STATE_AWAITING_APPROVAL: True}.get(
                inp.state or ""))
        return RepairList(repairs=[_repair_out(r) for r in rows], count=len(rows),
                          truncated=len(rows) == inp.limit)

    async def repair_history(self, inp: RepairHistoryInput) -> RepairHistory:
        """One repair: transitions (the newest ``inp.transitions``), attempts, evidence,
        approver, the deciding rules and, while it runs, its live stage."""
        row = await self.ledger.get_repair(inp.repair_id)
        if row is None:
            raise QueryError(f"repair_id: no repair {inp.repair_id!r} in the ledger "
                             "(list_repairs shows the ids)")
        notes: list[str] = []
        trans = row.get("transitions", [])
        evidence: list[AlertOut] = []
        for alert_id in list(row.get("alert_ids") or [])[:EVIDENCE_CAP]:
            a = await self.ledger.get_alert(alert_id)
            if a is not None:
                evidence.append(AlertOut.of(a))
        approved_by = row.get("approved_by")
        live_stage: str | None = None
        live_detail = ""
        if row.get("workflow_id") and row["stage"] not in _TERMINAL and not self._no_temporal(
                notes):
            assert self.client is not None
            try:
                async with asyncio.timeout(self._limit_s):
                    st: RepairStatus = await self.client.get_workflow_handle(
                        row["workflow_id"]).query(REPAIR_QUERY_STATUS, result_type=RepairStatus,
                                                  rpc_timeout=self.rpc_timeout)
                live_stage, live_detail = st.stage.value, clip(st.detail)
                approved_by = approved_by or st.approved_by
            except Exception as e:  # best effort: the ledger answers
                notes.append(f"{REPAIR_WORKFLOW} status query failed: {type(e).__name__}: {e}")
        rule = row.get("decided_by_rule") or ""
        return RepairHistory(
            repair=_repair_out(row),
            approved_by=approved_by,
            decision=[p.strip() for p in rule.split(";") if p.strip()],
            transitions=[TransitionOut(stage=t["stage"], at=t["at"], by=t["by_whom"],
                                       reason=clip(t["reason"]))
                         for t in trans[-inp.transitions:]],
            transitions_total=len(trans),
            attempts=[AttemptOut(action=a["action"], alert_kind=a["alert_kind"], code=a["code"],
                                 outcome=a["outcome"], at=a["at"])
                      for a in row.get("attempts", [])[-inp.transitions:]],
            evidence=evidence,
            live_stage=live_stage,
            live_detail=live_detail,
            notes=notes,
        )

    async def node_status(self, inp: NodeInput) -> NodeStatusOut:
        """The NodeWorkflow's live view of the node (faults, persistence, repair in flight,
        cooldown), its running repairs from visibility and its newest ledger records."""
        cluster = await self.resolve_cluster(inp.cluster, inp.node)
        notes: list[str] = []
        rails = self.config.policy.rails
        st = await self._node_status(cluster, inp.node, notes)
        faults: list[FaultOut] = []
        if st is not None:
            for a in st.active_alerts:
                first = st.first_seen.get(fault_key(a))
                secs = persistence_for(a, rails)
                faults.append(FaultOut(alert=AlertOut.of(a), first_seen=first, persistence_s=secs,
                                       due_at=first + timedelta(seconds=secs) if first else None,
                                       held=st.held.get(fault_key(a))))
        running = await self._visible(
            f"WorkflowType = '{REPAIR_WORKFLOW}' AND ExecutionStatus = 'Running' AND "
            f"{SA_CLUSTER.name} = '{cluster}' AND {SA_NODE.name} = '{inp.node}'",
            RUNNING_CAP, notes)
        alerts = await q.find_alerts(self.pool, cluster=cluster, node=inp.node,
                                     limit=RECENT_ALERTS)
        repairs = await q.find_repairs(self.pool, cluster=cluster, node=inp.node,
                                       limit=RECENT_REPAIRS)
        return NodeStatusOut(
            cluster=cluster, node=inp.node, machine_id=await self.machine_of(cluster, inp.node),
            live=st is not None, degraded=st.degraded if st else None, active_faults=faults,
            repair_in_flight=st.repair_id if st else None,
            cooldown_until=st.cooldown_until if st else None,
            diagnostics=list(st.diagnostics[-RECENT_ALERTS:]) if st else [],
            running_repairs=running, recent_alerts=[AlertOut.of(a) for a in alerts],
            recent_repairs=[_repair_out(r) for r in repairs], notes=notes,
        )

    async def _faults(self, inp: ExplainInput, cluster: str, st: NodeStatus | None
                      ) -> tuple[str, list[Alert]]:
        if inp.alert_id is not None:
            a = await self.ledger.get_alert(inp.alert_id)
            if a is None:
                raise QueryError(f"alert_id: no alert {inp.alert_id!r} in the ledger")
            if (a.cluster, a.node) != (cluster, inp.node):
                raise QueryError(f"alert_id: alert {inp.alert_id!r} is on {a.cluster}/{a.node}, "
                                 f"not {cluster}/{inp.node}")
            return "alert_id", [a]
        if st is not None and st.active_alerts:
            return "live", list(st.active_alerts)[:EXPLAIN_CAP]
        newest: dict[str, Alert] = {}
        for a in await q.find_alerts(self.pool, cluster=cluster, node=inp.node, active=True,
                                     limit=EXPLAIN_CAP * 5):
            newest.setdefault(fault_key(a), a)
        return "ledger", list(newest.values())[:EXPLAIN_CAP]

    async def explain_recommendation(self, inp: ExplainInput) -> ExplanationOut:
        """Catalogue row, node decision, persistence, ladder, migrate gate and consent for
        each fault of the node (see :class:`~workers.fleet_models.FaultExplanation`)."""
        cluster = await self.resolve_cluster(inp.cluster, inp.node)
        notes: list[str] = []
        policy = self.config.policy
        cat = policy.catalogue
        now = self.clock()
        st = await self._node_status(cluster, inp.node, notes)
        source, alerts = await self._faults(inp, cluster, st)
        machine = await self.machine_of(cluster, inp.node)
        days = max(policy.ladder.window_s, policy.migrate_gate.window_s)
        hist = await self.ledger.attempt_history(AttemptQuery(
            cluster=cluster, node=inp.node, machine_id=machine,
            since=now - timedelta(seconds=days)))
        cooling = in_cooldown(st.cooldown_until, now) if st else False
        out: list[FaultExplanation] = []
        for a in alerts:
            entry = entry_for(a.kind, a.code, a.evidence, cat)
            window = count_window_s(a.kind, a.code, cat)
            at = received_time(a)  # the clock the node counts on (I17)
            occ = await q.occurrence_times(self.pool, cluster, inp.node, a.kind, a.code,
                                           at - timedelta(seconds=window), at)
            gpc = str(a.evidence.get("gpc") or a.evidence.get("tpc") or "")
            rep = await q.occurrence_times(
                self.pool, cluster, inp.node, a.kind, a.code,
                at - timedelta(seconds=cat.app_xid_repeat_window_s), at, same_gpu=(a.gpu, gpc))
            n_occ = max(1, count_in_window(occ, at, window))
            n_rep = max(1, count_in_window(rep, at, cat.app_xid_repeat_window_s))
            dec = decide_node_action(a, cat, occurrences_in_window=n_occ, repeats_same_gpu=n_rep)
            secs = persistence_for(a, policy.rails)
            # the node's own first sighting, else this alert's receipt (I17: never the
            # sender's stamp)
            first = (st.first_seen.get(fault_key(a)) if st else None) or at
            due_at = first + timedelta(seconds=secs)
            ladder = gate = consent = None
            final = Action.none
            if dec.actionable:
                lad = ladder_decision(dec.action, hist.attempts, a.kind, a.code, machine, now,
                                      policy.ladder)
                g = migrate_gate(lad.action, [a], hist.critical_alerts, now, policy.migrate_gate)
                c = consent_decision(g.action, [a], Requester(kind=RequesterKind.system),
                                     policy.consent)
                final = g.action
                ladder = {"action": lad.action.value, "escalated": lad.escalated,
                          "needs_human": lad.needs_human, "rule": lad.rule,
                          "attempts_counted_since": (now - timedelta(
                              seconds=policy.ladder.window_s)).isoformat()}
                gate = {"action": g.action.value, "rule": g.rule}
                consent = {"automatic": c.automatic and not lad.needs_human, "rule": c.rule}
            out.append(FaultExplanation(
                alert=AlertOut.of(a),
                catalogue=CatalogueRow(
                    severity=entry.severity.value, mnemonic=entry.mnemonic,
                    action=entry.action.value, actionable=entry.actionable, count=entry.count,
                    window_s=entry.window_s, app_level=entry.app_level, mapped=entry.mapped,
                    bucket=entry.bucket, description=clip(entry.description),
                    source=clip(entry.source)),
                node_decision={"action": dec.action.value, "actionable": dec.actionable,
                               "rule": dec.rule, "reason": dec.reason,
                               "diagnostic": dec.diagnostic,
                               "occurrences_in_window": n_occ, "window_s": window},
                persistence={"seconds": secs, "first_seen": first.isoformat(),
                             "due_at": due_at.isoformat(), "due": now >= due_at,
                             "in_cooldown": cooling},
                ladder=ladder, gate=gate, consent=consent, final_action=final.value))
        return ExplanationOut(
            cluster=cluster, node=inp.node, machine_id=machine, source=source,
            recommended_action=_heaviest(out), summary=_summary(inp.node, out, st, now),
            cooldown_until=st.cooldown_until if st else None,
            repair_in_flight=st.repair_id if st else None, faults=out, notes=notes)

    async def fleet_summary(self, inp: FleetSummaryInput) -> FleetSummaryOut:
        """Alert and repair counts over ``[since, now]``, open repairs, open hardware
        tickets, the downtime and cost of the repairs that ended in the window, and (when
        Temporal answers) running workflows from visibility."""
        now = self.clock()
        since = parse_since(inp.since, now)
        notes: list[str] = []
        clusters = sorted(set(await q.clusters_seen(self.pool)) |
                          {c.name for c in self.config.clusters})
        if inp.cluster is not None:
            clusters = [inp.cluster]
        alerts = await q.alert_counts(self.pool, cluster=inp.cluster, since=since, top=inp.top)
        stages = await q.repair_counts(self.pool, cluster=inp.cluster, since=since)
        workflows: dict[str, int] | None = None
        if not self._no_temporal(notes):
            where = f" AND {SA_CLUSTER.name} = '{inp.cluster}'" if inp.cluster else ""
            node_where = f" AND WorkflowId STARTS_WITH 'node/{inp.cluster}/'" if inp.cluster else ""
            base = "ExecutionStatus = 'Running' AND WorkflowType = "
            counts = {
                "running_node_workflows": await self._count(
                    f"{base}'{NODE_WORKFLOW}'{node_where}", notes),
                "running_repair_workflows": await self._count(
                    f"{base}'{REPAIR_WORKFLOW}'{where}", notes),
                "awaiting_approval_workflows": await self._count(
                    f"{base}'{REPAIR_WORKFLOW}'{where} AND {SA_STATE.name} = "
                    f"'{STATE_AWAITING_APPROVAL}'", notes),
            }
            if all(v is not None for v in counts.values()):
                workflows = {k: int(v or 0) for k, v in counts.items()}
        report = await fleet_report(self.ledger, since, now, cluster=inp.cluster,
                                    currency=self.config.providers.currency,
                                    gpus=fleet_gpus(self.config, inp.cluster),
                                    repeat=self.config.policy.rails.repeat_offender)
        downtime = {k: report[k] for k in DOWNTIME_KEYS}
        downtime["repairs_ended"] = report["repairs"]
        return FleetSummaryOut(
            cluster=inp.cluster, since=since, now=now, clusters=clusters[:100], alerts=alerts,
            downtime=downtime,
            repairs_by_stage=stages,
            open_repairs=sum(n for s, n in stages.items() if s not in _TERMINAL),
            awaiting_approval=stages.get(Stage.awaiting_approval.value, 0),
            open_hardware_tickets=await q.open_tickets_count(self.pool),
            workflows=workflows, reliability=report["reliability"], notes=notes)


#: The ``fleet_report`` fields ``fleet_summary`` passes on as its ``downtime``.
DOWNTIME_KEYS = ("gpu_hours", "idle_wait_gpu_hours", "out_of_service_gpu_hours", "cost",
                 "currency", "unpriced_repairs", "mttr_s")

def _heaviest(faults: list[FaultExplanation]) -> str:
    acts = [Action(f.final_action) for f in faults]
    return max(acts, key=lambda a: ACTION_WEIGHT[a]).value if acts else Action.none.value


def _summary(node: str, faults: list[FaultExplanation], st: NodeStatus | None,
             now: datetime) -> str:
    """One line: what is recommended for ``node`` and which rules decided."""
    if not faults:
        return f"{node}: no active fault recorded; nothing to recommend"
    top = max(faults, key=lambda f: ACTION_WEIGHT[Action(f.final_action)])
    nd = top.node_decision
    if top.final_action == Action.none.value:
        return f"{node}: no node action — {top.alert.summary}: {nd['rule']}: {nd['reason']}"
    parts = [f"{node}: {top.final_action} recommended for {top.alert.summary} "
             f"(catalogue {top.catalogue.action}, {nd['rule']})"]
    if top.ladder:
        parts.append(top.ladder["rule"])
    if top.gate:
        parts.append(top.gate["rule"])
    if top.consent:
        parts.append("runs without approval (" + top.consent["rule"] + ")"
                     if top.consent["automatic"] else
                     "waits for approval (" + top.consent["rule"] + ")")
    if st is not None and st.repair_id:
        parts.append(f"repair {st.repair_id} already in flight")
    elif st is not None and in_cooldown(st.cooldown_until, now):
        parts.append(f"in cooldown until {st.cooldown_until}")
    elif not top.persistence["due"]:
        parts.append(f"waiting for persistence until {top.persistence['due_at']}")
    return "; ".join(parts)
