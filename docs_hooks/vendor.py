"""MkDocs hook: put the npm-vendored front-end assets (KaTeX, mermaid) into the site.

The assets are not committed: ``npm ci`` installs the versions pinned in ``package-lock.json`` into
``node_modules/``, and this hook adds the few files the pages load to the build, under
``assets/vendor/``. It runs for ``mkdocs build`` and ``mkdocs serve`` alike, and fails the build with a
clear message if ``npm ci`` has not been run.
"""

from __future__ import annotations

from pathlib import Path

from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parent.parent
NODE_MODULES = ROOT / "node_modules"

# (file or folder under node_modules, destination under the site)
VENDORED = [
    ("katex/dist/katex.min.js", "assets/vendor/katex/katex.min.js"),
    ("katex/dist/katex.min.css", "assets/vendor/katex/katex.min.css"),
    ("katex/dist/fonts", "assets/vendor/katex/fonts"),
    ("mermaid/dist/mermaid.min.js", "assets/vendor/mermaid/mermaid.min.js"),
]


def _vendored_files() -> list[tuple[Path, str]]:
    pairs = []
    for source, destination in VENDORED:
        path = NODE_MODULES / source
        if not path.exists():
            raise PluginError(f"vendored docs asset {path} is missing: run `npm ci` in {ROOT} first (`make docs` does)")
        if path.is_dir():
            for child in sorted(path.iterdir()):
                if child.is_file():
                    pairs.append((child, f"{destination}/{child.name}"))
        else:
            pairs.append((path, destination))
    return pairs


def on_files(files: Files, config) -> Files:
    for source, destination in _vendored_files():
        files.append(File.generated(config, destination, abs_src_path=str(source)))
    return files
