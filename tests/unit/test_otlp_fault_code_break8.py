"""``autorepair.fault.code`` (the Xid / SXid number) must be an integer: a boolean or a
fractional double is refused naming the attribute and the value, not read as another code.

``int(True)`` is 1 and ``int(79.5)`` is 79: a sender's ``true`` became Xid 1 and a ``79.5``
became Xid 79 (power cycle), silently. Integral doubles (``79.0``, as JSON senders often
send numbers) and decimal strings stay accepted.
"""

from __future__ import annotations

from typing import Any

import pytest

from ingest.otlp import _kv, decode_logs, make_fault_request

NOW = 1_800_000_000.0


def _decode(code: Any) -> Any:
    req = make_fault_request("c", "gpu-01", kind="xid", body="NVRM: Xid ...")
    lr = req.resource_logs[0].scope_logs[0].log_records[0]
    lr.attributes.append(_kv("autorepair.fault.code", code))
    return decode_logs(req, NOW, max_future_s=300)


@pytest.mark.parametrize("code", [True, False, 79.5, 1e-3])
def test_a_code_that_is_not_an_integer_is_refused_naming_it(code: Any) -> None:
    d = _decode(code)
    assert d.faults == []
    assert d.codes == {"fault": 1}
    msg = d.error_message()
    assert "autorepair.fault.code" in msg and repr(code) in msg


@pytest.mark.parametrize(("code", "want"), [(79, 79), (79.0, 79), ("79", 79), (" 48 ", 48)])
def test_integral_codes_are_taken(code: Any, want: int) -> None:
    d = _decode(code)
    assert [f.code for f in d.faults] == [want], d.error_message()
