"""Repairs that the platform did not detect itself: an operator's, an HTTP detector's, a
Kubernetes node annotation's.

* :mod:`workers.repairs.intake`: :class:`~workers.repairs.intake.RepairIntake`, the one
  way in (idempotent create, detector cap, remove human-only, decisions).
* :mod:`workers.repairs.models`: request and response bodies.
* :mod:`workers.repairs.auth`: API tokens, principals and roles.
* :mod:`workers.repairs.router`: the HTTP API ``/api/v1/repairs`` over the intake.

The watchers (:mod:`workers.watchers`) use the intake directly, not the HTTP module.
"""
