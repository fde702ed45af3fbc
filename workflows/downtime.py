"""Downtime and cost of one repair, from its recorded stage transitions (pure).

A repair takes a node out of service from its ``cordoning`` transition until the node is
back: the ``running`` transition (node back in service, docs/design.md §4.4) or, when it never
got there, the repair's terminal transition (a node left cordoned after ``failed`` /
``timed_out`` keeps costing, but from then on it is a person's work, not this repair's).
Of that time, the ``waiting_for_idle`` stretches are the part spent waiting for the
workload to finish (the node still runs its job, but takes no new work); the rest is out
of service. A repair that never cordoned (rejected, resolved before approval) lost
nothing.

GPU-hours = GPUs of the node × hours; cost = GPU-hours × hourly rate of one GPU
(``providers`` in config; unknown rate → cost ``None``).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from pydantic import BaseModel

from workflows.models import TERMINAL_STAGES, Stage
from workflows.providers import ProviderInfo

_HOUR_S = 3600.0


class Downtime(BaseModel):
    """Downtime of one finished repair. Times in seconds, GPU-hours in GPU × hours, cost
    in ``currency`` (``None`` when no hourly rate is known)."""

    gpus: int
    cordoned_at: datetime | None = None
    rejoined_at: datetime | None = None
    duration_s: float = 0.0
    idle_wait_s: float = 0.0
    out_of_service_s: float = 0.0
    gpu_hours: float = 0.0
    idle_wait_gpu_hours: float = 0.0
    out_of_service_gpu_hours: float = 0.0
    hourly_rate: float | None = None
    cost: float | None = None
    currency: str = "USD"
    provider: str | None = None
    region: str | None = None
    gpu_type: str | None = None


def compute_downtime(
    transitions: Iterable[tuple[str | Stage, datetime]], info: ProviderInfo
) -> Downtime | None:
    """Downtime of a repair from its ``(stage, at)`` transitions in recorded order (notes
    repeat the current stage). ``None`` while the repair has not reached a terminal stage.

    Unknown stage names are skipped; out-of-order times are sorted (stable), never raised.
    """
    seq: list[tuple[str, datetime]] = []
    for stage, at in transitions:
        seq.append((str(stage.value if isinstance(stage, Stage) else stage), at))
    seq.sort(key=lambda x: x[1])
    terminal = {s.value for s in TERMINAL_STAGES}
    end_at = next((at for st, at in seq if st in terminal), None)
    base = Downtime(gpus=info.gpus_per_node, hourly_rate=info.hourly_rate,
                    currency=info.currency, provider=info.provider, region=info.region,
                    gpu_type=info.gpu_type)
    if end_at is None:
        return None
    cordoned = next((at for st, at in seq if st == Stage.cordoning.value and at <= end_at),
                    None)
    if cordoned is None:
        return base.model_copy(update={"cost": 0.0 if info.hourly_rate is not None else None})
    back = next((at for st, at in seq if st == Stage.running.value and cordoned <= at <= end_at),
                end_at)
    idle = 0.0
    current: str | None = None
    since: datetime | None = None
    for st, at in seq:
        if at > back:
            break
        if st == current:
            continue  # a note: same stage
        if current == Stage.waiting_for_idle.value and since is not None:
            idle += (at - since).total_seconds()
        current, since = st, at
    if current == Stage.waiting_for_idle.value and since is not None:
        idle += (back - since).total_seconds()
    total = max((back - cordoned).total_seconds(), 0.0)
    idle = min(max(idle, 0.0), total)
    gpus = info.gpus_per_node
    gpu_h = gpus * total / _HOUR_S
    return base.model_copy(update={
        "cordoned_at": cordoned, "rejoined_at": back, "duration_s": total,
        "idle_wait_s": idle, "out_of_service_s": total - idle, "gpu_hours": gpu_h,
        "idle_wait_gpu_hours": gpus * idle / _HOUR_S,
        "out_of_service_gpu_hours": gpus * (total - idle) / _HOUR_S,
        "cost": None if info.hourly_rate is None else gpu_h * info.hourly_rate,
    })
