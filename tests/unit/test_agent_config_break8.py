"""An agent whose resource attributes ingest would refuse does not start.

``autorepair.node_pool`` and ``k8s.node.name`` go through the same name rule at ingest as
the node and cluster ids (ingest.otlp.decode_resource: the whole resource block is
rejected, every point and record of every push). The agent checked the node and cluster
at start ("ingest would reject every push") but took ``--node-pool 'gpu pool'`` and ran,
every push refused.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from agent.cli import app
from agent.config import AgentConfig, ConfigError
from ingest.otlp import decode_resource


@pytest.mark.parametrize(("field", "value"), [
    ("node_pool", "gpu pool"), ("node_pool", "*"), ("k8s_node_name", "node/1"),
])
def test_a_name_ingest_refuses_is_a_config_error_naming_it(field: str, value: str) -> None:
    # what ingest does with it: the whole resource is refused
    attr = {"node_pool": "autorepair.node_pool", "k8s_node_name": "k8s.node.name"}[field]
    assert isinstance(decode_resource({"host.name": "gpu-01", "autorepair.cluster.id": "c",
                                       attr: value}), str)
    with pytest.raises(ConfigError, match=field) as err:
        AgentConfig(endpoint="http://127.0.0.1:4318", cluster="c", node="gpu-01",
                    **{field: value})  # type: ignore[arg-type]
    assert repr(value) in str(err.value)


def test_run_with_a_bad_node_pool_exits_2(tmp_path: Path) -> None:
    r = CliRunner().invoke(app, [
        "run", "--endpoint", "http://127.0.0.1:9", "--cluster", "c", "--node", "gpu-01",
        "--backend", "simulated", "--kernel-log", "none", "--state-dir", str(tmp_path),
        "--duration", "1", "--node-pool", "gpu pool"], env={"COLUMNS": "200"})
    assert r.exit_code == 2, r.output
    assert "node_pool" in r.output and "'gpu pool'" in r.output


def test_good_names_are_taken() -> None:
    cfg = AgentConfig(endpoint="http://127.0.0.1:4318", cluster="c", node="gpu-01",
                      node_pool="h100-pool.a", k8s_node_name="ip-10-0-0-1.ec2.internal")
    assert cfg.node_pool == "h100-pool.a"
