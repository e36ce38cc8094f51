"""Shared settings of the reliability tests: a synthetic run small enough to train in about a second."""

TINY = [
    "data.synthetic.train_rows=2048",
    "data.synthetic.test_rows=512",
    "data.synthetic.cardinality_scale=0.001",
    "train.batch_size=256",
    "embedding.dim=4",
    "model.bottom_mlp=[8]",
    "model.top_mlp=[8]",
]
