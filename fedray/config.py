"""Typed experiment configuration.

An experiment is one YAML or TOML file (see ``jobs/configs/``) whose sections map onto the dataclasses
below. ``load_config(path, overrides)`` reads it, applies ``a.b=c`` overrides (values parsed as YAML, so
``train.lr=0.1``, ``data.partition.alpha=0.3``, ``algorithm.params.mu=1e-3``,
``train.augment=[crop,flip]`` all work), validates everything before any work starts and raises
:class:`ConfigError` naming the offending field. ``config_hash`` is a stable hash of the resolved
config (minus fields that do not change results, such as the output directory or the number of
workers) and names the run directory.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import os
try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the same parser from PyPI
    import tomli as tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from fedray.config_paths import set_path, split_path
from fedray.core.errors import ConfigError  # defined in the floor package; importable from here as ever
from fedray.core.params import ParamSpec, check_value
from fedray.core.typed import build_dataclass
from fedray.core.yaml_io import yaml_load


@dataclass
class PartitionConfig:
    name: str = "dirichlet"
    num_clients: int = 100
    seed: int | None = None  # defaults to the experiment seed
    params: dict[str, Any] = field(default_factory=dict)  # e.g. {alpha: 0.3}


@dataclass
class DataConfig:
    source: str = "mnist5k"
    root: str | None = None  # directory of on-disk datasets; relative paths resolve against the config file
    params: dict[str, Any] = field(default_factory=dict)  # source parameters
    partition: PartitionConfig = field(default_factory=PartitionConfig)
    normalize: bool = True  # (x/255 - mean)/std with the dataset statistics
    cache_dir: str | None = None  # where partitions (manifest + packed files) live; default <output.root>/_partitions
    download: bool = False  # fetch the source's files into data.root when its layout is missing (fedray/data/fetch.py)
    mirrors: list[str] = field(default_factory=list)  # base URLs data.download tries first, then $FEDRAY_DATA_MIRRORS


@dataclass
class ModelConfig:
    name: str = "fedavg_cnn"
    params: dict[str, Any] = field(default_factory=dict)


@dataclass
class AlgorithmConfig:
    name: str = "fedavg"
    params: dict[str, Any] = field(default_factory=dict)  # method hyper-parameters (mu, lam, beta, tau, ...)


# Server learning rates of METHODS.md §1 (FedAdam: trainer.global_lr 0.01 of the reference scripts); the
# others step with lr 1. Filled into ``server.lr`` when the config leaves it unset, so the resolved config
# (and its hash) always holds a number.
DEFAULT_SERVER_LR = {"fedadam": 0.01}


@dataclass
class ServerOptConfig:
    name: str = "none"  # none (plain FedAvg average) | fedavgm | fedadam | fedacg
    lr: float | None = None  # server learning rate; unset: the optimizer's default (DEFAULT_SERVER_LR)
    params: dict[str, Any] = field(default_factory=dict)


@dataclass
class TrainConfig:
    rounds: int = 10
    clients_per_round: int = 10
    local_epochs: int = 1
    # T optimizer steps per round instead of epochs (None: local_epochs); the batches continue the client's
    # keyed epoch permutations (fedray.algorithms.training.batch_schedule)
    local_steps: int | None = None
    batch_size: int = 10
    optimizer: str = "sgd"  # sgd | adam
    lr: float = 0.05
    momentum: float = 0.0
    weight_decay: float = 0.0
    lr_decay: float = 1.0  # per-round multiplicative decay of the client learning rate
    grad_clip: float | None = None  # max gradient norm
    augment: Any = None  # None | list of ops | dict (see fedray.data.loader.Augment.from_spec)
    drop_last: bool = False


def lr_factor(train, rnd: int) -> float:
    """The per-round decay of every learning rate of round ``rnd`` (1-based): ``train.lr_decay ** (rnd - 1)``."""
    return float(train.lr_decay) ** (rnd - 1)


def round_lr(train, rnd: int) -> float:
    """The client learning rate of round ``rnd``: ``train.lr`` decayed per round (:func:`lr_factor`). The one rule
    the clients' optimizers, the split server and the round report all use."""
    return float(train.lr) * lr_factor(train, rnd)


