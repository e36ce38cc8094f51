"""Path rules: what tierec may read, write and delete.

tierec deletes or overwrites only files it wrote itself, inside its own
directory, recognised by name and by the manifest that lists them. A name read
from a manifest (a shard, a checkpoint file) must be a plain relative name:
absolute paths, ``..`` and hidden names are rejected, so a crafted manifest can
neither delete nor load a foreign file; ``member_path`` also refuses a name
that is a symbolic link or passes through one. An output never aliases an input.

>>> safe_member("train-00000.arrow", "m.json")
'train-00000.arrow'
>>> safe_member("../x.arrow", "m.json")
Traceback (most recent call last):
...
tierec.errors.ConfigError: m.json: refuses file name '../x.arrow' (a manifest may only name files inside its own directory)
>>> import tempfile; d = Path(tempfile.mkdtemp()); os.symlink("/etc/hostname", d / "link")
>>> member_path(d, "link", "meta.json")
Traceback (most recent call last):
...
tierec.errors.ConfigError: meta.json: refuses 'link': a symbolic link, or a name leading out of its directory (tierec reads only plain files inside it)
>>> overlaps("/data/a.txt", "/data/a.txt"), overlaps("/data/shards/t-0.arrow", "/data/shards"), overlaps("/a/b", "/a/c")
(True, True, False)
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from tierec.config import ConfigError

_PLAIN = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]*(/[A-Za-z0-9_][A-Za-z0-9_.+-]*)*")


def quote(value: object, limit: int = 80) -> str:
    """``repr`` of a value for a one-line message, cut to about ``limit`` characters."""
    if isinstance(value, (bytes, bytearray)):
        value = bytes(value[: limit * 4]).decode("utf-8", errors="replace")
    text = repr(value)
    return text if len(text) <= limit else f"{text[: limit - 3]}...({len(text):,} chars)"


def safe_member(name: object, where: str) -> str:
    """``name`` if it is a relative name under its manifest's directory (no ``..``, no absolute path)."""
    if not isinstance(name, str) or not _PLAIN.fullmatch(name) or ".." in name.split("/"):
        raise ConfigError(
            f"{where}: refuses file name {quote(name)} (a manifest may only name files inside its own directory)"
        )
    return name


def member_path(base: str | Path, name: object, where: str) -> Path:
    """``base/name`` for a name ``safe_member`` accepts that is no symbolic link, nor passes through one,
    so it resolves inside ``base`` (one-line ConfigError otherwise). The name need not exist."""
    name = safe_member(name, where)
    path = Path(base) / name
    if os.path.realpath(path) != os.path.join(os.path.realpath(base), *name.split("/")):
        raise ConfigError(f"{where}: refuses {quote(name)}: a symbolic link, or a name leading out of its "
                          "directory (tierec reads only plain files inside it)")
    return path


def _resolved(p: str | Path) -> Path:
    return Path(os.path.realpath(os.path.expanduser(str(p))))


def overlaps(a: str | Path, b: str | Path) -> bool:
    """Whether ``a`` and ``b`` are the same path, or one lies inside the other (symlinks resolved)."""
    ra, rb = _resolved(a), _resolved(b)
    return ra == rb or ra.is_relative_to(rb) or rb.is_relative_to(ra)


def check_no_alias(out: str | Path, inputs: list[str | Path], out_key: str, in_key: str) -> None:
    """Refuse an output that is, contains or lies inside one of ``inputs`` (one-line ConfigError)."""
    for inp in inputs:
        if inp and str(inp) != "synthetic" and overlaps(out, inp):
            raise ConfigError(f"{out_key} {out} would overwrite the input {in_key} {inp}; choose another output path")
