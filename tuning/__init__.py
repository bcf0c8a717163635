"""Hyper-parameter studies over whole FL runs (Optuna, driver-side ask/tell).

``tuning.study``   the study file format (YAML) and its validation;
``tuning.runner``  the driver that runs trials concurrently on the Ray cluster, with pruning and resume;
``tuning.outputs`` the trials table, the best config and the PNG plots of a study.

Entry points: ``fedray tune STUDY.yaml`` and ``python -m jobs.tune --study STUDY.yaml`` (docs/tuning.md).
"""
