"""The worker compiles the workflows package once when bytecode writing is off, so the
workflow sandbox's per-instance imports read bytecode instead of compiling source."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

import workflows.node
from workers.worker import precompile_workflow_modules


@pytest.fixture
def restore_sys(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "pycache_prefix", sys.pycache_prefix)
    monkeypatch.setattr(sys, "dont_write_bytecode", sys.dont_write_bytecode)


def test_bytecode_in_a_private_prefix_when_writing_is_off(restore_sys: None) -> None:
    sys.dont_write_bytecode = True
    sys.pycache_prefix = None
    prefix = precompile_workflow_modules()
    assert prefix is not None and sys.pycache_prefix == prefix
    assert sys.dont_write_bytecode is True  # the operator's choice is kept for everything else
    pyc = Path(importlib.util.cache_from_source(workflows.node.__file__))
    assert pyc.is_file() and str(pyc).startswith(prefix)
    beside = Path(workflows.node.__file__).parent / "__pycache__" / pyc.name
    assert not beside.exists()  # the source tree stays untouched


def test_nothing_to_do_when_bytecode_is_written_or_a_prefix_is_set(restore_sys: None) -> None:
    sys.dont_write_bytecode = False
    assert precompile_workflow_modules() is None
    sys.dont_write_bytecode = True
    sys.pycache_prefix = "/somewhere/chosen"
    assert precompile_workflow_modules() is None and sys.pycache_prefix == "/somewhere/chosen"
