"""The driver: the process that runs one experiment from start to finish (docs/engine.md, "Arranged by process").

``runner`` (:func:`~fedray.driver.runner.run_experiment`) | ``setup`` (checks, data, run directory; finish) |
``launch`` (Ray and the actors started early) | ``handle`` (one coordinator handle per backend) | ``rounds`` (the
round loop, signals, restore) | ``callbacks`` (checkpoints). Nothing here imports torch at module level
(tests/test_layering.py); the engine (coordinator, scheduler, workers) never imports the driver.
"""
