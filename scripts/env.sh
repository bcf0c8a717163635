# Environment shared by the demo, the tests and CI (sourced, not executed).
# Ray token authentication stays on: the local Ray that fedray starts (runs, tests) binds 127.0.0.1 only
# and uses fedray's token (~/.cache/fedray/ray/auth_token, fedray/core/ray_env.py); joining a cluster
# needs RAY_AUTH_MODE=token and its token (RAY_AUTH_TOKEN_PATH or RAY_AUTH_TOKEN), see cluster/README.md.
export RAY_USAGE_STATS_ENABLED=0
export RAY_DEDUP_LOGS="${RAY_DEDUP_LOGS:-0}"
export PYTHONUNBUFFERED=1
