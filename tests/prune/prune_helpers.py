"""Settings shared by the pruning tests that run the trainer: a small synthetic run with pruning on."""

SMALL = [
    "data.synthetic.train_rows=6144",
    "data.synthetic.test_rows=2048",
    "data.synthetic.cardinality_scale=0.001",
    "train.batch_size=512",
    "train.progress=false",
    "embedding.dim=8",
    "prune.enabled=true",
    "prune.chunk=2",
    "prune.every=4",
    "prune.target_ratio=4.0",
]
