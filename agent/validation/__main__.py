"""``python -m agent.validation [--json]`` (same as ``autorepair-agent validate``)."""

from agent.validation.cli import main

main()
