"""A griffe extension for the docs build: the docstrings' Sphinx roles (``:class:`~lcfed.x.Y```) become
Markdown code spans, cross-referenced when the target is one the API reference documents."""

from __future__ import annotations

import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:class|meth|func|mod|attr|data|exc|obj):`(~?)([\w.]+)(?:\(\))?`")


class SphinxRoles(griffe.Extension):
    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is None:
            return
        def sub(m: re.Match[str]) -> str:
            short, target = m.group(1), m.group(2)
            shown = target.rsplit(".", 1)[-1] if short else target
            return f"`{shown}`"
        obj.docstring.value = ROLE.sub(sub, obj.docstring.value)
