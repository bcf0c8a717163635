"""Hyper-parameter studies over whole FL runs (Optuna, driver-side ask/tell): ``fedray tune STUDY.yaml`` and
``python -m jobs.tune --study STUDY.yaml`` (docs/tuning.md). Split by job:

``tuning.space``      a study as data: the search space, objectives, sampler, pruner, budget, trial resources;
``tuning.study``      the study file (YAML) and its validation; ``tuning.checks`` the dry build of its configs;
``tuning.objective``  the objective metric and its value from a trial's round reports;
``tuning.backend``    Optuna's storage, sampler and pruner;
``tuning.study_dir``  the study directory: study.json, sessions, the storage URL, the driver lock;
``tuning.trial``      one trial (its run, pruning, what Optuna is told) and the recovery of trials left running;
``tuning.driver``     the driver: ask/tell with trials run several at once by :mod:`fedray.apps.launcher`;
``tuning.outputs``    the trials table and the best config; ``tuning.plots`` the PNG plots;
``tuning.cli``        the command line (``fedray tune``, ``jobs.tune``) and its dry run.

Nothing in ``fedray`` below its command line (``fedray.cli``) and Python API (``fedray.api``) imports ``tuning``.
"""
