"""Hostile OTLP requests for the receivers, from a seeded ``random.Random``.

One generator serves both drivers: the CI slice (``tests/integration/test_otlp_fuzz.py``,
hypothesis hands in its own ``Random``) and ``make fuzz`` (``tests/fuzz/otlp_fuzz.py``,
100,000+ cases). A :class:`Case` is one request on one transport; :data:`FAMILIES` lists
what is generated: truncated and bit-flipped protobuf, wrong wire types for known fields,
JSON with wrong field types, deep nesting (protobuf and JSON), huge repeated fields, gzip
bombs and corrupt gzip, invalid UTF-8, wrong content types / encodings / paths / methods,
junk credentials, random bytes — and valid pushes in between.
"""

from __future__ import annotations

import gzip
import json
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache

from google.protobuf import json_format

from ingest.otlp import make_fault_request, make_metrics_request

PROTOBUF = "application/x-protobuf"
JSON = "application/json"
METRICS, LOGS = "metrics", "logs"

#: Node and cluster names of generated pushes: a bounded pool, so that the run measures
#: the decoders and not the growth of the node table (bounded by the score TTL instead).
NODES = tuple(f"fz-{i:02d}" for i in range(40))
CLUSTERS = ("fuzz", "fuzz-b", "")
KINDS = ("xid", "sxid", "gpu_lost", "made_up", "", "x" * 80)


@dataclass
class Case:
    """One request. ``transport``: ``http`` or ``grpc``; ``signal``: metrics or logs."""

    family: str
    transport: str
    signal: str
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)
    path: str | None = None  # http only; None = the signal's path
    method: str = "POST"
    grpc_gzip: bool = False


def valid_body(rng: random.Random, signal: str) -> bytes:
    """A contract-shaped push (sometimes with odd but legal values)."""
    node, cluster = rng.choice(NODES), rng.choice(CLUSTERS[:2])
    if signal == METRICS:
        score = rng.choice([rng.random(), 0.0, 1.0, -1.0, 2.0, float("nan"), float("inf")])
        req = make_metrics_request(cluster, node, score,
                                   state=rng.choice(["active", "idle", "calibrating", "bogus"]),
                                   signals={"throughput_ratio": rng.random()})
        return req.SerializeToString()
    return make_fault_request(cluster, node, kind=rng.choice(KINDS), code=rng.randrange(200),
                              body="NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus",
                              active=rng.random() < 0.9).SerializeToString()


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _field(num: int, wire: int, payload: bytes) -> bytes:
    return _varint((num << 3) | wire) + payload


def wrong_wire_types(rng: random.Random, depth: int = 0) -> bytes:
    """Protobuf whose known field numbers (1..4) carry random wire types and payloads."""
    out = bytearray()
    for _ in range(rng.randrange(1, 8)):
        num, wire = rng.randrange(1, 6), rng.choice([0, 1, 2, 3, 4, 5, 7])
        if wire == 0:
            out += _field(num, 0, _varint(rng.getrandbits(rng.choice([1, 32, 64, 70]))))
        elif wire == 1:
            out += _field(num, 1, rng.randbytes(8))
        elif wire == 5:
            out += _field(num, 5, rng.randbytes(4))
        elif wire == 2:
            inner = wrong_wire_types(rng, depth + 1) if depth < 4 and rng.random() < 0.5 \
                else rng.randbytes(rng.randrange(0, 40))
            declared = len(inner) + rng.choice([0, 0, 0, 1, -1, 1000])
            out += _field(num, 2, _varint(max(declared, 0)) + inner)
        else:
            out += _field(num, wire, rng.randbytes(rng.randrange(0, 4)))
    return bytes(out)


def nested_anyvalue(depth: int) -> bytes:
    """``ExportMetricsServiceRequest`` whose resource attribute is an array nested
    ``depth`` deep (protobuf's own recursion limit is 100)."""
    any_value = _field(1, 2, _varint(4) + b"leaf")  # AnyValue.string_value
    for _ in range(depth):
        array = _field(1, 2, _varint(len(any_value)) + any_value)  # ArrayValue.values
        any_value = _field(5, 2, _varint(len(array)) + array)  # AnyValue.array_value
    kv = _field(1, 2, _varint(4) + b"deep") + _field(2, 2, _varint(len(any_value)) + any_value)
    resource = _field(1, 2, _varint(len(kv)) + kv)  # Resource.attributes
    rm = _field(1, 2, _varint(len(resource)) + resource)  # ResourceMetrics.resource
    return _field(1, 2, _varint(len(rm)) + rm)  # request.resource_metrics


