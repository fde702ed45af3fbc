"""Generates the key reference of ``docs/configuration.md`` from the config models.

The reference is derived, never hand-written, so it cannot drift: a test compares the
committed document with :func:`render_reference`. Regenerate with
``python -m workers.configdoc > docs/configuration.md``.
"""

from __future__ import annotations

import ast
import inspect
import json
import sys
from pathlib import Path
from typing import Any, get_args, get_origin

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from workflows.config import AutorepairConfig

_INTRO = """# Configuration reference

One YAML file, `autorepair.yaml` (`autorepair --config FILE …` or `$AUTOREPAIR_CONFIG`),
loaded into pydantic models (`workflows/config.py`). Every key is optional; defaults follow
docs/design.md §5. Environment variables override the file: `AUTOREPAIR__SECTION__KEY=value`
(double underscores between path parts; values parsed as YAML, e.g.
`AUTOREPAIR__POLICY__CONSENT__AUTOMATIC_XIDS=[79]`). Unknown keys and bad values stop the
process at start with the field path and the value, e.g.
`threshold.k: Input should be greater than 0 (got -1)`.

Units: keys ending in `_s` are seconds, `_bytes` bytes, `_per_s` per second; fractions are
0..1. Numbers must be finite (YAML `.inf` / `.nan` are refused) and no `_s` key may exceed
ten years (315,360,000 s); "never" has keys of its own (`do_not_interrupt`,
`approval_timeout_s: null`).

Example: the demo's own config, as `autorepair up --demo` writes it to
`DATA_DIR/demo/autorepair.yaml` (generated from `workers.demo.demo_config`; `DATA_DIR`,
the emulator's system ids and the image server's port stand for what a run fills in):

```yaml
{example}```

This reference is generated from the models (`python -m workers.configdoc`).
"""


def demo_example() -> str:
    """The demo's config (:func:`workers.demo.demo_config`) as YAML, with placeholders
    for the paths, system ids and ports a run fills in."""
    import yaml

    from workers.demo import NODES, DemoTimings, demo_config

    data = Path("DATA_DIR/demo")
    cfg = demo_config(
        data / "slurm" / "slurm.conf", "http://127.0.0.1:8000",
        {n: f"<system id of {n}>" for n in NODES}, data / "bmc-credentials.yaml",
        DemoTimings(), image_url="http://127.0.0.1:<image port>/clean-node.iso",
        agent=".venv/bin/autorepair-agent (absolute path)")
    return yaml.safe_dump(cfg, sort_keys=False, width=88)


def first_paragraph(doc: str) -> str:
    """The first paragraph of a docstring on one line (its line breaks joined)."""
    return " ".join(doc.split("\n\n")[0].split())


def _field_comments(cls: type) -> dict[str, str]:
    """``#:`` comments written above each field in the class source and in its model base
    classes (a subclass's comment wins)."""
    out: dict[str, str] = {}
    for base in reversed(cls.__mro__):
        if isinstance(base, type) and issubclass(base, BaseModel) and base is not BaseModel:
            out.update(_own_comments(base))
    return out


def _own_comments(cls: type) -> dict[str, str]:
    """``#:`` comments written above each field in ``cls``'s own source."""
    try:
        source = inspect.getsource(cls)
    except (OSError, TypeError):
        return {}
    lines = source.splitlines()
    out: dict[str, str] = {}
    tree = ast.parse(inspect.cleandoc(source) if source.startswith(" ") else source)
    cls_node = tree.body[0]
    if not isinstance(cls_node, ast.ClassDef):
        return out
    offset = 0
    for stmt in cls_node.body:
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            comment: list[str] = []
            i = stmt.lineno - 2 + offset
            while i >= 0 and lines[i].strip().startswith("#:"):
                comment.insert(0, lines[i].strip()[2:].strip())
                i -= 1
            if comment:
                out[stmt.target.id] = " ".join(comment)
    return out


def _type_name(annotation: Any) -> str:
    origin = get_origin(annotation)
    if origin is None:
        if isinstance(annotation, type):
            return annotation.__name__
        return str(annotation).replace("typing.", "")
    args = ", ".join(_type_name(a) for a in get_args(annotation))
    name = getattr(origin, "__name__", str(origin))
    return f"{name}[{args}]"


def _default(field: FieldInfo) -> str:
    if field.default_factory is not None:
        try:
            value = field.default_factory()  # type: ignore[call-arg]
        except TypeError:
            return "(required)"
        if isinstance(value, BaseModel):
            return "(section)"
        return json.dumps(value, default=str)
    if field.is_required():
        return "(required)"
    value = field.default
    if hasattr(value, "value"):
        value = value.value
    return json.dumps(value, default=str)


def _walk(model: type[BaseModel], prefix: str, out: list[str]) -> None:
    comments = _field_comments(model)
    nested: list[tuple[str, type[BaseModel]]] = []
    doc = inspect.getdoc(model) or ""
    title = prefix or "(root)"
    out.append(f"\n## `{title}`\n\n{first_paragraph(doc)}\n")
    out.append("| key | type | default | meaning |")
    out.append("|---|---|---|---|")
    for name, field in model.model_fields.items():
        ann = field.annotation
        path = f"{prefix}.{name}" if prefix else name
        sub: type[BaseModel] | None = None
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            sub = ann
        else:
            for arg in get_args(ann):
                if isinstance(arg, type) and issubclass(arg, BaseModel):
                    sub = arg
        meaning = comments.get(name, "")
        if not meaning and sub is not None:
            meaning = first_paragraph(inspect.getdoc(sub) or "")
        out.append(f"| `{path}` | `{_type_name(ann)}` | `{_default(field)}` | {meaning} |")
        if sub is not None:
            origin = get_origin(ann)
            suffix = "[]" if origin is list else ".<key>" if origin is dict else ""
            nested.append((path + suffix, sub))
    for path, sub in nested:
        _walk(sub, path, out)


def render_reference() -> str:
    """The whole ``docs/configuration.md`` text."""
    out: list[str] = [_INTRO.replace("{example}", demo_example())]
    _walk(AutorepairConfig, "", out)
    return "\n".join(out).rstrip() + "\n"


def main() -> None:
    sys.stdout.write(render_reference())


if __name__ == "__main__":
    main()
