"""The floor of fedray: what every other package uses and nothing of fedray below it.

``weights`` (flat float32 vectors), ``seeds`` (keyed generators), ``procinfo`` (process memory from
/proc), ``ray_env`` (starting or joining Ray), ``ray_up`` (`fedray up` / `fedray down`), ``warm_workers``
(the idle workers a warm run's actors start in), ``io`` (atomic writes), ``errors`` (ConfigError) and
``params`` (one schema for plugin parameters). Modules here import no other fedray package.
"""
