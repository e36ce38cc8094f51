"""`tierec tune`: hyperparameter search over `tierec train` with Optuna (the optional extra ``tune``).

:mod:`tierec.tune.space` is what is searched (typed ranges, defaults by data size, narrowed in TOML);
:mod:`tierec.tune.study` runs the study (trials on the validation split, pruning, the final run);
:mod:`tierec.tune.plot` draws the trials.
"""