@dataclass
class EvalConfig:
    every: int = 1  # evaluate the global model every k rounds (and always at the last round)
    batch_size: int = 500
    ema: float = 0.9
    analysis_every: int = 0  # feature-analysis metrics every k rounds (0 = never)
    # clean/FGSM/PGD accuracy, e.g. {eps: 0.3, pgd_steps: 20, every: 0}; empty = off (fedray.metrics.robustness)
    adversarial: dict[str, Any] = field(default_factory=dict)
    # registered evaluation metrics computed with the accuracy, e.g. [balanced_accuracy, ece] (fedray.metrics.registry;
    # built-ins and plugins' fedray.register_metric); each adds its values to every evaluated round's row
    metrics: list[str] = field(default_factory=list)


@dataclass
class EngineConfig:
    backend: str = "ray"  # ray | local (in-process, no Ray)
    num_workers: int | None = None  # client workers; default derived from the cluster's resources
    worker_num_cpus: float = 1.0
    worker_num_gpus: float | None = None  # e.g. 0.25; default 0 when no GPU, 1/workers_per_gpu otherwise
    workers_per_gpu: int = 4
    torch_threads: int = 1  # intra-op threads per worker
    coordinator_num_cpus: float = 0.0
    # where the coordinator actor runs: driver (the driver's node, so only the driver's node can take the run
    # down with it) | any (wherever Ray puts it)
    coordinator_placement: str = "driver"
    # a coordinator that dies (its process or its node) is restarted from the last checkpoint this many times
    max_coordinator_restarts: int = 3
    device: str = "auto"  # auto | cpu | cuda
    # torch's deterministic algorithms in every process that trains or evaluates (workers, coordinator):
    # torch.use_deterministic_algorithms(True), cuDNN deterministic without autotuning, and cuBLAS's fixed
    # workspace (CUBLAS_WORKSPACE_CONFIG=:4096:8 unless set). On a GPU it makes a run's bits independent of
    # kernel timing (docs/gpu.md); an op without a deterministic kernel then stops the run naming it. Changes GPU
    # bits (other kernels), so it is hashed; on the CPU torch's kernels are deterministic anyway.
    deterministic: bool = False
    max_client_retries: int = 2  # a client failing more often than this in a round is dropped
    max_worker_restarts: int = 10  # per round, before the run fails
    # a Ray worker holding a task that leaves a heartbeat (a call served on a thread of its own, answered even in
    # the middle of a client's training) unanswered this long is hung (stopped, deadlocked, swapped out): it is
    # killed and replaced, and its clients re-run with the same seeds. None: never checked
    heartbeat_s: float | None = 60.0
    # a Ray actor (client worker or coordinator) that has not answered this long after it was started (its process
    # importing torch, its constructor) is given up on: one Ray started (it has a process) is killed and started
    # again like a hung one; one Ray could not place (no node has its resources) is named as such. Not hashed
    start_timeout_s: float = 600.0
    # largest fraction of a round's sampled clients that may be dropped (failed past their retries) before the
    # run fails; 0 = strict: any dropped client fails the run. A round with no client left always fails.
    max_dropped_fraction: float = 0.0
    reorder_window: int | None = None  # results held for the ordered fold; default 2*workers*chunk or the 256 MB budget
    chunk_size: int | None = None  # clients per task; default from clients per round and last round's client seconds
    over_selection: float = 0.0  # straggler handling: sample ceil((1+x)K) clients, keep the first K done
    round_deadline_s: float | None = None  # straggler handling: aggregate what finished by the deadline
    object_store_memory: int | None = None  # bytes, only when fedray starts a local Ray
    # the Ray cluster to join (GCS HOST:PORT); default RAY_ADDRESS, else a private local Ray (fedray/core/ray_env.py)
    ray_address: str | None = None
    fault_injection: dict[str, Any] = field(default_factory=dict)  # testing aid, see fedray/engine/faults.py
    # clients trained at once per worker with stacked parameters (fedray.engine.client.grouped); 1 = one at a time.
    # Changes float results (within tolerance), so it is hashed.
    multi_client: int = 1
    # a worker trains g consecutive sampled clients and returns one partial sum of their weighted models (fewer
    # bytes through the object store); the fold then adds the groups in order. Changes float results (the sum's
    # association), so it is hashed; never depends on the workers. 1 = one update per client (fedray.engine.programs.fold_group)
    fold_group: int = 1


