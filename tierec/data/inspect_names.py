"""What column names say to ``tierec inspect``: names split into words, and the words of counts.

>>> words("userID"), words("play-count"), bool(COUNT_NAMES.search(joined_words("play-count")))
(['user', 'id'], ['play', 'count'], True)
"""

from __future__ import annotations

import re

COUNT_NAMES = re.compile(r"(^|_)(cnt|count|counts|weight|plays|playcount|play_count|times|freq|frequency|clicks|views|uses)$", re.I)
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")  # movieId -> movie_Id, ItemID -> Item_ID


def joined_words(name: str) -> str:
    """``name`` with its words joined by ``_`` (camel case, ``-`` and spaces split): ``movieId`` -> ``movie_Id``."""
    return _CAMEL.sub("_", name.strip()).replace("-", "_").replace(" ", "_")


def words(name: str) -> list[str]:
    """The lower-case words of a column name."""
    return [w for w in joined_words(name).lower().split("_") if w]
