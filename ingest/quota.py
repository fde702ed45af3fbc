"""Per-identity bounds on sender-chosen values (issue 27, "by principle").

Every value a sender chooses that becomes ingest state — a node name outside the
inventory (a score-map slot, a node entry, an unreachable-tracker entry, a workflow), a
cohort (a score-map cohort and its gauges), an NCCL communicator (its op buffers), a
Prometheus label value (a series for the life of the process), and its share of the alert
hand-off queue — is bounded **per identity** (the verified credential,
:attr:`ingest.auth.Identity.id`), so one node token or collector credential cannot fill
the share every other sender uses: it cannot evict other nodes' state, take the global
label budget, fill the hand-off queue or inflate ``/metrics``.

The caps are ``ingest.limits.*`` (:class:`workflows.config.IngestLimitsConfig`). A value
beyond its identity's cap is refused: the point or record is rejected in the response's
``partial_success`` (reason code ``limit``), a label value maps to ``other``, and each
refusal is counted in ``autorepair_identity_limited_total{what}`` (``what`` one of
:data:`WHATS`: a bounded label). Without authentication there is no identity and no
per-identity bound (the global caps still apply).

Pure bookkeeping: no I/O, times are the caller's seconds. Not thread-safe (one event loop).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Mapping
from contextvars import ContextVar

UNKNOWN_NODE = "unknown_node"
COHORT = "cohort"
NCCL_COMMUNICATOR = "nccl_communicator"
LABEL_VALUE = "label_value"

QUEUED_ALERTS = "queued_alerts"
WHATS = (UNKNOWN_NODE, COHORT, NCCL_COMMUNICATOR, LABEL_VALUE, QUEUED_ALERTS)
"""What a per-identity cap bounds: the values of the ``what`` label of
``autorepair_identity_limited_total`` (``queued_alerts``: a push refused because its
identity's share of the alert hand-off queue was full, :mod:`ingest.handoff`)."""

SENDER: ContextVar[str | None] = ContextVar("ingest_sender", default=None)
"""Label of the identity whose push the current task handles (``None``: no identity,
authentication off, or outside a push). Set by ``Ingestor.handle_logs`` /
``handle_metrics``; read where a label value is admitted (:class:`ingest.metrics.LabelGuard`)
and where alerts are queued for hand-off (:class:`ingest.handoff.TemporalAlertSink`)."""
SENDER_IS_COLLECTOR: ContextVar[bool] = ContextVar("ingest_sender_collector", default=False)
"""True while the current push comes from a collector identity (its larger caps apply)."""


class SenderQuota:
    """Distinct values per (identity, what), each forgotten ``ttl_s`` after it was last
    seen.

    ``caps`` maps each ``what`` to ``(cap, ttl_s)``: at most ``cap`` distinct values held
    by one identity at once; ``ttl_s`` seconds without :meth:`admit` frees a value
    (``None``: held until :meth:`release`). ``refused`` counts refusals by ``what``.
    """

    def __init__(self, caps: Mapping[str, tuple[int, float | None]]) -> None:
        for what in caps:
            if what not in WHATS:
                raise ValueError(f"caps: {what!r} is not one of {', '.join(WHATS)}")
        self.caps = dict(caps)
        self._held: dict[tuple[str, str], OrderedDict[Hashable, float]] = {}
        self.refused: dict[str, int] = dict.fromkeys(WHATS, 0)

    def _values(self, owner: str, what: str, now: float) -> OrderedDict[Hashable, float]:
        key = (owner, what)
        vals = self._held.get(key)
        if vals is None:
            vals = self._held[key] = OrderedDict()
        ttl = self.caps[what][1]
        if ttl is not None:
            while vals:
                value, seen = next(iter(vals.items()))
                if now - seen <= ttl:
                    break
                del vals[value]
        return vals

    def admit(self, owner: str | None, what: str, value: Hashable, now: float) -> bool:
        """True when ``owner`` may hold ``value`` (already holds it, or is under its cap:
        then it holds it from now on); False (and counted) when over the cap. ``owner``
        ``None``: always True. Raises ``KeyError`` for a ``what`` without a cap."""
        if owner is None:
            return True
        cap = self.caps[what][0]
        vals = self._values(owner, what, now)
        if value in vals:
            vals[value] = now
            vals.move_to_end(value)
            return True
        if len(vals) >= cap:
            self.refused[what] += 1
            return False
        vals[value] = now
        return True

    def release(self, owner: str | None, what: str, value: Hashable) -> None:
        """Forget that ``owner`` holds ``value`` (its state is gone)."""
        if owner is None:
            return
        vals = self._held.get((owner, what))
        if vals is not None:
            vals.pop(value, None)

    def held(self, owner: str, what: str, now: float) -> int:
        """Distinct values ``owner`` holds now."""
        return len(self._values(owner, what, now))
