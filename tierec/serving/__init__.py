"""From training to serving: export a checkpoint, score rows of raw values, serve them over HTTP.

- :mod:`tierec.serving.export`: ``tierec export`` (dense program, tables, manifest);
- :mod:`tierec.serving.scorer`: :class:`~tierec.serving.scorer.Scorer`, the library scorer;
- :mod:`tierec.serving.server`: ``tierec serve`` (Starlette on uvicorn, an optional extra).

Pure torch and numpy, plus the training reader's own parser (pyarrow, numba) so that raw values become
the ids training gave them. docs/serving.md has the commands and figures.

>>> from tierec.serving.manifest import FORMAT_NAME, PRECISIONS
>>> FORMAT_NAME, PRECISIONS
('tierec-export', ('fp32', 'fp16', 'int8'))
"""