@dataclass
class MlflowConfig:
    """``output.mlflow``: mirror the run into an MLflow run (extra ``fedray[mlflow]``; docs/tracking.md)."""

    enabled: bool = False
    tracking_uri: str | None = None  # default sqlite:///<run dir>/mlflow/mlflow.db (artifacts in <run dir>/mlflow/)
    experiment: str = "fedray"
    run_name: str | None = None  # default: the run directory's name


WANDB_MODES = ("offline", "online")


@dataclass
class WandbConfig:
    """``output.wandb``: mirror the run into a Weights & Biases run (extra ``fedray[wandb]``; docs/tracking.md)."""

    enabled: bool = False
    project: str = "fedray"
    entity: str | None = None
    mode: str = "offline"  # offline (no network; `wandb sync` uploads later) | online
    dir: str | None = None  # where W&B writes its wandb/ folder; default the run directory
    run_name: str | None = None  # default: the run directory's name


@dataclass
class OutputConfig:
    root: str = "runs"
    name: str | None = None  # run directory name; default <algorithm>-<config hash>
    checkpoint_every: int = 5
    keep_checkpoints: int = 2
    # trackers: every per-round number of metrics.jsonl goes to each one that is on (one place for all of them)
    tensorboard: bool = True
    mlflow: MlflowConfig = field(default_factory=MlflowConfig)
    wandb: WandbConfig = field(default_factory=WandbConfig)
    progress: bool = True


