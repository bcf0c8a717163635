# ---
# jupyter:
#   jupytext:
#     text_representation:
#       format_name: percent
# ---

# %% [markdown]
# # The example method from a notebook
#
# `fedray.run` runs an experiment in this process (`backend="local"`) or on Ray and returns its result: per-round
# metrics, accuracy, the final weights and the run directory, with the same bits as `fedray run exp.yaml`
# (docs/python-api.md). Open this file with Jupyter (jupytext reads the `# %%` cells) or run it as a script from
# this directory: `python notebook.py`. `EXAMPLE_OVERRIDES="train.rounds=2"` shortens every run (the tests use it).

# %%
import os

import numpy as np

import fedray

OVERRIDES = os.environ.get("EXAMPLE_OVERRIDES", "").split()  # e.g. train.rounds=2 output.root=/tmp/runs

# %% [markdown]
# ## Two values of λ
#
# `exp.yaml` names the plugin (`plugins: [mymethod]`); overrides are the command line's `a.b=c` strings. A cell run
# twice finds its finished runs and reads them back (`reused=True`); `overwrite=True` runs them again.

# %%
results = {}
for lam in (0.0, 0.01):
    results[f"mnist5k, lam={lam}"] = fedray.run("exp.yaml", f"algorithm.params.lam={lam}", *OVERRIDES,
                                                backend="local")

res = results["mnist5k, lam=0.01"]
print(res)
print(res.metrics[-1]["accuracy"], res.weights.shape, res.run_dir)

# %% [markdown]
# ## In-memory arrays
#
# `fedray.data.from_arrays` turns arrays (here scikit-learn's 8x8 digits, scaled to 0..255) into a data source keyed
# on their content; `data=` chooses it and keeps the config's partition (the plugin's `sorted_blocks`).

# %%
from sklearn.datasets import load_digits  # noqa: E402

digits = load_digits()
x = np.round(digits.images * 255 / 16).astype(np.uint8)  # (1797, 8, 8) grey images
y = digits.target
order = np.random.default_rng(0).permutation(len(y))
train, test = order[:1400], order[1400:]
arrays = fedray.data.from_arrays(x[train], y[train], x[test], y[test], name="digits")
print(arrays)
results["digits (arrays), lam=0.001"] = fedray.run("exp.yaml", *OVERRIDES, backend="local", data=arrays)

# %% [markdown]
# ## The table

# %%
print(f"{'experiment':28s} {'rounds':>6s} {'accuracy':>8s}  {'weights':16s}  run directory")
for name, r in results.items():
    print(f"{name:28s} {len(r.metrics):6d} {r.accuracy:8.4f}  {r.weights_hash:16s}  {r.run_dir.name}")

# %%
try:
    curves = {name: r.to_pandas().set_index("round")["accuracy"] for name, r in results.items()}
    import pandas as pd

    print(pd.DataFrame(curves).tail())
except ImportError:  # pandas is optional: the metrics are plain dicts
    pass
