"""Fuzz the repair API with schemathesis against ``/api/v1/openapi.json`` (``make fuzz-api``).

Run: ``.venv/bin/python tests/fuzz/api_fuzz.py [--cases 3000] [--seed 1]``.

Starts embedded PostgreSQL and a Temporal dev server, then the API as ``autorepair ingest``
serves it (:class:`tests.fuzz.api_harness.ApiServer`). Each case draws a caller (operator,
detector, viewer token or none), an operation of the served OpenAPI document and a
schemathesis case for it, positive (fits the schema) or negative (does not), sends it and
checks :func:`tests.fuzz.api_harness.check_answer` (no 5xx, every 4xx names the field,
role rules hold) and schemathesis' ``not_a_server_error`` and ``response_schema_conformance``. Hypothesis runs with ``--seed``, so a run repeats.

The last line reads ``api-fuzz: cases=N cases/s=R failures=F statuses={...}``; the exit
status is 1 when anything failed (the first failures are printed with a curl command).
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path[0] = str(ROOT)  # the repository, not tests/fuzz (whose module names are generic)

SHOWN = 10
"""Failures printed in full (all are counted)."""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", type=int, default=3000)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()

    import requests
    import schemathesis
    from hypothesis import HealthCheck, Phase, given, seed, settings
    from hypothesis import strategies as st
    from schemathesis import GenerationMode
    from schemathesis.checks import not_a_server_error
    from schemathesis.core.failures import FailureGroup
    from schemathesis.specs.openapi.checks import response_schema_conformance

    from tests.fuzz.api_harness import (
        DOCUMENTED_5XX,
        ROLES,
        ApiServer,
        check_answer,
        headers_for,
        register_hooks,
    )
    from workers.devstack import start_embedded_postgres

    # repairs the fuzzer's operator approves go on to cordon, whose activities this worker
    # lacks: Temporal logs each retry; nothing of the API's answers is in those logs. The
    # intake's warnings (refused requests) are expected; errors (a 500's traceback) show.
    logging.basicConfig(level=logging.ERROR)
    logging.getLogger("temporalio").setLevel(logging.CRITICAL)
    with tempfile.TemporaryDirectory(prefix="api-fuzz-") as tmp:
        pg = start_embedded_postgres(Path(tmp) / "pg")
        server = ApiServer(pg.get_uri(), None, Path(tmp))
        try:
            base = server.start()
            schema = schemathesis.openapi.from_url(f"{base}/api/v1/openapi.json")
            register_hooks(schema, server.seeds)
            ops = [r.ok() for r in schema.get_all_operations()]
            strategies = {
                (op.label, mode): op.as_strategy(mode, hooks=schema.hooks)
                for op in ops for mode in GenerationMode
            }
            session = requests.Session()
            statuses: Counter[int] = Counter()
            failures: list[str] = []
            sent = 0

            @seed(args.seed)
            @settings(max_examples=args.cases, database=None, deadline=None,
                      phases=[Phase.generate], suppress_health_check=list(HealthCheck))
            @given(data=st.data())
            def one(data: Any) -> None:
                nonlocal sent
                role = data.draw(st.sampled_from(ROLES), label="role")
                label = data.draw(st.sampled_from([op.label for op in ops]), label="op")
                mode = data.draw(st.sampled_from(list(GenerationMode)), label="mode")
                case = data.draw(strategies[(label, mode)], label="case")
                try:
                    response = case.call(base_url=base, session=session,
                                         headers=headers_for(role), timeout=60)
                except requests.RequestException as e:
                    failures.append(f"{label} as {role}: no answer ({type(e).__name__})")
                    return
                sent += 1
                statuses[response.status_code] += 1
                problem = check_answer(case, response, role)
                key = (case.operation.method.upper(), case.operation.path)
                if problem is None and response.status_code not in DOCUMENTED_5XX.get(
                        key, frozenset()):
                    try:  # schemathesis' own: no 5xx, documented bodies match their models
                        case.validate_response(
                            response, checks=[not_a_server_error, response_schema_conformance],
                            headers=headers_for(role))
                    except FailureGroup as e:
                        problem = "; ".join(str(f).strip().splitlines()[0]
                                            for f in e.exceptions)
                if problem is not None:
                    failures.append(f"{label} as {role} ({mode.value}): {problem}\n    "
                                    + case.as_curl_command(headers=headers_for(role),
                                                           base_url=base))

            t0 = time.perf_counter()
            one()
            elapsed = time.perf_counter() - t0
        finally:
            server.stop()
            pg.cleanup()
    for f in failures[:SHOWN]:
        print(f"FAIL {f}")
    if len(failures) > SHOWN:
        print(f"... and {len(failures) - SHOWN} more failures")
    print(f"api-fuzz: cases={sent} cases/s={sent / elapsed:.0f} failures={len(failures)} "
          f"statuses={dict(sorted(statuses.items()))}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
