"""Issue 17 point 8: ranks started with different configs fail at setup, naming the first differing key."""

from __future__ import annotations

from pathlib import Path

from tierec.distributed.launch import spawn

CASES = [  # (rank 0's overrides, rank 1's overrides, what every rank must say)
    (["train.progress=false"], ["train.progress=true", "train.threads=1"], "ok"),
    (["data.synthetic.seed=1"], ["data.synthetic.seed=2"], "data.synthetic.seed is 1 on rank 0 but 2 on rank 1"),
    ([], ["embedding.optimizer.lr=0.1"], "embedding.optimizer.lr is 0.05 on rank 0 but 0.1 on rank 1"),
    (["train.batch_size=64"], ["train.batch_size=32", "embedding.dim=8"], "embedding.dim is 16 on rank 0 but 8"),
]


def config_check_worker(ctx, out_dir: str) -> None:
    from tierec.config import ConfigError, load_config
    from tierec.distributed.config_check import check_same_config

    lines = []
    for mine in CASES:
        try:
            check_same_config(load_config(None, mine[ctx.rank]), ctx.rank, ctx.world_size, group=ctx.dense_group)
            lines.append("ok")
        except ConfigError as e:
            lines.append(str(e))
    Path(out_dir, f"rank{ctx.rank}.txt").write_text("\n".join(lines))


def test_ranks_with_different_configs_name_the_first_differing_key(tmp_path: Path) -> None:
    spawn(config_check_worker, 2, (str(tmp_path),), timeout_s=90)
    for rank in (0, 1):
        got = (tmp_path / f"rank{rank}.txt").read_text().splitlines()
        assert len(got) == len(CASES)
        for line, (_, _, want) in zip(got, CASES):
            assert want in line, (rank, line)
