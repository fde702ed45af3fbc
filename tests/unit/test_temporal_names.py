"""Temporal names are spelled in ``workflows/protocol.py`` only.

Workflow types, workflow ids, task queues, signal/query/update names and search-attribute
names are part of the contract of docs/design.md §4.4: operators type them in the Temporal UI and
CLI, and a worker and its clients must agree on them. This test scans the Python of
every control-plane and agent package (AST, docstrings skipped) for a literal spelling of
any of them outside ``workflows/protocol.py``, and checks that the protocol module says
exactly what docs/design.md §4.4 writes.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from workflows import protocol
from workflows.models import Stage

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("agent", "ingest", "workflows", "activities", "workers")
HOME = Path("workflows/protocol.py")
#: Files still allowed to spell names, each with the reason. Non-Python places (docs,
#: deploy/temporal/setup-namespace.sh, checked by tests/deploy/test_temporal_setup.py)
#: are outside the scan.
ALLOWED: dict[Path, str] = {}

WORKFLOW_TYPES = {
    protocol.NODE_WORKFLOW,
    protocol.REPAIR_WORKFLOW,
    protocol.GUARD_WORKFLOW,
    protocol.VALIDATION_WORKFLOW,
}
SA_NAMES = set(protocol.SEARCH_ATTRIBUTES)
TASK_QUEUES = {protocol.TASK_QUEUE, protocol.BMC_TASK_QUEUE}
ID_PREFIXES = ("node/", "repair/", "guard/", "validate/")
#: Signal/query/update names are common words ("status", "cancel"): flagged only where a
#: Temporal call or decorator takes them.
MESSAGE_NAMES = {
    value
    for name, value in vars(protocol).items()
    if re.fullmatch(r"[A-Z]+_(SIGNAL|QUERY|UPDATE)_[A-Z_]+", name)
}
#: Calls whose first argument is a workflow type or a signal/query/update name.
TEMPORAL_CALLS = {
    "signal", "query", "execute_update", "start_update", "execute_update_with_start_workflow",
    "start_update_with_start_workflow", "start_workflow", "execute_workflow",
    "start_child_workflow", "execute_child_workflow", "WithStartWorkflowOperation",
    "defn", "update",
}
#: Keyword arguments of those calls that take a workflow type or message name.
NAME_KWARGS = {"name", "start_signal", "workflow", "update"}
#: A visibility query spelling a type or attribute: ``WorkflowType = 'RepairWorkflow'``,
#: ``ClusterId = 'demo'``.
VISIBILITY = re.compile(
    r"\b(?:{})\s*(?:=|!=|IN\b)".format("|".join(sorted(SA_NAMES)))
    + r"|'(?:{})'".format("|".join(sorted(WORKFLOW_TYPES)))
)


def _docstrings(tree: ast.AST) -> set[int]:
    """ids of the docstring constants of modules, classes, functions and attributes."""
    out: set[int] = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if not isinstance(body, list):
            continue
        for stmt in body:
            if (
                isinstance(stmt, ast.Expr)
                and isinstance(stmt.value, ast.Constant)
                and isinstance(stmt.value.value, str)
            ):
                out.add(id(stmt.value))
    return out


def _call_name(func: ast.expr) -> str:
    if isinstance(func, ast.Attribute):
        return func.attr
    if isinstance(func, ast.Name):
        return func.id
    return ""


def scan(source: str) -> Iterator[tuple[int, str]]:
    """``(line, what)`` for each literal Temporal name in ``source``."""
    tree = ast.parse(source)
    docs = _docstrings(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            text = node.value
            if text in WORKFLOW_TYPES | SA_NAMES:
                yield node.lineno, f"name {text!r}"
            elif text.startswith(ID_PREFIXES):
                yield node.lineno, f"workflow id {text!r}"
            elif VISIBILITY.search(text):
                yield node.lineno, f"visibility query {text!r}"
        elif isinstance(node, ast.JoinedStr):
            first = node.values[0] if node.values else None
            if (
                isinstance(first, ast.Constant)
                and isinstance(first.value, str)
                and first.value.startswith(ID_PREFIXES)
            ):
                yield node.lineno, f"workflow id f-string {first.value!r}..."
        elif isinstance(node, ast.Call):
            named: list[ast.expr] = []
            if _call_name(node.func) in TEMPORAL_CALLS:
                named = node.args[:1] + [k.value for k in node.keywords if k.arg in NAME_KWARGS]
            queues = [k.value for k in node.keywords if k.arg == "task_queue"]
            for arg, names in [(a, MESSAGE_NAMES | WORKFLOW_TYPES) for a in named] + [
                (a, TASK_QUEUES) for a in queues
            ]:
                if isinstance(arg, ast.Constant) and arg.value in names:
                    yield node.lineno, f"Temporal call with {arg.value!r}"
        elif isinstance(node, ast.AnnAssign | ast.Assign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            value = node.value
            for t in targets:
                name = t.id if isinstance(t, ast.Name) else getattr(t, "attr", "")
                if (
                    name.endswith(("task_queue", "_queue"))
                    and isinstance(value, ast.Constant)
                    and value.value in TASK_QUEUES
                ):
                    yield node.lineno, f"task queue {value.value!r}"


def _files() -> list[Path]:
    out: list[Path] = []
    for pkg in PACKAGES:
        out += sorted((ROOT / pkg).rglob("*.py"))
    return out


def test_the_scan_covers_the_packages() -> None:
    rel = {p.relative_to(ROOT) for p in _files()}
    assert HOME in rel
    assert Path("ingest/handoff.py") in rel and Path("workers/ops.py") in rel
    assert all(p in rel for p in ALLOWED), "an allow-listed file is gone: drop it from ALLOWED"


def test_no_temporal_name_literal_outside_protocol() -> None:
    found = []
    for path in _files():
        rel = path.relative_to(ROOT)
        if rel == HOME or rel in ALLOWED:
            continue
        found += [f"{rel}:{line}: {what}" for line, what in scan(path.read_text())]
    assert not found, "Temporal names belong in workflows/protocol.py:\n" + "\n".join(found)


@pytest.mark.parametrize(
    "snippet",
    [
        '@workflow.defn(name="RepairWorkflow")\nclass X: ...',
        'await h.signal("approve", sig)',
        'await h.query("status", result_type=X)',
        'await c.execute_update_with_start_workflow("deliver_alert", a, start_workflow_operation=op)',
        'await c.start_workflow(G, inp, id=i, task_queue="autorepair")',
        'await c.start_workflow(G, inp, id=i, start_signal="cluster_alert")',
        'wid = f"node/{cluster}/{node}"',
        'wid = "guard/" + cluster',
        'key = SearchAttributeKey.for_keyword("RepairState")',
        "q = f\"WorkflowType = 'RepairWorkflow' AND ClusterId = '{c}'\"",
        'class C:\n    bmc_task_queue: str = "autorepair-bmc"',
    ],
)
def test_the_scan_finds_each_kind_of_literal(snippet: str) -> None:
    assert list(scan(snippet)), snippet


@pytest.mark.parametrize(
    "snippet",
    [
        '"""A docstring naming RepairWorkflow, node/{cluster}/{node} and ``status``."""',
        'return {"status": "ok"}',
        'app.command("approve")',
        'requester = Requester(kind=RequesterKind.system, name="autorepair")',
        'path = f"/nodes/{node}/reboot"',
    ],
)
def test_the_scan_leaves_other_strings_alone(snippet: str) -> None:
    assert not list(scan(snippet)), snippet


def test_protocol_spells_design_4_4() -> None:
    assert protocol.TASK_QUEUE == "autorepair"
    assert WORKFLOW_TYPES == {
        "NodeWorkflow", "RepairWorkflow", "ClusterGuardWorkflow", "ValidationWorkflow"
    }
    assert protocol.workflow_id_node("c", "n") == "node/c/n"
    assert protocol.workflow_id_repair("c", "n", "r") == "repair/c/n/r"
    assert protocol.workflow_id_guard("c") == "guard/c"
    assert protocol.workflow_id_validation("m", 3) == "validate/m/3"
    assert (protocol.REPAIR_SIGNAL_APPROVE, protocol.REPAIR_SIGNAL_REJECT,
            protocol.REPAIR_SIGNAL_CANCEL, protocol.REPAIR_QUERY_STATUS) == (
        "approve", "reject", "cancel", "status")
    assert protocol.SEARCH_ATTRIBUTES == dict.fromkeys(
        ("NodeId", "ClusterId", "MachineId", "RepairAction", "RepairStage", "RepairState",
         "Requester", "AlertKind"), "Keyword")


@pytest.mark.parametrize(
    ("stage", "state"),
    [
        (Stage.recommended, "in_progress"),
        (Stage.awaiting_approval, "awaiting_approval"),
        (Stage.draining, "in_progress"),
        (Stage.succeeded, "succeeded"),
        ("timed_out", "timed_out"),
        ("awaiting_approval", "awaiting_approval"),
        ("no-such-stage", "in_progress"),
    ],
)
def test_repair_state(stage: Stage | str, state: str) -> None:
    assert protocol.repair_state(stage) == state