@dataclass
class ExperimentConfig:
    seed: int = 0
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    server: ServerOptConfig = field(default_factory=ServerOptConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    output: OutputConfig = field(default_factory=OutputConfig)
    # the user's modules that register algorithms, models, sources, ... (fedray.core.plugin_loader; docs/extending.md):
    # names, or paths to a .py file / package directory relative to the config file
    plugins: list[str] = field(default_factory=list)
    # filled when the config is read: each plugin module's source digest (hashed: edited code is another run) and
    # the directory it was found in (not hashed: machine-specific)
    plugin_code: dict[str, str] = field(default_factory=dict)
    plugin_roots: dict[str, str] = field(default_factory=dict)
    source_path: str | None = None  # file the config was read from (not hashed)

    # ---------------------------------------------------------------- helpers
    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @property
    def partition_seed(self) -> int:
        s = self.data.partition.seed
        return self.seed if s is None else s


# Fields that do not change the numbers a run produces: excluded from the hash.
_HASH_EXCLUDE = {
    "source_path",
    "plugins",  # how the code was named (a path moves with the config); plugin_code is what ran
    "plugin_roots",
    "output",
    "engine.backend",
    "engine.num_workers",
    "engine.worker_num_cpus",
    "engine.worker_num_gpus",
    "engine.workers_per_gpu",
    "engine.coordinator_num_cpus",
    "engine.coordinator_placement",
    "engine.max_coordinator_restarts",
    "engine.reorder_window",
    "engine.chunk_size",
    "engine.object_store_memory",
    "engine.ray_address",
    "engine.fault_injection",
    "engine.max_worker_restarts",
    "engine.heartbeat_s",
    "engine.start_timeout_s",
    "engine.max_dropped_fraction",
    "data.cache_dir",
    "data.download", "data.mirrors",  # where the files came from changes no number (the source fingerprint names them)
}


def parse_override(text: str) -> tuple[list[str], Any]:
    """``"a.b=c"`` -> (``["a", "b"]``, the value ``c`` parsed as YAML)."""
    if "=" not in text:
        raise ConfigError(f"override {text!r}: expected the form a.b=c")
    key, raw = text.split("=", 1)
    key = key.strip()
    if not key:
        raise ConfigError(f"override {text!r}: empty field name")
    try:
        value = yaml_load(raw) if raw.strip() != "" else ""
    except yaml.YAMLError as e:
        raise ConfigError(f"{key}: cannot parse override value {raw!r}: {e}") from None
    return split_path(key, f"override {text!r}"), value


def apply_overrides(data: dict, overrides: list[str]) -> dict:
    """A copy of the config mapping ``data`` with the ``a.b=c`` overrides set (:func:`fedray.config_paths.set_path`)."""
    data = copy.deepcopy(data)
    for ov in overrides or []:
        path, value = parse_override(ov)
        set_path(data, ".".join(path), value, where=".".join(path))
    return data


def read_config_file(path: str | Path) -> dict:
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file {str(p)!r} does not exist")
    text = p.read_text()
    try:
        if p.suffix.lower() == ".toml":
            data = tomllib.loads(text)
        else:
            data = yaml_load(text)
    except (yaml.YAMLError, tomllib.TOMLDecodeError) as e:
        raise ConfigError(f"config file {str(p)!r}: cannot parse: {e}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {str(p)!r}: the top level must be a mapping")
    return data


def from_dict(data: dict, *, source_path: str | None = None, validate: bool = True,
              base_dir: str | None = None) -> ExperimentConfig:
    """The config of ``data`` (a mapping as a config file holds it). With ``validate``: every check that needs
    neither the data nor the registries, and the ``plugins`` resolved (:func:`resolve_plugins`, relative to
    ``base_dir``, by default the directory of ``source_path``)."""
    data = dict(data)
    data.pop("source_path", None)
    cfg = build_dataclass(ExperimentConfig, data)
    cfg.source_path = source_path
    if cfg.server.lr is None:
        cfg.server.lr = DEFAULT_SERVER_LR.get(cfg.server.name, 1.0)
    if validate:
        validate_config(cfg)
        if base_dir is None and source_path is not None:
            base_dir = str(Path(source_path).resolve().parent)
        resolve_plugins(cfg, base_dir)
    return cfg


def resolve_plugins(cfg: ExperimentConfig, base_dir: str | None) -> None:
    """Fill ``plugin_code`` and ``plugin_roots`` from ``plugins`` (:func:`fedray.core.plugin_loader.resolve`: the
    files found, nothing imported); a digest the config records already must match the code found."""
    if not cfg.plugins and not cfg.plugin_code:
        cfg.plugin_roots = {}
        return
    from fedray.core.plugin_loader import resolve

    cfg.plugin_code, cfg.plugin_roots = resolve(cfg.plugins, base_dir=base_dir, recorded=cfg.plugin_code,
                                                roots=cfg.plugin_roots)


def load_config(path: str | Path | None = None, overrides: list[str] | None = None, *, base: dict | None = None) -> ExperimentConfig:
    """Read a YAML/TOML config (or start from ``base``), apply overrides, validate."""
    data = read_config_file(path) if path is not None else dict(base or {})
    data = apply_overrides(data, overrides or [])
    if path is not None:
        data = anchor_to_file(data, path)
    return from_dict(data, source_path=str(Path(path).resolve()) if path is not None else None)


def anchor_to_file(data: dict, path: str | Path) -> dict:
    """What in a config's mapping is relative to the file ``path`` it came from, made independent of it (in a
    copy), so the mapping means the same wherever it is built later (sweep points, study trials): a relative
    ``data.root`` that exists next to the file becomes absolute, and the ``plugins`` are resolved there
    (``plugin_code`` and ``plugin_roots`` filled: :func:`resolve_plugins`)."""
    data = copy.deepcopy(data)
    here = Path(path).resolve().parent
    root = (data.get("data") or {}).get("root") if isinstance(data.get("data"), dict) else None
    if isinstance(root, str) and not os.path.isabs(os.path.expanduser(root)) and (
            (here / root).exists() or data["data"].get("download") is True):  # or the root a download creates
        data["data"]["root"] = str(here / root)
    plugins = data.get("plugins")
    if plugins:
        if not isinstance(plugins, list):
            raise ConfigError(f"plugins: expected a list of module names or paths, got {plugins!r}")
        from fedray.core.plugin_loader import resolve

        data["plugin_code"], data["plugin_roots"] = resolve(plugins, base_dir=str(here),
                                                            recorded=data.get("plugin_code"),
                                                            roots=data.get("plugin_roots"))
    return data


_POSITIVE = ParamSpec(None, "a number > 0 (or unset)", gt=0, nullable=True)
_NON_NEGATIVE = ParamSpec(None, "a number >= 0 (or unset)", ge=0, nullable=True)
_PARTITION_CONCENTRATION = ParamSpec(None, "a Dirichlet concentration", float, gt=0)


def _positive(path: str, value, allow_zero=False):
    check_value(value, _NON_NEGATIVE if allow_zero else _POSITIVE, path, ConfigError)


def validate_config(cfg: ExperimentConfig) -> None:
    """Checks that do not need the data or the registries loaded (those run in driver.setup.setup_run), section
    by section, in this order: train and data, eval, engine, output."""
    _validate_train_data(cfg)
    _validate_eval(cfg)
    _validate_engine(cfg.engine)
    _validate_output(cfg.output)


def _validate_train_data(cfg: ExperimentConfig) -> None:
    t = cfg.train
    p = cfg.data.partition
    _positive("train.rounds", t.rounds)
    _positive("train.clients_per_round", t.clients_per_round)
    _positive("train.local_epochs", t.local_epochs)
    if t.local_steps is not None and (isinstance(t.local_steps, bool) or not isinstance(t.local_steps, int)
                                      or t.local_steps < 1):
        raise ConfigError(f"train.local_steps: must be an integer >= 1 (optimizer steps per round) or null "
                          f"(train.local_epochs epochs), got {t.local_steps!r}")
    _positive("train.batch_size", t.batch_size)
    _positive("train.lr", t.lr, allow_zero=True)
    _positive("train.momentum", t.momentum, allow_zero=True)
    _positive("train.weight_decay", t.weight_decay, allow_zero=True)
    _positive("train.lr_decay", t.lr_decay)
    _positive("train.grad_clip", t.grad_clip)
    if t.optimizer not in ("sgd", "adam"):
        raise ConfigError(f"train.optimizer: must be 'sgd' or 'adam', got {t.optimizer!r}")
    _positive("data.partition.num_clients", p.num_clients)
    if t.clients_per_round > p.num_clients:
        raise ConfigError(
            f"train.clients_per_round: {t.clients_per_round} clients per round but only "
            f"data.partition.num_clients={p.num_clients} clients"
        )
    for k in ("alpha", "beta"):
        if k not in p.params:
            continue
        v = p.params[k]
        if k == "alpha" and isinstance(v, (list, tuple)):  # dirichlet: one concentration per client
            if len(v) != p.num_clients:
                raise ConfigError(f"data.partition.params.alpha: a list needs one value per client "
                                  f"(data.partition.num_clients={p.num_clients}), got {len(v)}")
            for i, a in enumerate(v):
                check_value(a, _PARTITION_CONCENTRATION, f"data.partition.params.alpha[{i}]", ConfigError)
        else:
            check_value(v, _PARTITION_CONCENTRATION, f"data.partition.params.{k}", ConfigError)
    _positive("seed", cfg.seed, allow_zero=True)
    if p.seed is not None:
        _positive("data.partition.seed", p.seed, allow_zero=True)


def _validate_eval(cfg: ExperimentConfig) -> None:
    _positive("eval.every", cfg.eval.every)
    if not 0 <= cfg.eval.ema < 1:
        raise ConfigError(f"eval.ema: must be in [0, 1), got {cfg.eval.ema!r}")
    for i, name in enumerate(cfg.eval.metrics):
        if not isinstance(name, str) or not name.strip():
            raise ConfigError(f"eval.metrics[{i}]: expected a metric name, got {name!r}")
        if name in cfg.eval.metrics[:i]:
            raise ConfigError(f"eval.metrics[{i}]: {name!r} is listed twice")
    if cfg.eval.adversarial:
        from fedray.metrics.robustness import validate_adversarial_spec

        validate_adversarial_spec(cfg.eval.adversarial)


def _validate_engine(e: EngineConfig) -> None:
    if e.backend not in ("ray", "local"):
        raise ConfigError(f"engine.backend: must be 'ray' or 'local', got {e.backend!r}")
    _positive("engine.num_workers", e.num_workers)
    _positive("engine.worker_num_cpus", e.worker_num_cpus, allow_zero=True)
    _positive("engine.worker_num_gpus", e.worker_num_gpus, allow_zero=True)
    _positive("engine.workers_per_gpu", e.workers_per_gpu)
    _positive("engine.torch_threads", e.torch_threads)
    _positive("engine.chunk_size", e.chunk_size)
    _positive("engine.reorder_window", e.reorder_window)
    _positive("engine.over_selection", e.over_selection, allow_zero=True)
    _positive("engine.round_deadline_s", e.round_deadline_s, allow_zero=True)
    _positive("engine.heartbeat_s", e.heartbeat_s)
    _positive("engine.start_timeout_s", e.start_timeout_s)
    _positive("engine.max_client_retries", e.max_client_retries, allow_zero=True)
    _positive("engine.max_dropped_fraction", e.max_dropped_fraction, allow_zero=True)
    if e.max_dropped_fraction > 1:
        raise ConfigError(f"engine.max_dropped_fraction: must be in [0, 1], got {e.max_dropped_fraction!r}")
    _positive("engine.multi_client", e.multi_client)
    _positive("engine.fold_group", e.fold_group)
    if e.fold_group > 1 and (e.over_selection > 0 or e.round_deadline_s is not None):
        raise ConfigError(f"engine.fold_group: {e.fold_group} sums clients on the workers, but straggler handling "
                          f"(engine.over_selection / engine.round_deadline_s) keeps the first clients to finish and "
                          f"needs each update; set engine.fold_group: 1")
    if e.fold_group > 1 and e.multi_client > 1 and e.fold_group % e.multi_client:
        raise ConfigError(f"engine.fold_group: {e.fold_group} must be a multiple of engine.multi_client "
                          f"({e.multi_client}) so that the multi-client groups stay the same")
    if e.coordinator_placement not in ("driver", "any"):
        raise ConfigError(f"engine.coordinator_placement: must be 'driver' or 'any', got {e.coordinator_placement!r}")
    _positive("engine.max_coordinator_restarts", e.max_coordinator_restarts, allow_zero=True)
    kind = (e.fault_injection or {}).get("kind")
    if kind in ("coordinator_exit", "coordinator_stop") and e.backend != "ray":
        raise ConfigError(f"engine.fault_injection: kind {kind} needs engine.backend: ray (with local, the "
                          f"coordinator is the driver process)")
    if not isinstance(e.deterministic, bool):
        raise ConfigError(f"engine.deterministic: must be true or false, got {e.deterministic!r}")
    if e.device not in ("auto", "cpu", "cuda"):
        raise ConfigError(f"engine.device: must be auto, cpu or cuda, got {e.device!r}")


def _validate_output(o: OutputConfig) -> None:
    _positive("output.checkpoint_every", o.checkpoint_every, allow_zero=True)
    _positive("output.keep_checkpoints", o.keep_checkpoints)
    if o.wandb.mode not in WANDB_MODES:
        raise ConfigError(f"output.wandb.mode: must be {' or '.join(WANDB_MODES)}, got {o.wandb.mode!r}")
    for path, value in (("output.mlflow.experiment", o.mlflow.experiment), ("output.wandb.project", o.wandb.project)):
        if not value.strip():
            raise ConfigError(f"{path}: must not be empty")


# Fields added after runs existed: hashed only when they differ from this default, so the run names
# (config hashes) of earlier configs stay the same.
_HASH_ONLY_IF_NOT = {"engine.multi_client": 1, "engine.fold_group": 1, "train.local_steps": None, "plugin_code": {},
                     "eval.metrics": [], "engine.deterministic": False}


def _hash_view(d: dict, prefix: str = "", exclude: frozenset[str] | set[str] = frozenset()) -> dict:
    out = {}
    for k, v in d.items():
        p = f"{prefix}.{k}" if prefix else k
        if p in _HASH_EXCLUDE or p in exclude:
            continue
        if p in _HASH_ONLY_IF_NOT and v == _HASH_ONLY_IF_NOT[p]:
            continue
        out[k] = _hash_view(v, p, exclude) if isinstance(v, dict) and not p.endswith(("params", "plugin_code")) else v
    return out


def config_hash(cfg: ExperimentConfig, *, ignore: tuple[str, ...] = ()) -> str:
    """Stable 12-hex-char hash of everything that changes the numbers of a run. ``ignore`` leaves further
    dotted fields out: ``ignore=("seed",)`` names the experiment a run is one seed of (``fedray report``
    averages over the runs that share it)."""
    view = _hash_view(cfg.to_dict(), exclude=frozenset(ignore))
    blob = json.dumps(view, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:12]


def hashed_fields(cfg: ExperimentConfig, *, ignore: tuple[str, ...] = ()) -> dict[str, Any]:
    """The fields :func:`config_hash` hashes, flattened to ``{dotted path: value}`` (``params`` mappings
    included, e.g. ``data.partition.params.alpha``; lists as tuples, so values compare and hash)."""

    def flat(d: dict, prefix: str) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for k, v in d.items():
            p = f"{prefix}.{k}" if prefix else str(k)
            if isinstance(v, dict) and v:
                out.update(flat(v, p))
            else:
                out[p] = _frozen(v)
        return out

    return flat(_hash_view(cfg.to_dict(), exclude=frozenset(ignore)), "")


def _frozen(v: Any) -> Any:
    if isinstance(v, (list, tuple)):
        return tuple(_frozen(x) for x in v)
    if isinstance(v, dict):
        return tuple(sorted((str(k), _frozen(x)) for k, x in v.items()))
    return v


def dump_config(cfg: ExperimentConfig) -> str:
    d = cfg.to_dict()
    d.pop("source_path", None)
    for k in ("plugins", "plugin_code", "plugin_roots"):  # a config without plugins reads as it always did
        if not d[k]:
            del d[k]
    if not d["eval"]["metrics"]:  # nor one without extra metrics
        del d["eval"]["metrics"]
    if not d["engine"]["deterministic"]:  # nor one without torch's deterministic algorithms
        del d["engine"]["deterministic"]
    if d["engine"]["start_timeout_s"] == EngineConfig.start_timeout_s:  # nor one with the default start deadline
        del d["engine"]["start_timeout_s"]
    d["data"] = {k: v for k, v in d["data"].items() if (k, v) not in (("download", False), ("mirrors", []))}  # nor these
    return yaml.safe_dump(d, sort_keys=False)