def huge_repeated(rng: random.Random, signal: str) -> bytes:
    """Up to ~200k points / records in one request (under the 4 MiB body limit)."""
    n = rng.choice([1000, 20_000, 150_000])
    if signal == METRICS:
        req = make_metrics_request("fuzz", rng.choice(NODES), 0.9)
        pts = req.resource_metrics[0].scope_metrics[0].metrics[0].gauge.data_points
        for _ in range(n - 1):
            pts.add().CopyFrom(pts[0])
        return req.SerializeToString()
    logs = make_fault_request("fuzz", rng.choice(NODES), kind="xid", code=79, body="x")
    recs = logs.resource_logs[0].scope_logs[0].log_records
    for _ in range(min(n, 40_000) - 1):
        recs.add().CopyFrom(recs[0])
    return logs.SerializeToString()


@cache
def gzip_bomb(mib: int) -> bytes:
    """gzip of ``mib`` MiB of zeros (~1/1000 of that on the wire); cached."""
    return gzip.compress(b"\0" * (mib << 20), compresslevel=9)


def invalid_utf8(rng: random.Random, signal: str) -> bytes:
    """A valid push with one string field's bytes replaced by invalid UTF-8."""
    body = valid_body(rng, signal)
    marker = b"fz-"
    i = body.find(marker)
    if i < 0:
        return body + b"\xff"
    bad = rng.choice([b"\xff\xfe\xfd", b"\xc3\x28\x00", b"\xed\xa0\x80"])
    return body[:i] + bad + body[i + len(bad):]


def json_value(rng: random.Random, depth: int = 0) -> object:
    r = rng.random()
    if depth > 4 or r < 0.4:
        return rng.choice([None, True, 1, -1, 2**70, 1.5, "x", "", "NaN", [], {}, "\ud800"])
    if r < 0.7:
        return [json_value(rng, depth + 1) for _ in range(rng.randrange(4))]
    keys = ["resourceMetrics", "resourceLogs", "resource", "attributes", "key", "value",
            "stringValue", "intValue", "arrayValue", "values", "scopeMetrics", "metrics",
            "gauge", "dataPoints", "asDouble", "timeUnixNano", "logRecords", "body", "z"]
    return {rng.choice(keys): json_value(rng, depth + 1) for _ in range(rng.randrange(4))}


def json_wrong_types(rng: random.Random, signal: str) -> bytes:
    """A valid JSON push with values swapped for random JSON (types the schema refuses)."""
    req = make_metrics_request("fuzz", rng.choice(NODES), 0.5) if signal == METRICS else \
        make_fault_request("fuzz", rng.choice(NODES), kind="xid", code=79, body="b")
    doc = json_format.MessageToDict(req)

    def mutate(x: object) -> object:
        if isinstance(x, dict):
            return {k: (json_value(rng) if rng.random() < 0.15 else mutate(v))
                    for k, v in x.items()}
        if isinstance(x, list):
            return [mutate(v) for v in x]
        return x

    return json.dumps(mutate(doc)).encode("utf-8", "surrogatepass")


def deep_json(rng: random.Random) -> bytes:
    depth = rng.choice([50, 200, 5000, 200_000])
    key = rng.choice(['{"resourceMetrics": ', '{"a": '])
    if rng.random() < 0.5:
        return (key + "[" * depth + "]" * depth + "}").encode()
    return (key + '{"resource": ' * depth + "{}" + "}" * depth + "}").encode()


def mutate_bytes(rng: random.Random, body: bytes) -> bytes:
    """Truncate, flip, insert or duplicate bytes of ``body``."""
    b = bytearray(body)
    for _ in range(rng.randrange(1, 4)):
        op = rng.randrange(4)
        if op == 0 and b:
            del b[rng.randrange(len(b)):]
        elif op == 1 and b:
            i = rng.randrange(len(b))
            b[i] ^= 1 << rng.randrange(8)
        elif op == 2:
            i = rng.randrange(len(b) + 1)
            b[i:i] = rng.randbytes(rng.randrange(1, 16))
        elif b:
            i = rng.randrange(len(b))
            b += b[i:i + rng.randrange(1, 64)]
    return bytes(b)


CTYPES = (PROTOBUF, JSON, "application/x-protobuf; charset=utf-8", "text/plain", "",
          "application/json; charset=latin-1", "multipart/form-data; boundary=x",
          "APPLICATION/JSON", "application/grpc", "\x00\x7f")


def _gen_valid(rng: random.Random, c: Case) -> None:
    c.body = valid_body(rng, c.signal)
    if c.transport == "http" and rng.random() < 0.3:
        c.headers["content-type"] = JSON
        req = make_metrics_request("fuzz", rng.choice(NODES), rng.random())
        c.body = json_format.MessageToJson(req).encode() if c.signal == METRICS else \
            json_format.MessageToJson(make_fault_request(
                "fuzz", rng.choice(NODES), kind="xid", code=79, body="b")).encode()


def _gen_truncated(rng: random.Random, c: Case) -> None:
    body = valid_body(rng, c.signal)
    c.body = body[: rng.randrange(len(body))]


def _gen_mutated(rng: random.Random, c: Case) -> None:
    c.body = mutate_bytes(rng, valid_body(rng, c.signal))


