"""Generates docs/lifecycle.md from the machines' transition tables (issue 26 item 3).

The document is derived, never hand-written: the table per machine is its
``TRANSITIONS`` (:mod:`~workflows.lifecycle.machine_action`,
:mod:`~workflows.lifecycle.guard`, :mod:`~workflows.lifecycle.node`), and the Mermaid
state diagram's edges are the status changes each machine's ``step`` actually makes,
found by stepping the machine through every event at every phase
(:func:`observed_edges`). A test compares the committed file with :func:`render`.
Regenerate with ``python -m workflows.lifecycle.docgen > docs/lifecycle.md``.
"""

from __future__ import annotations

import sys
from datetime import UTC, datetime, timedelta
from typing import Any

from workflows.config import CatalogueConfig, PolicyConfig, RailsConfig
from workflows.leases import LeaseRelease, LeaseRequest, ResetBreakerSignal
from workflows.lifecycle import guard as gm
from workflows.lifecycle import machine_action as ma
from workflows.lifecycle import node as nm
from workflows.lifecycle import repair as rm
from workflows.models import Action, Requester, RequesterKind

_T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _probe_events(action: Action) -> list[ma.Event]:
    phases = ma.PHASES[action]
    evs: list[ma.Event] = [ma.Start(), ma.Cancel(), ma.TimerFired(), ma.Clock(),
                           ma.ActivityOk(phase=phases[-1]),
                           ma.ActivityOk(phase=phases[0], not_run="cannot run")]
    for p in phases[:-1]:
        evs += [ma.ActivityFailed(outcome=o, phase=p) for o in ("transient", "permanent",
                                                                "timed_out")]
        evs += [ma.BmcReadFailed(phase=p), ma.WorkerRestart(phase=p)]
    return evs


def observed_edges(depth: int = 6) -> set[tuple[str, str, str]]:
    """``(status, event kind, next status)`` for every status change :func:`step` makes
    within ``depth`` events of a fresh machine, over every phased action."""
    edges: set[tuple[str, str, str]] = set()
    for action in ma.PHASES:
        frontier = [(ma.new_state(action, "k", 300.0), 0.0)]
        seen: set[str] = set()
        for _ in range(depth):
            nxt = []
            for s, t in frontier:
                for ev in _probe_events(action):
                    t1 = t + (200.0 if isinstance(ev, ma.Clock) else 0.0)
                    s1, _ = ma.step(s, ev, _T0 + timedelta(seconds=t1))
                    if s1.status != s.status:
                        edges.add((s.status.value, ev.kind, s1.status.value))
                    k = s1.model_dump_json() + str(t1)
                    if k not in seen:
                        seen.add(k)
                        nxt.append((s1, t1))
            frontier = nxt
    return edges


_GUARD_POLICY = gm.PolicyView(gpu_nodes=3, budget=1, breaker_threshold=2,
                              breaker_window_s=600.0, one_per_pool=True, detector_cap=3,
                              lease_ttl_s=86400.0)


def _guard_probe_events() -> list[gm.Event]:
    req = LeaseRequest(repair_id="r", workflow_id="w", cluster="c", node="n")
    return [gm.Started(fresh=True), gm.Started(fresh=False), gm.PolicyRead(view=_GUARD_POLICY),
            gm.PolicyFailed(), gm.LedgerRead(view=gm.LedgerView()), gm.LedgerUnavailable(),
            gm.Request(req=req), gm.Release(rel=LeaseRelease(repair_id="r")),
            gm.ResetBreaker(sig=ResetBreakerSignal(by="op")),
            gm.TimerFired(name=gm.LEDGER_TIMER), gm.TimerFired(name=gm.EXPIRY_TIMER),
            gm.HistoryLong(), gm.Clock()]


def guard_edges(depth: int = 5) -> set[tuple[str, str, str]]:
    """``(status, event kind, next status)`` for every status change the guard machine
    makes within ``depth`` events of a fresh guard (a clock event advances 60 s)."""
    edges: set[tuple[str, str, str]] = set()
    frontier = [(gm.new_state("c", _GUARD_POLICY), 0.0)]
    seen: set[str] = set()
    for _ in range(depth):
        nxt = []
        for s, t in frontier:
            for ev in _guard_probe_events():
                t1 = t + (60.0 if isinstance(ev, gm.Clock) else 0.0)
                s1, _ = gm.step(s, ev, _T0 + timedelta(seconds=t1))
                if s1.status != s.status:
                    edges.add((s.status.value, ev.kind, s1.status.value))
                k = s1.model_dump_json() + str(t1)
                if k not in seen:
                    seen.add(k)
                    nxt.append((s1, t1))
        frontier = nxt
    return edges


