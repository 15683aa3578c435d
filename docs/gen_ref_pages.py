"""Generate one API reference page per module of ``src/specframe`` (run by mkdocs-gen-files at build time).

Each page holds a single mkdocstrings directive, so the reference is always the source's own docstrings;
``reference/SUMMARY.md`` lists the pages for mkdocs-literate-nav.
"""

from __future__ import annotations

from pathlib import Path

import mkdocs_gen_files

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "src"


def module_pages(source: Path = SOURCE) -> list[tuple[tuple[str, ...], Path]]:
    """Every public module under ``source`` as (dotted-name parts, reference page path), sorted."""
    pages = []
    for path in sorted(source.rglob("*.py")):
        parts = tuple(path.relative_to(source).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
            page = Path(*parts, "index.md")
        else:
            page = Path(*parts).with_suffix(".md")
        if any(part.startswith("_") for part in parts) or parts[-1] == "__main__":
            continue
        pages.append((parts, page))
    return pages


def main() -> None:
    """Write the pages and the navigation file into the virtual docs folder."""
    nav = mkdocs_gen_files.Nav()
    for parts, page in module_pages():
        nav[parts] = page.as_posix()
        with mkdocs_gen_files.open(Path("reference", page), "w") as handle:
            handle.write(f"::: {'.'.join(parts)}\n")
        source = Path("src", *parts, "__init__.py") if page.name == "index.md" else Path("src", *parts)
        if page.name != "index.md":
            source = source.with_suffix(".py")
        mkdocs_gen_files.set_edit_path(Path("reference", page), Path("..", source))
    with mkdocs_gen_files.open("reference/SUMMARY.md", "w") as handle:
        handle.writelines(nav.build_literate_nav())


main()
