"""The benchmark workload of shared/bench/WORKLOAD.md as a Flower app (ServerApp + ClientApp).

Written against Flower's public Message API (``flwr.serverapp``, ``flwr.clientapp``, ``flwr.app``) and
run with ``flwr.simulation.run_simulation`` by ``bench/workload_flower.py`` inside its own virtualenv
(``bench/.flower-venv``, created by ``bench/bench_workload.py --flower``). fedray does not depend on it.
"""