def _defects_table_diagram(
    defects: dict[str, str], key: str, transitions: dict[tuple[Any, str], str],
    start: str, edges: set[tuple[str, str, str]], terminal: list[str] | None = None,
) -> list[str]:
    """A machine's planted-defect list, its transition table (``key``: the header of the
    state column) and its Mermaid state diagram from ``start`` along ``edges`` (the
    status changes ``step`` made, events of one edge joined), ending in ``terminal``."""
    out = [f"- `{name}`: {what}" for name, what in defects.items()]
    out += ["", "### Transition table", "", f"| {key} | event | decision |", "|---|---|---|"]
    for (st, kind), what in transitions.items():
        out.append(f"| `{st.value}` | `{kind}` | {what} |")
    out += ["", "### State diagram", "", "```mermaid", "stateDiagram-v2", f"    [*] --> {start}"]
    by_pair: dict[tuple[str, str], set[str]] = {}
    for a, kind, b in sorted(edges):
        by_pair.setdefault((a, b), set()).add(kind)
    for (a, b), kinds in sorted(by_pair.items()):
        out.append(f"    {a} --> {b}: {', '.join(sorted(kinds))}")
    out += [f"    {st} --> [*]" for st in terminal or []]
    out += ["```"]
    return out


def _guard_section() -> list[str]:
    out = [
        "",
        "## Cluster guard (`workflows/lifecycle/guard.py`)",
        "",
        "`ClusterGuardWorkflow`'s leases, queue, circuit breaker and rebuild from the",
        "ledger. A fresh guard reads the policy, then the ledger, retrying every "
        f"{gm.LEDGER_RETRY_S:g} s",
        "until it answers; it grants nothing before (I21). A guard that has never read its",
        "policy (its first `load_policy` failed) serves on no default either: it retries "
        f"every {gm.POLICY_RETRY_S:g} s,",
        "tells new requests they wait, and decides them once the policy is read (the",
        "defaults know no pool and no failure domain's nodes). A queued request records why it",
        "waits (" + ", ".join(f"`{w.value}`" for w in gm.Why) + ") and since when. A reset of",
        "the open breaker marks every queued request, whatever queued it: its grant carries",
        "`reset_at` and the repair acts only on evidence observed after it; the reset starts",
        "a fresh window and a repair counted before it is never counted again (I23); a request",
        "first asked for (`requested_at`) at or before the last reset is treated so even when",
        "a guard restart lost the queue (the rebuilt guard reads the reset from the ledger).",
        "A reset of a closed breaker is left alone.",
        "",
        "Planted defects the model checker must find (`tests/model/test_guard_model.py`):",
        "",
    ]
    out += _defects_table_diagram(gm.DEFECTS, "status", gm.TRANSITIONS,
                                  gm.Status.starting.value, guard_edges())
    out += [""]
    return out


def _node_probe_events() -> list[nm.Event]:
    cat, rails = CatalogueConfig(), RailsConfig()

    def alert(active: bool) -> nm.Alert:
        return nm.Alert(alert_id=f"a{int(active)}", cluster="c", node="n", kind="gpu_lost",
                        summary="gpu_lost", level=True, active=active, observed_at=_T0)

    return [nm.Begin(), nm.AlertDelivered(alert=alert(True)),
            nm.AlertDelivered(alert=alert(False)), nm.AlertRecorded(alert_id="a1"),
            nm.PolicyLoaded(catalogue=cat, rails=rails, machine_id="m"),
            nm.PolicyFailed(), nm.AttachDone(alert_id="a1", ok=False),
            nm.RepairStarted(repair_id="r"),
            nm.RepairFinishedEv(repair_id="r", stage=nm.Stage.succeeded, at=_T0),
            nm.RepairEnded(repair_id="r", how="terminated"),
            nm.RepairProbed(repair_id="r", running=False, status="terminated"),
            nm.LedgerRead(repair_id="r", running=True, stage="repairing", status="running"),
            nm.LedgerRead(), nm.LedgerUnavailable(), nm.TimerFired(), nm.HistoryFull(),
            nm.Clock()]


