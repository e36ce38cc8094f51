"""``tierec inspect`` on a log without labels: propose sampled negatives (``data.negatives``) for its user and item.

A file with no 0/1, rating or scale column is a log of uses, plays or purchases:
every row is a positive. When it has a column named like a user and one named like
an item (``user``, ``userID``, ``customer_id``; ``item``, ``artistID``, ``ProductId``,
``song``), or, without a header, two id columns first, :func:`propose_negatives`
proposes ``data.negatives`` for them (a :class:`NegativesProposal`, which the
report takes); a count column (times used, plays) is then left out (its value
belongs to the positive row and its negatives would copy it), and a categorical
column with one value per item in the sample (an app's price class) is proposed
as an item feature (a negative takes its own item's value).

>>> words("userID"), user_like("customer_id"), item_like("ProductId"), item_like("user")
(['user', 'id'], True, True, False)
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from tierec.data.inspect_names import COUNT_NAMES, joined_words, words

if TYPE_CHECKING:
    from tierec.data.inspect import ColumnReport

NEGATIVES = 2  # proposed per positive (the Frappe benchmarks' choice)
ATTRIBUTE_MIN_ITEMS = 20  # items seen at least twice that must each show one value for a column to be the item's
_USER_WORDS = {"user", "users", "userid", "uid", "customer", "customerid", "member", "visitor", "listener", "reader",
               "account", "client", "buyer", "player", "viewer", "person", "subscriber"}
_ITEM_WORDS = {"item", "items", "itemid", "iid", "movie", "movieid", "product", "productid", "artist", "artistid", "song",
               "track", "app", "book", "isbn", "asin", "video", "game", "business", "article", "news", "restaurant",
               "recipe", "joke", "anime", "show", "photo", "post", "venue", "poi", "course", "job", "hotel", "listing"}


def user_like(name: str) -> bool:
    return bool(set(words(name)) & _USER_WORDS)


def item_like(name: str) -> bool:
    return bool(set(words(name)) & _ITEM_WORDS) and not user_like(name)


@dataclass(frozen=True)
class NegativesProposal:
    user: str  # data.user_column
    item: str  # data.item_column
    reason: str  # why those two
    item_features: tuple[str, ...] = ()  # columns with one value per item in the sample
    counts: dict[str, str] = field(default_factory=dict)  # count columns to leave out -> why


def propose_negatives(columns: list[ColumnReport], header: bool, cols: dict[str, list[str | None]]) -> NegativesProposal | None:
    """Sampled negatives for a log whose ``columns`` have their roles (no label among them), or None (see above)."""
    ids = [c for c in columns if c.role == "categorical"]
    users = [c for c in ids if user_like(c.name)]
    items = [c for c in ids if item_like(c.name)]
    if users and items:
        user, item, why = users[0], items[0], "named like a user and an item"
    elif not header and len(ids) >= 2 and [c.name for c in ids[:2]] == [c.name for c in columns[:2]]:
        user, item, why = ids[0], ids[1], "no header: the first two id columns, as logs usually begin (user, item)"
    else:
        return None
    features = tuple(c.name for c in ids if c.name not in (user.name, item.name) and _one_per_item(cols.get(c.name), cols.get(item.name)))
    counts = {c.name: _count_reason(c) for c in columns
              if c.role == "numeric" and c.integers == c.numbers and c.low >= 0 and COUNT_NAMES.search(joined_words(c.name))}
    return NegativesProposal(user.name, item.name, why, features, counts)


def _count_reason(c: ColumnReport) -> str:
    return (f"counts ({c.low:g}..{c.high:g}) of the row's uses: a negative would copy its positive's; to learn heavy "
            f"against light uses instead, set data.negatives = 0 and label = {c.name!r} with a label_threshold")


def _one_per_item(values: list[str | None] | None, items: list[str | None] | None) -> bool:
    """Whether every item seen at least twice has one value of the column, and the values are not all one."""
    if not values or not items:
        return False
    per_item: dict[str, set[str | None]] = {}
    rows: Counter[str] = Counter()
    for item, v in zip(items, values):
        if item:
            per_item.setdefault(item, set()).add(v)
            rows[item] += 1
    repeated = [per_item[i] for i, n in rows.items() if n >= 2]
    distinct = {v for s in per_item.values() for v in s}
    return len(repeated) >= ATTRIBUTE_MIN_ITEMS and len(distinct) >= 2 and all(len(s) == 1 for s in repeated)
