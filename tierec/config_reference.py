"""docs/config.md, made from the config dataclasses: every key, its type, its default and its comment.

The page is generated, never edited by hand: ``python -m tierec.config_reference > docs/config.md``;
tests/test_config_reference.py fails when the page and the code disagree. A key's text is the
comment on its line in tierec/config.py (tierec/data_config.py for [data]), or the comment lines just above it.

>>> from tierec.config_reference import render
>>> "| `train.batch_size` |" in render()
True
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import math
import typing
from typing import Any

from tierec import config as config_module
from tierec.config import Config

HEADER = """# Config reference

Every key of a tierec config, by section: its type, its default and what it does. A config is TOML
(`--config FILE`, several merge in order); `--set section.key=value` overrides one key. This page is
generated from `tierec/config.py` and `tierec/data_config.py` (`python -m tierec.config_reference > docs/config.md`); a test keeps
it current.
"""


def _comments(cls: type) -> dict[str, str]:
    """Each field's comment: the one on its line, else the comment lines just above it."""
    source, start = inspect.getsourcelines(cls)
    lines = [line.rstrip("\n") for line in source]
    tree = ast.parse(inspect.getsource(cls))
    out: dict[str, str] = {}
    body = tree.body[0].body  # type: ignore[attr-defined]
    for node in body:
        if not isinstance(node, ast.AnnAssign) or not isinstance(node.target, ast.Name):
            continue
        line = lines[node.lineno - 1]
        text = ""
        if "#" in line.split("=", 1)[-1]:
            text = line.split("=", 1)[-1].split("#", 1)[1].strip()
        else:
            above = []
            i = node.lineno - 2
            while i >= 0 and lines[i].strip().startswith("#"):
                above.insert(0, lines[i].strip().lstrip("#").strip())
                i -= 1
            text = " ".join(above)
        out[node.target.id] = text
    return out


def _type_name(hint: Any) -> str:
    if typing.get_origin(hint) in (list, typing.List):
        return f"list of {_type_name(typing.get_args(hint)[0])}"
    if typing.get_args(hint) and type(hint).__name__ in ("UnionType", "_UnionGenericAlias"):
        return " or ".join(_type_name(a) for a in typing.get_args(hint))
    return getattr(hint, "__name__", str(hint))


def _default(f: dataclasses.Field) -> str:
    if f.default is not dataclasses.MISSING:
        value = f.default
    elif f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        value = f.default_factory()  # type: ignore[misc]
    else:
        return "(required)"
    if isinstance(value, float) and math.isnan(value):
        return "unset (nan)"
    if hasattr(value, "value"):  # an enum
        value = value.value
    if isinstance(value, str):
        return f'`"{value}"`'
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    return f"`{value!r}`"


def _section(cls: type, prefix: str, out: list[str]) -> None:
    hints = typing.get_type_hints(cls, vars(config_module))
    comments = _comments(cls)
    doc = cls.__doc__ if cls.__doc__ and not cls.__doc__.startswith(f"{cls.__name__}(") else ""  # not the generated one
    doc = inspect.cleandoc(doc)
    rows, nested = [], []
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        if dataclasses.is_dataclass(hint):
            nested.append((hint, f"{prefix}{f.name}."))
            continue
        item = typing.get_args(hint)[0] if typing.get_origin(hint) is list else None
        if item is not None and dataclasses.is_dataclass(item):  # [[section.key]] entries
            nested.append((item, f"{prefix}{f.name}[]."))
        key = f"{prefix}{f.name}"
        text = comments.get(f.name, "").replace("|", "\\|")
        rows.append(f"| `{key}` | {_type_name(hint)} | {_default(f).replace('|', chr(92) + '|')} | {text} |")
    title = prefix.rstrip(".")
    heading = f"## `[[{title[:-2]}]]` entries" if title.endswith("[]") else f"## `[{title}]`"
    out += [heading if prefix else "## Top level", ""]
    if doc:
        out += [doc.split("\n\n")[0].replace("\n", " "), ""]
    if rows:
        out += ["| key | type | default | meaning |", "|---|---|---|---|", *rows, ""]
    for hint, p in nested:
        _section(hint, p, out)


def render() -> str:
    out = [HEADER]
    _section(Config, "", out)
    return "\n".join(out).rstrip("\n") + "\n"


if __name__ == "__main__":
    print(render(), end="")
