# Environment shared by the demo, the tests and CI (sourced, not executed).
# Ray >= 2.59 turns token authentication on for local clusters; fedray's local runs, tests and the
# loopback job tests all use RAY_AUTH_MODE=disabled consistently (see README "Running on a cluster"
# for real clusters, which should keep tokens on).
export RAY_AUTH_MODE="${RAY_AUTH_MODE:-disabled}"
export RAY_USAGE_STATS_ENABLED=0
export RAY_DEDUP_LOGS="${RAY_DEDUP_LOGS:-0}"
export PYTHONUNBUFFERED=1
