"""A griffe extension that makes specframe's reST-flavoured docstrings read well on the Markdown site.

The source docstrings use Sphinx roles (``:class:`~specframe.plan.CallPlan```) and ``Example::`` literal
block markers, which mkdocstrings would print verbatim. Once the whole package is loaded, this extension
rewrites every docstring in memory (the source files are untouched):

* a role whose target resolves to a public object of the package becomes a cross-reference
  ``[CallPlan][specframe.plan.CallPlan]`` (``~`` keeps only the last name, as in Sphinx);
* any other role (a private helper, another library) becomes inline code;
* a paragraph ending in ``::`` ends in ``:`` instead (the indented block after it is already code).

mkdocs.yml loads it with ``extensions: [docs/griffe_sphinx_roles.py]``.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:class|func|data|mod|meth|attr|exc|obj):`(?P<target>[^`]+)`")


class SphinxRoles(griffe.Extension):
    """Rewrite roles and ``::`` markers in every docstring of a loaded package."""

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        """Rewrite the docstrings of ``pkg`` and everything it contains."""
        for obj in _walk(pkg):
            if obj.docstring is not None:
                obj.docstring.value = rewrite(obj.docstring.value, obj, pkg)


def _walk(obj: griffe.Object):
    seen: set[str] = set()
    stack = [obj]
    while stack:
        current = stack.pop()
        if current.path in seen:
            continue
        seen.add(current.path)
        yield current
        for member in current.members.values():
            if not member.is_alias:
                stack.append(member)


def rewrite(text: str, scope: griffe.Object, pkg: griffe.Module) -> str:
    """The docstring ``text`` with roles turned into links or code and ``::`` markers into colons."""

    def replace(match: re.Match[str]) -> str:
        target = match.group("target")
        short = target.startswith("~")
        name = target.lstrip("~.")
        shown = name.rsplit(".", 1)[-1] if short else name
        path = _resolve(name, scope, pkg)
        return f"[`{shown}`][{path}]" if path else f"`{shown}`"

    text = ROLE.sub(replace, text)
    text = re.sub(r"(\S)::[ \t]*$", r"\1:", text, flags=re.MULTILINE)
    return re.sub(r"^[ \t]*::[ \t]*$", "", text, flags=re.MULTILINE)


def _resolve(name: str, scope: griffe.Object, pkg: griffe.Module) -> str | None:
    """The canonical path of a public object of ``pkg`` that ``name`` names from ``scope``, if any."""
    candidates = []
    try:
        candidates.append(scope.resolve(name.split(".")[0]) + name[len(name.split(".")[0]) :])
    except Exception:  # griffe raises NameResolutionError (and others for odd scopes)
        pass
    candidates.append(name)
    for candidate in candidates:
        if not candidate.startswith(pkg.path + ".") and candidate != pkg.path:
            continue
        try:
            obj = pkg.modules_collection[candidate]
        except Exception:
            continue
        if obj.is_alias:
            try:
                obj = obj.final_target
            except Exception:
                continue
        if any(part.startswith("_") for part in obj.path.split(".")):
            return None
        return obj.path
    return None
