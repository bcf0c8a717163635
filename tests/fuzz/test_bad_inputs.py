"""A corpus of malformed inputs: every one fails before any work with exit code 2, a message that names
the field, file or value, no traceback, and no run directory left behind (reliability issue, item 2)."""

from __future__ import annotations

import re

import pytest
import yaml

from fedray.cli import main
from tests.helpers import small_config

# (overrides, regex the error must match): configs and overrides
OVERRIDES = [
    (["train.lr=fast"], r"train\.lr"),
    (["train.lr=-1"], r"train\.lr"),
    (["train.rounds=2.5"], r"train\.rounds"),
    (["train.rounds=0"], r"train\.rounds"),
    (["train.batch_size=0"], r"train\.batch_size"),
    (["train.local_epochs=-2"], r"train\.local_epochs"),
    (["train.clients_per_round=500"], r"train\.clients_per_round"),
    (["train.momentum=-0.1"], r"train\.momentum"),
    (["train.optimizer=rmsprop"], r"train\.optimizer"),
    (["train.grad_clip=0"], r"train\.grad_clip"),
    (["train.lr_decay=0"], r"train\.lr_decay"),
    (["train.augment=[blur]"], r"train\.augment.*blur"),
    (["train.augment={crop: x}"], r"train\.augment"),
    (["trian.rounds=3"], r"trian"),
    (["train.epochs=3"], r"train\.epochs"),
    (["seed=-3"], r"^.*\bseed\b"),
    (["seed=abc"], r"\bseed\b"),
    (["data.source=nowhere"], r"data\.source"),
    (["data.params.foo=1"], r"foo"),
    (["data.partition.name=lda"], r"lda"),
    (["data.partition.num_clients=0"], r"data\.partition\.num_clients"),
    (["data.partition.params.alpha=-0.5"], r"data\.partition\.params\.alpha"),
    (["data.partition.params.alpha=abc"], r"data\.partition\.params\.alpha"),
    (["data.partition.params.alpha=[1,2]"], r"data\.partition\.params\.alpha.*one value per client"),
    (["data.partition.params.alpha=true"], r"data\.partition\.params\.alpha"),
    (["data.partition.params.beta2=0.3"], r"beta2"),
    (["data.partition.params.min_partition_size=1000"], r"min_partition_size"),
    (["data.partition.seed=-1"], r"data\.partition\.seed"),
    (["data.partition.name=shards", "data.partition.params.shards_per_client=1000"], r"shards_per_client"),
    (["data.partition.name=classes", "data.partition.params.classes=11"], r"classes"),
    (["model.name=resnet99"], r"model\.name"),
    (["model.params.widht=3"], r"model\.params.*widht"),
    (["model.params.hidden=-4"], r"model\.params"),
    (["algorithm.name=fedmagic"], r"algorithm\.name"),
    (["algorithm.params.bogus=1"], r"algorithm\.params\.bogus"),
    (["algorithm.name=fedprox", "algorithm.params.mu=-1"], r"algorithm\.params\.mu"),
    (["algorithm.name=fedprox", "algorithm.params.mu=abc"], r"algorithm\.params\.mu"),
    (["algorithm.name=fedavg", "algorithm.params.weighting=median"], r"algorithm\.params\.weighting"),
    (["algorithm.name=moon", "algorithm.params.tau=0"], r"algorithm\.params\.tau"),
    (["algorithm.name=feddyn", "algorithm.params.alpha=0"], r"algorithm\.params\.alpha"),
    (["algorithm.name=fedrcl", "algorithm.params.lam=abc"], r"algorithm\.params\.lam"),
    (["algorithm.name=scala", "server.name=fedavgm"], r"server\.name"),
    (["algorithm.name=scala", "algorithm.params.local_iters=0"], r"algorithm\.params\.local_iters"),
    (["algorithm.name=splitfed_v2", "algorithm.params.order=random"], r"algorithm\.params\.order"),
    (["server.name=fedmagic"], r"server\.name"),
    (["server.lr=0"], r"server\.lr"),
    (["server.name=fedadam", "server.params.tau=0"], r"server\.params\.tau"),
    (["server.name=fedadam", "server.params.beta1=2"], r"server\.params\.beta1"),
    (["server.name=fedavgm", "server.params.momentum=abc"], r"server\.params\.momentum"),
    (["server.name=fedavgm", "server.params.momentumm=0.9"], r"server\.params\.momentumm"),
    (["server.name=fedacg", "server.params.beta=-1"], r"server\.params\.beta"),
    (["eval.every=0"], r"eval\.every"),
    (["eval.ema=1.5"], r"eval\.ema"),
    (["engine.backend=spark"], r"engine\.backend"),
    (["engine.device=tpu"], r"engine\.device"),
    (["engine.num_workers=0"], r"engine\.num_workers"),
    (["engine.multi_client=4", "algorithm.name=moon"], r"engine\.multi_client"),
    (["engine.fold_group=0"], r"engine\.fold_group"),
    (["engine.fold_group=5", "algorithm.name=feddyn"], r"engine\.fold_group: 5: algorithm .feddyn. keeps per-client state"),
    (["engine.fold_group=5", "engine.round_deadline_s=3"], r"engine\.fold_group: 5 sums clients on the workers"),
    (["engine.max_client_retries=-1"], r"engine\.max_client_retries"),
    (["engine.max_dropped_fraction=2"], r"engine\.max_dropped_fraction"),
    (["engine.chunk_size=0"], r"engine\.chunk_size"),
    (["output.checkpoint_every=-1"], r"output\.checkpoint_every"),
    (["output.keep_checkpoints=0"], r"output\.keep_checkpoints"),
    (["output.root=/proc/fedray-fuzz"], r"output\.root"),
    (["data.cache_dir=/proc/fedray-fuzz"], r"data\.cache_dir"),
    (["data.source=cifar10", "data.root=/nonexistent/cifar"], r"/nonexistent/cifar"),
    (["data.source=mnist", "data.root=/nonexistent/mnist"], r"/nonexistent/mnist"),
    (["data.source=digit5", "data.root=/nonexistent/digit5"], r"/nonexistent/digit5"),
    (["data.source=parquet", "data.params.path=/nonexistent/x.parquet"], r"/nonexistent/x\.parquet|data\.(params|root)"),
    (["data.source=cifar10"], r"data\.root|root"),
    (["eval.adversarial={fgsm_eps: -1}"], r"eval\.adversarial"),
    (["data.download=true"], r"data\.download: fedray cannot download 'mnist5k'"),
    (["data.source=digit5", "data.root=/nonexistent/digit5", "data.download=true"], r"data\.download.*'digit5'"),
    (["data.source=mnist", "data.download=true", "data.mirrors=[ftp://example.org]"], r"data\.mirrors\[0\]"),
]

