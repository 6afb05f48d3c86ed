"""MkDocs hooks (mkdocs.yml): pages and files made when the site is built, so nothing is written twice.

- reference/configuration.md comes from the one Config (surprisegate.config_reference).
- index.md is the README, its links made relative to docs/ (the README links into docs/ for GitHub's view).
- figures/PATH is results/PATH: the plots the result pages show stay where the runs wrote them.
"""

from __future__ import annotations

import re
from pathlib import Path

from mkdocs.structure.files import File, Files

from surprisegate.config_reference import reference_markdown

ROOT = Path(__file__).resolve().parents[1]


def readme_as_index(readme: str) -> str:
    """The README with its links into docs/ made relative to the site's root."""
    return re.sub(r"\]\(docs/", "](", readme)


def on_files(files: Files, config) -> Files:
    files.append(File.generated(config, "index.md", content=readme_as_index((ROOT / "README.md").read_text())))
    files.append(File.generated(config, "reference/configuration.md", content=reference_markdown()))
    for png in sorted((ROOT / "results").rglob("*.png")):
        uri = "figures/" + png.relative_to(ROOT / "results").as_posix()
        files.append(File.generated(config, uri, abs_src_path=str(png)))
    return files
