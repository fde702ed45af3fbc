"""Pure lifecycle state machines (issue 26): ``step(state, event, now) -> (state, commands)``.

No I/O and no Temporal imports here: the workflows turn what Temporal delivers into
events, call ``step`` and execute the commands; ``tests/model/`` checks the machines
exhaustively. So far: :mod:`workflows.lifecycle.machine_action` (one machine action of a
repair: power cycle, reboot, GPU reset, reprovision) and :mod:`workflows.lifecycle.guard`
(the cluster guard: leases, queue, circuit breaker, rebuild from the ledger), both
interpreted by their workflows, and :mod:`workflows.lifecycle.node` (the node entity's
lifecycle; model-checked, not yet wired into ``NodeWorkflow``).
"""
