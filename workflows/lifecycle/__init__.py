"""Pure lifecycle state machines (issue 26): ``step(state, event, now) -> (state, commands)``.

No I/O and no Temporal imports here: the workflows turn what Temporal delivers into
events, call ``step`` and execute the commands; ``tests/model/`` checks the machines
exhaustively. Interpreted by their workflows: :mod:`workflows.lifecycle.machine_action`
(one machine action of a repair: power cycle, reboot, GPU reset, reprovision; run by
``RepairWorkflow._machine_action``), :mod:`workflows.lifecycle.guard` (the cluster guard:
leases, queue, circuit breaker, rebuild from the ledger; ``ClusterGuardWorkflow``) and
:mod:`workflows.lifecycle.node` (the node entity; ``NodeWorkflow``). Model-checked but not
yet interpreted: :mod:`workflows.lifecycle.repair` (the whole repair; ``RepairWorkflow``
still sequences its stages in its own code, but decides with the machine's functions:
the machine action, and :mod:`workflows.lifecycle.decision` for the ladder / gate / cap
decision, approval coverage, recurrence and what keeps a node cordoned).
:mod:`workflows.lifecycle.trace` records what ``step`` commanded, for the fidelity check.
"""