def _gen_wire_types(rng: random.Random, c: Case) -> None:
    c.body = wrong_wire_types(rng)


def _gen_deep(rng: random.Random, c: Case) -> None:
    if c.transport == "http" and rng.random() < 0.5:
        c.headers["content-type"] = JSON
        c.body = deep_json(rng)
    else:
        c.signal = METRICS
        c.body = nested_anyvalue(rng.choice([3, 9, 50, 99, 101, 150]))


def _gen_huge(rng: random.Random, c: Case) -> None:
    c.body = huge_repeated(rng, c.signal)
    if c.transport == "http" and rng.random() < 0.5:
        c.body = gzip.compress(c.body, compresslevel=1)
        c.headers["content-encoding"] = "gzip"


def _gen_bomb(rng: random.Random, c: Case) -> None:
    if c.transport == "grpc":
        # grpc compresses on the client; the server's receive limit applies after inflating
        c.body = b"\0" * (rng.choice([1, 6]) << 20)
        c.grpc_gzip = True
        return
    c.body = gzip_bomb(rng.choice([1, 8, 64]))
    c.headers["content-encoding"] = "gzip"
    if rng.random() < 0.5:
        c.headers["content-type"] = JSON
    if rng.random() < 0.3:
        c.body = c.body[: rng.randrange(len(c.body))]  # truncated gzip


def _gen_corrupt_gzip(rng: random.Random, c: Case) -> None:
    c.body = mutate_bytes(rng, gzip.compress(valid_body(rng, c.signal)))
    c.headers["content-encoding"] = "gzip"


def _gen_utf8(rng: random.Random, c: Case) -> None:
    c.body = invalid_utf8(rng, c.signal)
    if c.transport == "http" and rng.random() < 0.5:
        c.headers["content-type"] = JSON
        c.body = b'{"resourceMetrics": [{"resource": {"attributes": [{"key": "\xff\xfe", ' \
                 b'"value": {"stringValue": "\xc3\x28"}}]}}]}'


def _gen_json_types(rng: random.Random, c: Case) -> None:
    c.transport = "http"
    c.headers["content-type"] = JSON
    c.body = json_wrong_types(rng, c.signal)


def _gen_envelope(rng: random.Random, c: Case) -> None:
    """Wrong content types, encodings, paths, methods, credentials (HTTP)."""
    c.transport = "http"
    c.body = valid_body(rng, c.signal)
    c.headers["content-type"] = rng.choice(CTYPES)
    r = rng.random()
    if r < 0.25:
        c.headers["content-encoding"] = rng.choice(["br", "deflate", "gzip", "GZIP", "x" * 300,
                                                    "identity", ""])
    elif r < 0.45:
        c.path = rng.choice(["/v1/traces", "/", "/v1/metrics/", "/v1//logs", "/%ff",
                             "/v1/metrics?x=1", "/" + "a" * 2000])
    elif r < 0.6:
        c.method = rng.choice(["GET", "PUT", "DELETE", "OPTIONS", "PATCH"])
    else:
        c.headers["authorization"] = rng.choice(["Bearer", "Bearer ", "Basic Zm9vOmJhcg==",
                                                 "Bearer " + "t" * 5000, "bearer x y z"])


def _gen_random(rng: random.Random, c: Case) -> None:
    c.body = rng.randbytes(rng.choice([0, 1, 7, 100, 5000]))
    if c.transport == "http" and rng.random() < 0.4:
        c.headers["content-type"] = JSON


#: name → (weight, generator). Valid pushes are interleaved so the server is seen working.
FAMILIES: dict[str, tuple[float, Callable[[random.Random, Case], None]]] = {
    "valid": (0.15, _gen_valid),
    "truncated": (0.12, _gen_truncated),
    "mutated": (0.15, _gen_mutated),
    "wire_types": (0.1, _gen_wire_types),
    "deep": (0.05, _gen_deep),
    "huge": (0.002, _gen_huge),
    "gzip_bomb": (0.005, _gen_bomb),
    "corrupt_gzip": (0.05, _gen_corrupt_gzip),
    "invalid_utf8": (0.06, _gen_utf8),
    "json_types": (0.1, _gen_json_types),
    "envelope": (0.12, _gen_envelope),
    "random": (0.073, _gen_random),
}


def make_case(rng: random.Random, transport: str | None = None,
              family: str | None = None) -> Case:
    """One hostile request of ``family`` (default: drawn by :data:`FAMILIES` weight) on
    ``transport`` (default: either)."""
    names = list(FAMILIES)
    if family is None:
        family = rng.choices(names, weights=[FAMILIES[n][0] for n in names])[0]
    c = Case(family=family, transport=transport or rng.choice(["http", "grpc"]),
             signal=rng.choice([METRICS, LOGS]), body=b"",
             headers={"content-type": PROTOBUF})
    FAMILIES[family][1](rng, c)
    if transport == "grpc":
        c.transport = "grpc"  # an HTTP-only family: its body still goes over gRPC
    return c
