"""``tests/bench/ingest.py --quick`` runs to its figures (issue 30 item 3: ``make bench``
prints every figure). It had rotted silently: a renamed import made its bare server die
on start and the benchmark wait for it for ever; and the gRPC figures were refusals, not
pushes (every simulated agent shares one address and four connections, beyond the
per-peer and per-connection caps). This keeps it running and its load accepted."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_ingest_benchmark_prints_its_figures_with_every_push_accepted() -> None:
    run = subprocess.run([sys.executable, "tests/bench/ingest.py", "--quick"], cwd=ROOT,
                         capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stderr[-3000:]
    figures = json.loads(run.stdout.strip().splitlines()[-1])
    for transport in ("http", "grpc"):
        for server in ("ingest", "bare"):
            key = f"{transport}_{server}_1000_agents"
            assert figures[f"{key}_requests"] > 0, figures
            assert figures[f"{key}_errors"] == 0, (key, figures)
        assert figures[f"{transport}_ingest_saturation_errors"] == 0, figures
        assert 0 < figures[f"{transport}_ingest_over_bare_throughput_ratio"], figures
    assert figures["recompute_100k_ms"] > 0
