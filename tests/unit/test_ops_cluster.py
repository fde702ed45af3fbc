"""`autorepair validate MACHINE` finds the machine's cluster without --cluster."""

from __future__ import annotations

import pytest
import typer

from workers.ops import resolve_cluster
from workflows.config import AutorepairConfig

UNREACHABLE = "http://127.0.0.1:9"  # discard port: nothing listens


def _cfg(clusters: list[dict[str, object]]) -> AutorepairConfig:
    return AutorepairConfig.model_validate({"clusters": clusters})


def test_configured_cluster_listing_the_machine_wins() -> None:
    cfg = _cfg([
        {"name": "a", "nodes": [{"name": "gpu-01"}]},
        {"name": "b", "nodes": [{"name": "gpu-02", "machine": "m-17"}], "spares": ["m-99"]},
    ])
    assert resolve_cluster(cfg, "gpu-01", UNREACHABLE) == "a"
    assert resolve_cluster(cfg, "m-17", UNREACHABLE) == "b"
    assert resolve_cluster(cfg, "m-99", UNREACHABLE) == "b"


def test_single_cluster_is_the_default() -> None:
    assert resolve_cluster(_cfg([{"name": "only"}]), "anything", UNREACHABLE) == "only"


def test_unknown_machine_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    cfg = _cfg([{"name": "a"}, {"name": "b"}])
    with pytest.raises(typer.Exit) as e:
        resolve_cluster(cfg, "gpu-77", UNREACHABLE)
    assert e.value.exit_code == 1
    err = capsys.readouterr().err
    assert "unknown machine 'gpu-77'" in err


def test_a_typo_is_refused_naming_the_known_machines(capsys: pytest.CaptureFixture[str]
                                                     ) -> None:
    """`validate nosuch-99` on the demo (one cluster listing its nodes) used to start a
    workflow on that cluster and exit 0; it aborted later with UnknownNode."""
    cfg = _cfg([{"name": "demo", "nodes": [{"name": "gpu-01"}, {"name": "gpu-02"}],
                 "spares": ["spare-01"]}])
    with pytest.raises(typer.Exit) as e:
        resolve_cluster(cfg, "nosuch-99", UNREACHABLE)
    assert e.value.exit_code == 1
    err = " ".join(capsys.readouterr().err.split())
    assert "unknown machine 'nosuch-99'" in err
    assert "known machines: gpu-01, gpu-02, spare-01" in err
    assert resolve_cluster(cfg, "gpu-02", UNREACHABLE) == "demo"


def test_a_machine_in_two_clusters_needs_cluster(capsys: pytest.CaptureFixture[str]) -> None:
    cfg = _cfg([{"name": "a", "nodes": [{"name": "gpu-01"}]},
                {"name": "b", "nodes": [{"name": "gpu-01"}]}])
    with pytest.raises(typer.Exit) as e:
        resolve_cluster(cfg, "gpu-01", UNREACHABLE)
    assert e.value.exit_code == 2 and "--cluster" in capsys.readouterr().err
