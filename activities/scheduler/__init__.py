"""Scheduler side of the repair: one interface (:class:`Scheduler`), Slurm and Kubernetes."""

from activities.scheduler.base import Heartbeat, Scheduler, scheduler_for

__all__ = ["Heartbeat", "Scheduler", "scheduler_for"]