def node_edges(depth: int = 4) -> set[tuple[str, str, str]]:
    """``(reconcile status, event kind, next status)`` for every reconcile change the node
    machine makes within ``depth`` probe events of a fresh entity (continue-as-new: the
    status the next run starts in)."""
    edges: set[tuple[str, str, str]] = set()
    frontier = [nm.new_state("c", "n", "seed")]
    seen: set[str] = set()
    for _ in range(depth):
        nxt = []
        for s in frontier:
            for ev in _node_probe_events():
                s1, cmds = nm.step(s, ev, _T0)
                cont = [c.state for c in cmds if isinstance(c, nm.ContinueAsNew)]
                after = cont[0] if cont else s1
                if after.reconcile != s.reconcile:
                    edges.add((s.reconcile.value, ev.kind, after.reconcile.value))
                k = after.model_dump_json()
                if k not in seen:
                    seen.add(k)
                    nxt.append(after)
        frontier = nxt
    return edges


def _node_section() -> list[str]:
    out = [
        "",
        "## Node (`workflows/lifecycle/node.py`)",
        "",
        "The node entity's lifecycle. Its whole state (`NodeState`: active faults with",
        "their receipt times, clears, retired faults, the open repair and what it acted",
        "on, cooldown, the last successful boot, finished-repair messages that came",
        "before the ledger answered, counters) is carried across continue-as-new. The",
        "table is keyed on whether this run knows the node's open repair (`reconcile`).",
        "`NodeWorkflow` (workflows/node.py) is its thin interpreter: the `deliver_alert`",
        "update, `repair_finished`, the repair child's end, the timer and every activity",
        "outcome are events; an alert is recorded, then decided in arrival order once the",
        "policy is fresh and the ledger has answered (a failed read answers the waiting",
        "alerts `new` at once, I21); an alert for the open repair is answered `attached`",
        "only once the signal landed.",
        "",
        "Invariants (checked by `tests/model/node_world.py`): one repair per node at a",
        "time; **I17** receipt times (`Alert.received_at`, stamped by ingest) judge",
        "persistence and edge order; **I20** a success retires the faults it acted on",
        "(after a booting action: every fault received before its end); **I21** no",
        "decision before the ledger answered, a failed read retried with back-off;",
        "rule zero: no repair without a current, persisted fault behind it (a node",
        "re-registered to another machine keeps none of the old machine's faults); no",
        "alert answered `attached` to a repair that is not running.",
        "",
        "Planted defects the model checker must find (`tests/model/test_node_model.py`):",
        "",
    ]
    out += _defects_table_diagram(nm.DEFECTS, "reconcile", nm.TRANSITIONS,
                                  nm.Reconcile.pending.value, node_edges())
    out += [""]
    return out


def _repair_probe_events() -> list[rm.Event]:
    pol = PolicyConfig()
    pol.consent.mode = "approve"
    return [rm.Start(), rm.PolicyRead(policy=pol, machine="m"), rm.HoldRead(held=False),
            rm.HoldRead(held=True), rm.HistoryRead(), rm.LedgerUnavailable(),
            rm.Approve(by="p"), rm.Cancel(by="p"), rm.LeaseReply(granted=True),
            rm.CallOk(), rm.CallOk(cordoned_by_us=False, held_by_repair="r0"),
            rm.CallOk(running=True), rm.CallOk(idle=False), rm.CallOk(healthy=False),
            rm.CallFailed(), rm.TimerFired(), rm.ContinueAsNewDue(), rm.Clock(),
            rm.Machine(event=ma.ActivityOk(phase="booted")),
            rm.Machine(event=ma.ActivityFailed(outcome="permanent", phase="restart_sent"))]


