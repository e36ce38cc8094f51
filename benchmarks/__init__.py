"""Side-by-side benchmarks of tierec against its peers: ``python -m benchmarks.run --help``."""
