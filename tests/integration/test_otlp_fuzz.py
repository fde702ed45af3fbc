"""Property test of both OTLP receivers with hostile bodies (CI slice of ``make fuzz``).

Hypothesis hands a seeded ``Random`` to :func:`tests.fuzz.cases.make_case` (truncated and
mutated protobuf, wrong wire types, wrong JSON types, deep nesting, huge repeated fields,
gzip bombs, invalid UTF-8, wrong content types, …). Properties: no 5xx but the documented
503 (with ``Retry-After``), no gRPC ``UNKNOWN``/``INTERNAL``, every request answered, a
valid push still accepted afterwards, and memory bounded. ``derandomize`` fixes the
examples, so a CI failure reproduces.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

import psutil
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.fuzz.cases import FAMILIES, gzip_bomb, make_case
from tests.fuzz.harness import Sender, ServerThread, fuzz_config

#: Growth of this process's RSS the slice may cause, bytes: the decode caps (32 MiB
#: decompressed protobuf, 4 MiB JSON) times the two decode threads, plus parsed copies.
RSS_GROWTH_LIMIT = 400 * 1024 * 1024


@pytest.fixture(scope="module")
def sender() -> Iterator[Sender]:
    for mib in (1, 8, 64):
        gzip_bomb(mib)  # built once, before the memory baseline
    server = ServerThread(fuzz_config())
    svc = server.start()
    s = Sender(svc.http_port, svc.grpc_port, svc.api_port)
    try:
        yield s
    finally:
        s.close()
        server.stop()


@settings(max_examples=60, derandomize=True, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(rng=st.randoms(use_true_random=False), transport=st.sampled_from(["http", "grpc"]))
def test_hostile_bodies_never_crash_the_receivers(sender: Sender, rng: random.Random,
                                                  transport: str) -> None:
    case = make_case(rng, transport)
    problem = sender.send(case)
    assert problem is None, problem


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_family_on_both_transports_then_still_serving(sender: Sender,
                                                            family: str) -> None:
    proc = psutil.Process()
    base = proc.memory_info().rss
    rng = random.Random(f"ci-{family}")
    for transport in ("http", "grpc"):
        for _ in range(3 if family not in ("huge", "gzip_bomb") else 1):
            case = make_case(rng, transport, family)
            problem = sender.send(case)
            assert problem is None, problem
    assert sender.alive() is None
    assert proc.memory_info().rss - base < RSS_GROWTH_LIMIT
