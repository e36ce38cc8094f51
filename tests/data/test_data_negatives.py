"""Sampled negatives for implicit feedback (`data.negatives`): never a user's own item, K per positive, the same
test set for the same seed, training negatives per epoch and exact on resume, popularity frequencies, item
features, labels refused or kept, and the errors."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from tierec.config import ConfigError, DataConfig, SchemaConfig, load_config
from tierec.data import DataError, open_dataset, open_source
from tierec.data.blocks import RowBlock
from tierec.data.interactions import ColumnRoles, Interactions
from tierec.data.negatives import NegativeSampler, NegativeSpec
from tierec.data.order import Shuffle

COLUMNS = ["user", "item", "hour", "tier"]  # tier: an attribute of the item (one value per item)


def write_log(path: Path, rows: int = 3000, users: int = 120, items: int = 60, seed: int = 0) -> Path:
    """A log of uses: each user prefers one group of items; `tier` is item // 10 (an item feature)."""
    rng = np.random.default_rng(seed)
    u = rng.integers(0, users, rows)
    group = u % 3
    i = np.where(rng.random(rows) < 0.8, group * (items // 3) + rng.integers(0, items // 3, rows), rng.integers(0, items, rows))
    lines = ["user,item,hour,tier"] + [f"u{a},i{b},h{rng.integers(0, 24)},t{b // 10}" for a, b in zip(u, i)]
    path.write_text("\n".join(lines) + "\n")
    return path


def config(path: Path, **over) -> DataConfig:
    base = dict(source=str(path), schema=SchemaConfig(categorical=COLUMNS), test_rows=500, negatives=3,
                user_column="user", item_column="item")
    return DataConfig(**{**base, **over})


def blocks(cfg: DataConfig, split: str, batch: int = 256, **kw) -> list[RowBlock]:
    return list(open_dataset(cfg).source(split, batch, **kw).row_blocks())


def joined(bs: list[RowBlock]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """labels [n], ids [n, 4] (user, item, hour, tier), file rows [n], in order."""
    labels = np.concatenate([b.labels for b in bs])
    ids = np.concatenate([np.stack([b.feature(f)[0] for f in range(4)], axis=1) for b in bs])
    return labels, ids, np.concatenate([b.rows for b in bs]), ids[:, :2]


def plain_pairs(cfg: DataConfig, split: str) -> set[tuple[int, int]]:
    """The (user, item) ids of a split's rows, read without negatives (not through the sampler's own pass)."""
    src = open_source(dataclasses.replace(cfg, negatives=0), split, 1024, label_optional=True)
    return {(int(u), int(i)) for b in src.row_blocks() for u, i in zip(b.feature(0)[0], b.feature(1)[0])}


def test_every_positive_is_followed_by_k_negatives_of_the_same_user_and_context(tmp_path: Path) -> None:
    cfg = config(write_log(tmp_path / "log.csv"))
    labels, ids, rows, _ = joined(blocks(cfg, "test"))
    assert labels.size == 500 * 4 and open_dataset(cfg).source("test", 256).num_rows == 2000
    assert labels.reshape(500, 4).tolist() == [[1.0, 0.0, 0.0, 0.0]] * 500
    groups = ids.reshape(500, 4, 4)  # [positive, its row and its 3 negatives, feature]
    assert (groups[:, :, 0] == groups[:, :1, 0]).all() and (groups[:, :, 2] == groups[:, :1, 2]).all()  # user, hour
    assert (rows.reshape(500, 4) == rows.reshape(500, 4)[:, :1]).all() and rows[::4].tolist() == list(range(2500, 3000))
    assert (groups[:, 1:, 1] != groups[:, :1, 1]).all()  # a negative's item is never the positive's


def test_negatives_are_never_an_item_the_user_has(tmp_path: Path) -> None:
    cfg = config(write_log(tmp_path / "log.csv"), negative_sampling="popularity")
    train, test = plain_pairs(cfg, "train"), plain_pairs(cfg, "test")
    train_items = {i for _, i in train}
    for epoch in (0, 1):
        labels, _, _, pairs = joined(blocks(cfg, "train", shuffle=Shuffle(0, epoch, 512, 256), epoch=epoch))
        negatives = {(int(u), int(i)) for u, i in pairs[labels == 0]}
        assert len(negatives) > 1000 and not negatives & train and {i for _, i in negatives} <= train_items
    labels, _, _, pairs = joined(blocks(cfg, "test"))
    negatives = {(int(u), int(i)) for u, i in pairs[labels == 0]}
    assert not negatives & (train | test) and {i for _, i in negatives} <= train_items | {i for _, i in test}


def test_items_first_used_in_the_test_split_are_test_negatives_too(tmp_path: Path) -> None:
    """Test negatives come from the items of training and the test split: an item used only in the test split is a
    negative there as often as any other (uniform draws), never in training, never for a user who has it, and with
    its own item features; drawn from training items alone, every test row of such an item would be a positive."""
    path = write_log(tmp_path / "log.csv")
    lines = path.read_text().splitlines()
    rng = np.random.default_rng(4)
    for r in rng.choice(np.arange(2501, 3001), 100, replace=False):  # the test rows (the last 500): 20 new items
        n = int(rng.integers(0, 20))
        lines[r] = f"u{rng.integers(0, 120)},new{n},h0,n{n // 10}"
    path.write_text("\n".join(lines) + "\n")
    cfg = config(path, item_features=["tier"])
    test = plain_pairs(cfg, "test")
    train_items = {i for _, i in plain_pairs(cfg, "train")}
    new_items = {i for _, i in test} - train_items
    assert len(new_items) == 20
    labels, ids, _, pairs = joined(blocks(cfg, "test"))
    negative = labels == 0
    is_new = np.isin(ids[:, 1], list(new_items))
    share = is_new[negative].mean()  # uniform over 60 + 20 items: 1/4 of the negatives, where none were before
    assert abs(share - 20 / 80) < 0.05, share
    assert not {(int(u), int(i)) for u, i in pairs[negative]} & test
    tier_of = {int(i): int(t) for i, t in zip(ids[labels == 1, 1], ids[labels == 1, 3])}
    assert all(tier_of[int(i)] == int(t) for i, t in ids[negative & is_new][:, [1, 3]])
    train_labels, train_ids, _, _ = joined(blocks(cfg, "train", epoch=0))
    assert not np.isin(train_ids[train_labels == 0, 1], list(new_items)).any()


def test_the_test_set_is_fixed_by_the_seed_and_training_negatives_change_by_epoch(tmp_path: Path) -> None:
    cfg = config(write_log(tmp_path / "log.csv"))
    a = joined(blocks(cfg, "test", 256))
    b = joined(blocks(cfg, "test", 96))  # another run, another batch size (another model's size-chosen batch)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    other = joined(blocks(dataclasses.replace(cfg, negative_seed=1), "test"))
    assert np.array_equal(a[0], other[0]) and not np.array_equal(a[1], other[1])
    # training: an epoch is a pure function of (seed, epoch), so a resumed pass is the tail of the full one
    shuffle = Shuffle(5, 1, 512, 256)
    full = joined(blocks(cfg, "train", 128, shuffle=shuffle, epoch=1))
    resumed = joined(blocks(cfg, "train", 128, shuffle=shuffle, epoch=1, start_batch=7))
    assert all(np.array_equal(x[7 * 128 :], y) for x, y in zip(full, resumed))
    unshuffled = joined(blocks(cfg, "train", 128, epoch=1))
    assert all(np.array_equal(x[5 * 128 :], y) for x, y in zip(unshuffled, joined(blocks(cfg, "train", 128, epoch=1, start_batch=5))))
    epoch0 = joined(blocks(cfg, "train", 128, epoch=0))
    same_rows = np.array_equal(epoch0[0], unshuffled[0]) and np.array_equal(epoch0[2], unshuffled[2])
    assert same_rows and (epoch0[1][:, 1] != unshuffled[1][:, 1]).mean() > 0.5  # new items for most negatives


def test_popularity_sampling_draws_items_as_often_as_they_are_used(tmp_path: Path) -> None:
    counts = np.array([1, 2, 4, 8, 16, 32, 64, 128, 256, 512])
    items = np.repeat(np.arange(100, 110), counts)
    users = np.where(items == 109, 7, 1000 + np.arange(items.size))  # user 7 has item 109 (the most used)
    blk = RowBlock.from_ids(np.ones(items.size, np.float32), np.zeros((items.size, 0), np.float32), np.stack([users, items]))
    roles = ColumnRoles(user=0, item=1)
    seen = Interactions.scan([blk], roles)
    assert seen.items.tolist() == list(range(100, 110)) and seen.counts.tolist() == counts.tolist()
    n = 200_000
    rows, which = np.arange(n, dtype=np.int64), np.zeros(n, np.int64)

    def frequencies(popularity: bool, user: int) -> np.ndarray:
        sampler = NegativeSampler(NegativeSpec(1, popularity, roles), seen, None, salt=11)
        return np.bincount(sampler.draw(np.full(n, user), rows, which), minlength=10) / n

    def within(freq: np.ndarray, p: np.ndarray) -> bool:  # every item within 4.5 standard deviations of a binomial
        return bool(np.all(np.abs(freq - p) <= 4.5 * np.sqrt(p * (1 - p) / n) + 1e-12))

    p = counts / counts.sum()
    assert within(frequencies(True, user=5), p)
    assert not within(frequencies(False, user=5), p)  # the bound tells uniform from popularity apart
    assert within(frequencies(False, user=5), np.full(10, 0.1))
    q = np.append(counts[:-1], 0) / counts[:-1].sum()  # user 7 has item 109: the rest, in proportion
    assert within(frequencies(True, user=7), q)


def test_a_user_with_every_item_gets_no_negatives_and_the_others_their_k(tmp_path: Path) -> None:
    path = tmp_path / "log.csv"
    path.write_text("user,item\n" + "".join(f"all,i{j}\n" for j in range(20)) + "".join(f"u{j},i{j}\n" for j in range(20)) + "all,i3\nu5,i5\n")
    cfg = DataConfig(source=str(path), schema=SchemaConfig(categorical=["user", "item"]), test_rows=2, negatives=4,
                     user_column="user", item_column="item")
    labels = np.concatenate([b.labels for b in blocks(cfg, "test")])
    assert labels.tolist() == [1.0, 1.0, 0.0, 0.0, 0.0, 0.0]  # 'all' has every item; u5 gets 4
    # 'all' lacks only i19 after training on i0..i18: the exact draw after the rejections finds it every time
    path.write_text("user,item\n" + "".join(f"all,i{j}\n" for j in range(19)) + "".join(f"u{j},i{j}\n" for j in range(20)) + "all,i3\n")
    labels, ids, _, _ = joined_two(blocks(dataclasses.replace(cfg, test_rows=1), "test"))
    assert labels.tolist() == [1.0, 0.0, 0.0, 0.0, 0.0] and len(set(ids[1:, 1].tolist())) == 1


def joined_two(bs: list[RowBlock]) -> tuple[np.ndarray, np.ndarray, None, None]:
    return np.concatenate([b.labels for b in bs]), np.concatenate([np.stack([b.feature(f)[0] for f in range(2)], 1) for b in bs]), None, None


def test_item_features_come_from_the_sampled_item(tmp_path: Path) -> None:
    cfg = config(write_log(tmp_path / "log.csv"), item_features=["tier"])
    labels, ids, _, _ = joined(blocks(cfg, "train", epoch=0))
    tier_of = {int(i): int(t) for i, t in zip(ids[labels == 1, 1], ids[labels == 1, 3])}  # from the positives
    neg = ids[labels == 0]
    assert all(tier_of[int(i)] == int(t) for i, t in zip(neg[:, 1], neg[:, 3]))
    copied = joined(blocks(config(tmp_path / "log.csv"), "train", epoch=0))[1]  # without: the positive's value
    assert (copied.reshape(-1, 4, 4)[:, :, 3] == copied.reshape(-1, 4, 4)[:, :1, 3]).all()


def test_a_file_with_labels_is_refused_unless_its_labels_are_kept(tmp_path: Path) -> None:
    path = tmp_path / "rated.csv"
    rng = np.random.default_rng(3)
    path.write_text("user,item,rating\n" + "".join(f"u{rng.integers(0, 30)},i{rng.integers(0, 40)},{rng.integers(1, 6)}\n" for _ in range(600)))
    schema = SchemaConfig(label="rating", label_threshold=4, categorical=["user", "item"])
    cfg = DataConfig(source=str(path), schema=schema, test_rows=100, negatives=2, user_column="user", item_column="item")
    with pytest.raises(DataError) as e:
        open_dataset(cfg).source("train", 64)
    assert "data.negatives_keep_label = true" in str(e.value) and "\n" not in str(e.value)
    kept = dataclasses.replace(cfg, negatives_keep_label=True)
    src = open_dataset(kept).source("test", 64)
    plain = np.concatenate([b.labels for b in open_source(dataclasses.replace(kept, negatives=0), "test", 64)])
    labels = np.concatenate([b.labels for b in src])
    assert src.num_rows == labels.size == 100 + 2 * int(plain.sum())
    assert labels.sum() == plain.sum() and labels.size == plain.size + 2 * plain.sum()


def test_a_headerless_log_and_the_errors_that_name_their_key(tmp_path: Path) -> None:
    path = tmp_path / "plays.tsv"
    path.write_text("".join(f"{i % 13}\t{(i * 7) % 50}\t{i % 5}\n" for i in range(400)))
    schema = SchemaConfig(header=False, columns=["u", "a", "plays"], categorical=["u", "a"])
    cfg = DataConfig(source=str(path), schema=schema, test_rows=40, negatives=1, user_column="u", item_column="a")
    assert sum(b.size for b in open_source(cfg, "test", 32)) == 80
    for overrides, key in [
        (["data.negatives=-1"], "data.negatives"),
        (["data.negatives=2", 'data.user_column="u"'], "data.item_column"),
        (["data.negatives=2", 'data.user_column="u"', 'data.item_column="u"'], "data.item_column"),
        (["data.negatives=2", 'data.negative_sampling="zipf"'], "data.negative_sampling"),
        (["data.negative_seed=-1"], "data.negative_seed"),
    ]:
        with pytest.raises(ConfigError, match=key):
            load_config(None, overrides)
    for bad, key in [(dict(user_column="plays"), "data.user_column"), (dict(item_features=["zz"]), "data.item_features")]:
        with pytest.raises(DataError, match=key):
            open_source(dataclasses.replace(cfg, **bad), "train", 32)
    with pytest.raises(DataError, match="data.negatives"):
        open_source(load_config(None, ["data.negatives=1", 'data.user_column="C1"', 'data.item_column="C2"']).data, "train", 32)


def test_the_pass_merges_as_it_goes_to_the_same_arrays(monkeypatch) -> None:
    """Blocks merged every few rows (a large file) give what one merge at the end gives; an item's features are from
    its first row."""
    import tierec.data.interactions as interactions

    rng = np.random.default_rng(9)
    blks = []
    for _ in range(7):
        users, items = rng.integers(0, 40, 50), rng.integers(0, 30, 50)
        attr = items * 10 + rng.integers(0, 2, 50)  # an item's value changes between rows: the first one counts
        blks.append(RowBlock.from_ids(np.ones(50, np.float32), np.zeros((50, 0), np.float32), np.stack([users, items, attr])))
    roles = ColumnRoles(user=0, item=1, attributes=(2,))
    once = Interactions.scan(blks, roles)
    monkeypatch.setattr(interactions, "MERGE_ROWS", 3)
    often = Interactions.scan(blks, roles)
    for name in ("pairs", "items", "counts", "attributes"):
        assert np.array_equal(getattr(once, name), getattr(often, name)), name
    all_items = np.concatenate([b.feature(1)[0] for b in blks])
    all_attr = np.concatenate([b.feature(2)[0] for b in blks])
    first = {int(i): int(a) for i, a in reversed(list(zip(all_items, all_attr)))}
    assert once.attributes[:, 0].tolist() == [first[int(i)] for i in once.items]
    assert once.counts.tolist() == [int((all_items == i).sum()) for i in once.items] and once.rows == 350