def repair_edges(depth: int = 14) -> set[tuple[str, str, str]]:
    """``(status, event kind, next status)`` for every status change the repair machine
    makes within ``depth`` probe events of a fresh ``reboot`` repair under consent
    ``approve`` (a clock event advances 4000 s)."""
    edges: set[tuple[str, str, str]] = set()
    alert = nm.Alert(alert_id="a", cluster="c", node="n", kind="xid", code=79, summary="x",
                     observed_at=_T0 - timedelta(seconds=10), actionable=True)
    s0 = rm.new_state("r", "c", "n", Requester(kind=RequesterKind.system, name="s"),
                      Action.reboot, [alert])
    frontier = [(s0, 0.0)]
    seen: set[str] = set()
    for _ in range(depth):
        nxt = []
        for s, t in frontier:
            for ev in _repair_probe_events():
                t1 = t + (4000.0 if isinstance(ev, rm.Clock) else 0.0)
                s1, _ = rm.step(s, ev, _T0 + timedelta(seconds=t1))
                if s1.status != s.status:
                    edges.add((s.status.value, ev.kind, s1.status.value))
                k = s1.model_dump_json(exclude={"policy"}) + str(t1)
                if k not in seen and s1.status != rm.Status.ended:
                    seen.add(k)
                    nxt.append((s1, t1))
        frontier = nxt
    return edges


def _repair_section() -> list[str]:
    out = [
        "",
        "## Repair (`workflows/lifecycle/repair.py`)",
        "",
        "One repair of one node, recommendation to terminal stage. A cancel or reject ends",
        "at once in a wait, when the call out returns, or through the machine action (safe",
        "power state first); a pending one is carried across continue-as-new and ends the",
        "repair before the next rung (I19). An approval records the action, the rung and the",
        "decision's fingerprint and covers only that; a machine held for RMA is never",
        "cordoned, drained or acted on, and an ended repair's cordon is never adopted",
        "without a person (I18). `RepairWorkflow` does not run this machine's sequence yet",
        "(issue 26 item 2, step 3), but decides with its functions: the machine action,",
        "and `workflows/lifecycle/decision.py` (the ladder / gate / cap decision, what an",
        "approval covers, recurrence, what keeps a node cordoned);",
        "`tests/model/repair_world.py` checks it.",
        "",
        "Planted defects the model checker must find (`tests/model/test_repair_model.py`):",
        "",
    ]
    out += _defects_table_diagram(rm.DEFECTS, "status", rm.TRANSITIONS, rm.Status.new.value,
                                  repair_edges(), [rm.Status.ended.value])
    out += [""]
    return out


def render() -> str:
    """The whole of docs/lifecycle.md."""
    out = [
        "# Lifecycle machines",
        "",
        "Generated by `python -m workflows.lifecycle.docgen` from the machines in",
        "`workflows/lifecycle/` (issue 26); `tests/unit/test_lifecycle_doc.py` fails when it",
        "is stale. The machines are pure: `step(state, event, now) -> (state, commands)`;",
        "the workflows turn what Temporal delivers into events and execute the commands.",
        "`make model-check DEPTH=N` explores every event sequence up to N (tests/model).",
        "",
        "## Machine action (`workflows/lifecycle/machine_action.py`)",
        "",
        "One attempt of a phased machine action. Phases (the activity reports the last one",
        "reached; a retry resumes there, so the disruptive command goes out once, I16):",
        "",
        "| action | phases | disruptive command sent in |",
        "|---|---|---|",
    ]
    for action, phases in ma.PHASES.items():
        out.append(f"| `{action.value}` | {' → '.join(phases)} | `{ma.DISRUPTIVE[action]}` |")
    out += [
        "",
        "Invariants: **I16** the disruptive command at most once per attempt; **I19** a",
        "cancel brings the machine to a safe power state (a cycle that sent ForceOff sends",
        "On), then no further action, ending `cancelled`; **I22** an attempt is recorded",
        "exactly when the action touched the machine.",
        "",
        "Planted defects the model checker must find (`tests/model/test_model_check.py`):",
        "",
    ]
    out += _defects_table_diagram(ma.DEFECTS, "status", ma.TRANSITIONS, ma.Status.idle.value,
                                  observed_edges(),
                                  [st.value for st in ma.Status if st in ma.TERMINAL])
    out += _guard_section()
    out += _node_section()
    out += _repair_section()
    return "\n".join(out)


def main() -> None:
    sys.stdout.write(render())


if __name__ == "__main__":
    main()