# malformed config files: (file text, regex)
FILES = [
    ("train: [1, 2\n", r"bad\.yaml"),
    ("- just\n- a list\n", r"bad\.yaml|mapping"),
    ("train:\n  lr: 0.1\n  lr: 0.2\n", r"bad\.yaml"),
    ("train:\n  rounds: three\n", r"train\.rounds"),
    ("model:\n  name: cnn4\n  params: [1]\n", r"model\.params"),
]


@pytest.fixture(scope="module")
def base(tmp_path_factory, partition_cache):
    d = tmp_path_factory.mktemp("fuzz")
    cfg = small_config(d, partition_cache, train__rounds=1)
    cfg["model"] = {"name": "cnn4"}
    path = d / "base.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path, d / "runs"


def _check(capsys, rc, runs, pattern):
    err = capsys.readouterr().err
    assert rc == 2, err
    assert re.search(pattern, err, re.M), err
    assert "Traceback" not in err
    left = [p.name for p in runs.iterdir() if not p.name.startswith("_")] if runs.is_dir() else []
    assert left == [], f"a run directory was created: {left}"


@pytest.mark.parametrize("overrides,pattern", OVERRIDES, ids=[" ".join(o) for o, _ in OVERRIDES])
def test_bad_override_fails_before_any_work(base, capsys, overrides, pattern):
    path, runs = base
    _check(capsys, main(["run", str(path), "--quiet", *overrides]), runs, pattern)


@pytest.mark.parametrize("text,pattern", FILES + [("[train\nrounds = 1\n", r"bad\.toml")])
def test_bad_config_file_fails_before_any_work(tmp_path, capsys, text, pattern):
    path = tmp_path / ("bad.toml" if pattern.endswith("toml") else "bad.yaml")
    path.write_text(text)
    _check(capsys, main(["run", str(path), "--quiet", f"output.root={tmp_path / 'runs'}"]), tmp_path / "runs", pattern)


def test_missing_config_file_names_it(tmp_path, capsys):
    _check(capsys, main(["run", str(tmp_path / "nope.yaml"), "--quiet"]), tmp_path / "runs", r"nope\.yaml")


def test_resume_of_a_directory_that_is_no_run(tmp_path, capsys):
    _check(capsys, main(["run", "--resume", str(tmp_path)]), tmp_path, r"not a run directory")


@pytest.mark.parametrize("overrides,pattern", [
    (["data.partition.params.alpha=0"], r"alpha"),
    (["data.partition.name=shards", "data.partition.params.shards_per_client=1000"], r"shards_per_client"),
    (["data.partition.name=classes", "data.partition.params.classes=2.5"], r"classes"),
    (["data.partition.name=domain", "data.partition.num_clients=7"], r"domain|data\.source"),
])
def test_bad_partition_fails_with_its_parameter(base, capsys, overrides, pattern):
    path, runs = base
    assert main(["partition", str(path), *overrides]) == 2
    err = capsys.readouterr().err
    assert re.search(pattern, err) and "Traceback" not in err


