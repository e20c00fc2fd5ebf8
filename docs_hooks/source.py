"""Renders the package's own source into a docs page: a line ``<!-- source: causalqwen/losses.py::name -->`` becomes a
fenced Python block holding that function or class (``Class.method`` for a method) as the file has it now, so a page
that walks through the code can never drift from it. A name that is not found fails the build."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MARKER = re.compile(r"^<!-- source: (?P<file>[\w/]+\.py)::(?P<name>[\w.]+) -->$", re.MULTILINE)


def definition_source(file: str, qualified_name: str) -> str:
    """The source of ``qualified_name`` (a function, a class, or ``Class.method``) in ``file``, decorators included."""
    text = (ROOT / file).read_text(encoding="utf-8")
    scope: list[ast.stmt] = ast.parse(text).body
    node = None
    for part in qualified_name.split("."):
        node = next(
            (item for item in scope if isinstance(item, (ast.FunctionDef, ast.ClassDef)) and item.name == part), None
        )
        if node is None:
            raise ValueError(f"{file} has no definition {qualified_name!r}")
        scope = node.body
    lines = text.splitlines()
    start = min([node.lineno] + [decorator.lineno for decorator in node.decorator_list])
    body = lines[start - 1 : node.end_lineno]
    indent = min(len(line) - len(line.lstrip()) for line in body if line.strip())
    return "\n".join(line[indent:] for line in body)


def on_page_markdown(markdown: str, **kwargs) -> str:
    def rendered(match: re.Match) -> str:
        code = definition_source(match["file"], match["name"])
        return f'```python title="{match["file"]}"\n{code}\n```'

    return MARKER.sub(rendered, markdown)