# plugins (docs/extending.md, "Bad input"): module files written next to the config, (overrides, regex)
PLUGIN_FILES = {
    "fz_raises.py": "import fedray\n\n1 / 0\n",
    "fz_nothing.py": "x = 1\n",
    "fz_clash.py": "import fedray\n\n@fedray.register_algorithm\nclass A(fedray.Algorithm):\n    name = 'fedavg'\n",
    "fz_assigns.py": "from fedray.models import MODELS\n\nMODELS['cnn4'] = None\n",
    "fz_needs.py": "import torch\nimport fedray\n\nfedray.register_model('fz_plain', lambda inp, nc: "
                   "torch.nn.Linear(inp.in_channels * inp.height * inp.width, nc))\n",
}
PLUGINS = [
    (["plugins=[fz_nowhere]"], r"plugins\[0\]: no module 'fz_nowhere'"),
    (["plugins=[./fz_missing.py]"], r"plugins\[0\]: './fz_missing.py': no such file"),
    (["plugins=[fz_raises]"], r"plugins\[0\]: importing 'fz_raises' failed: ZeroDivisionError.*fz_raises.py:3"),
    (["plugins=[fz_nothing]"], r"plugins\[0\]: 'fz_nothing' registered nothing"),
    (["plugins=[fz_clash]"], r"plugins\[0\]: .*algorithm 'fedavg' is registered by fedray.algorithms.fedavg"),
    (["plugins=[fz_assigns]"], r"plugins\[0\]: .*TypeError: the model registry is read-only"),
    (["plugins=[fz_needs]", "model.name=fz_plain", "algorithm.name=fedproto"],
     r"algorithm\.name: 'fedproto' needs feature taps .* model 'fz_plain' \(plugin fz_needs\)"),
    (["plugins=[fedray.models]"], r"plugins\[0\]: 'fedray.models' is part of fedray"),
    (["plugins=fz_raises"], r"plugins: expected a list"),
    (["plugin_code={fz_raises: 'sha256:0'}", "plugins=[fz_raises]"], r"plugins\[0\]: the code of 'fz_raises'"),
]


@pytest.fixture
def plugin_base(base):
    from fedray.core import plugin_loader

    path, runs = base
    for name, text in PLUGIN_FILES.items():
        (path.parent / name).write_text(text)
    yield path, runs
    for name in PLUGIN_FILES:
        plugin_loader._forget(name.removesuffix(".py"))


@pytest.mark.parametrize("overrides,pattern", PLUGINS, ids=[" ".join(o) for o, _ in PLUGINS])
def test_bad_plugin_fails_before_any_work(plugin_base, capsys, overrides, pattern):
    path, runs = plugin_base
    _check(capsys, main(["run", str(path), "--quiet", *overrides]), runs, pattern)


@pytest.mark.ray
def test_a_plugin_that_fails_on_the_coordinator_fails_before_any_work_on_ray(plugin_base, capsys, ray_session):
    """On Ray the driver does not import an algorithm plugin: the coordinator's check does, before the run
    directory is claimed."""
    path, runs = plugin_base
    _check(capsys, main(["run", str(path), "--quiet", "engine.backend=ray", "engine.num_workers=1",
                         "plugins=[fz_raises]"]), runs, r"plugins\[0\]: importing 'fz_raises' failed: ZeroDivisionError")


def test_corpus_is_large_enough():
    assert len(OVERRIDES) + len(FILES) + 1 + 2 + 4 + len(PLUGINS) >= 70


# `fedray data fetch` arguments refused before any transfer: (arguments, regex)
FETCH = [
    (["imagenet21k"], r"fedray data: error: fedray cannot download 'imagenet21k': it fetches cifar10, "),
    (["mnist", "--checksum", "nosuch.gz=md5:00"], r"--checksum: mnist has no file 'nosuch\.gz'"),
    (["mnist", "--checksum", "train-images-idx3-ubyte.gz=md5:xyz"],
     r"checksum of train-images-idx3-ubyte\.gz: expected md5:<32 hex digits>"),
    (["mnist", "--mirror", "file:///srv/mnist"], r"--mirror\[0\]: a mirror is an http:// or https:// base URL"),
    (["cinic10"], r"cinic10: no checksum of CINIC-10\.tar\.gz is published"),
]


@pytest.mark.parametrize("args,pattern", FETCH, ids=[" ".join(a) for a, _ in FETCH])
def test_bad_data_fetch_is_refused_before_any_transfer(tmp_path, capsys, args, pattern):
    rc = main(["data", "fetch", *args, "--root", str(tmp_path / "data")])
    err = capsys.readouterr().err
    assert rc == 2 and re.search(pattern, err), err
    assert "Traceback" not in err
    assert not [p for p in (tmp_path / "data").rglob("*") if p.is_file() and not p.name.endswith(".lock")]
