"""Offline checks of the cluster definitions in ``cluster/`` and of the config the RayJob runs.

Nothing here starts Ray, talks to a cloud or needs a Kubernetes API server:

* the cluster-launcher YAMLs go through Ray's own ``prepare_config`` + ``validate_config`` (the
  jsonschema ``ray/autoscaler/ray-schema.json`` plus Ray's semantic checks). ``prepare_config`` only
  merges the provider's ``defaults.yaml``; the step that calls AWS (``bootstrap_config``) is not
  used, so no credentials are needed;
* the KubeRay manifests are validated against ``cluster/schemas/*.schema.json`` (JSON Schema draft
  2020-12, written from the KubeRay ray.io/v1 API reference), and broken copies must fail;
* consistency: the RayJob entrypoint, the experiment config it runs, GPU/CPU packing of client
  workers into worker pods/nodes, token auth, image versions, runtime_env excludes;
* every YAML file under ``cluster/`` must be listed in ``COVERED`` below, so a new file without a
  test fails here.
"""

from __future__ import annotations

import copy
import json
import math
import re
import shlex
from pathlib import Path

import jsonschema
import pytest
import ray
import yaml
from referencing import Registry
from referencing.jsonschema import DRAFT202012

from fedray.config import load_config

ROOT = Path(__file__).resolve().parents[2]  # tests/deploy/ -> repository root
CLUSTER = ROOT / "cluster"
SCHEMAS = CLUSTER / "schemas"

LAUNCHER_YAMLS = ["ray-up.yaml", "ray-up-local.yaml"]
KUBERAY_YAMLS = {"kuberay/raycluster.yaml": "raycluster", "kuberay/rayjob.yaml": "rayjob"}
RUNTIME_ENV_YAML = "runtime_env.yaml"
# Every YAML under cluster/ and the tests below that check it.
COVERED = {
    RUNTIME_ENV_YAML: "test_runtime_env_*",
    "ray-up.yaml": "test_launcher_*",
    "ray-up-local.yaml": "test_launcher_*",
    "kuberay/raycluster.yaml": "test_kuberay_*",
    "kuberay/rayjob.yaml": "test_kuberay_*, test_rayjob_*",
}
# Job entrypoints the lead engineer owns (python -m jobs.<name>); accepted before the file lands.
PLANNED_JOBS = {"train", "tune", "scale"}
SHARED_MOUNT = "/mnt/shared"
IMAGE_WORKDIR = "/home/ray/fedray"  # where the KubeRay image holds the fedray tree
MIN_TOKEN_AUTH_RAY = (2, 52, 0)  # first Ray with RAY_AUTH_MODE=token; KubeRay authOptions needs it


# --------------------------------------------------------------------------- helpers
def load_yaml(rel: str):
    return yaml.safe_load((CLUSTER / rel).read_text())


def version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", text)[:3])


def ray_internals():
    """Ray's private launcher-config helpers (ray is pinned in pyproject.toml)."""
    try:
        from ray.autoscaler._private.util import prepare_config, validate_config
    except ImportError as e:  # pragma: no cover - only when Ray moves its private API
        pytest.fail(f"Ray {ray.__version__} no longer has ray.autoscaler._private.util "
                    f"prepare_config/validate_config ({e}); update this test")
    return prepare_config, validate_config


def schema_validator(kind: str) -> jsonschema.Draft202012Validator:
    schemas = [json.loads(p.read_text()) for p in sorted(SCHEMAS.glob("*.schema.json"))]
    registry = Registry().with_resources((s["$id"], DRAFT202012.create_resource(s)) for s in schemas)
    (schema,) = [s for s in schemas if s["$id"].endswith(f"/{kind}.schema.json")]
    return jsonschema.Draft202012Validator(schema, registry=registry)


def schema_errors(doc, kind: str) -> list[str]:
    errors = sorted(schema_validator(kind).iter_errors(doc), key=lambda e: list(e.absolute_path))
    return [f"{'.'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}" for e in errors]


def cluster_spec(rel: str) -> dict:
    doc = load_yaml(rel)
    return doc["spec"]["rayClusterSpec"] if doc["kind"] == "RayJob" else doc["spec"]


def quantity(value) -> float:
    """Kubernetes quantity -> number (CPU in cores, memory in bytes)."""
    if isinstance(value, (int, float)):
        return float(value)
    m = re.fullmatch(r"([0-9.]+)([a-zA-Z]*)", str(value))
    assert m, f"unparsable Kubernetes quantity {value!r}"
    num, suffix = float(m.group(1)), m.group(2)
    scale = {"": 1, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12,
             "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
    assert suffix in scale, f"unknown quantity suffix in {value!r}"
    return num * scale[suffix]


def rayjob_entrypoint() -> tuple[str, dict[str, str]]:
    """(module, {--flag: value}) of the RayJob entrypoint `python -m jobs.<name> ...`."""
    argv = shlex.split(load_yaml("kuberay/rayjob.yaml")["spec"]["entrypoint"])
    assert argv[:2] == ["python", "-m"], f"entrypoint must be `python -m jobs.<name> ...`, got {argv}"
    module, rest = argv[2], argv[3:]
    flags: dict[str, str] = {}
    i = 0
    while i < len(rest):
        assert rest[i].startswith("--"), f"unexpected positional argument {rest[i]!r} in entrypoint"
        key, eq, val = rest[i].partition("=")
        if eq:
            flags[key] = val
            i += 1
        else:
            flags[key] = rest[i + 1]
            i += 2
    return module, flags


def rayjob_config():
    _, flags = rayjob_entrypoint()
    return load_config(ROOT / flags["--config"])


def containers(group: dict) -> list[dict]:
    return group["template"]["spec"]["containers"]


# --------------------------------------------------------------------------- coverage
def test_every_cluster_yaml_is_covered_by_a_test():
    found = {p.relative_to(CLUSTER).as_posix() for p in CLUSTER.rglob("*") if p.suffix in (".yaml", ".yml")}
    missing = sorted(found - set(COVERED))
    gone = sorted(set(COVERED) - found)
    assert not missing, f"YAML files in cluster/ without a test (add them to COVERED and test them): {missing}"
    assert not gone, f"COVERED lists files that do not exist in cluster/: {gone}"
    schemas = {p.name for p in SCHEMAS.glob("*.json")}
    assert schemas == {f"{k}.schema.json" for k in KUBERAY_YAMLS.values()}, (
        f"cluster/schemas holds {sorted(schemas)}; each schema must validate a manifest in KUBERAY_YAMLS")


def test_every_cluster_yaml_parses():
    for rel in COVERED:
        docs = list(yaml.safe_load_all((CLUSTER / rel).read_text()))
        assert len(docs) == 1 and isinstance(docs[0], dict), f"cluster/{rel}: expected one YAML mapping"


# --------------------------------------------------------------------------- cluster launcher
@pytest.mark.parametrize("rel", LAUNCHER_YAMLS)
def test_launcher_yaml_passes_ray_validation(rel):
    prepare_config, validate_config = ray_internals()
    prepared = prepare_config(load_yaml(rel))
    validate_config(prepared)  # raises jsonschema.ValidationError / ValueError with the reason
    assert prepared["head_node_type"] in prepared["available_node_types"]


@pytest.mark.parametrize(
    "mutate, error",
    [
        (lambda c: c.__setitem__("max_worker", c.pop("max_workers")), jsonschema.ValidationError),
        (lambda c: c["available_node_types"]["gpu_worker"]["resources"].__setitem__("GPU", "1"),
         jsonschema.ValidationError),
        (lambda c: c["docker"].__setitem__("imagee", c["docker"]["image"]), jsonschema.ValidationError),
        (lambda c: c.__setitem__("head_node_type", "missing"), ValueError),
        (lambda c: c.__setitem__("max_workers", 0) or
         c["available_node_types"]["gpu_worker"].__setitem__("min_workers", 2), ValueError),
    ],
    ids=["misspelt-top-level-field", "resource-as-string", "misspelt-docker-field",
         "unknown-head-node-type", "min-workers-over-max"],
)
def test_launcher_validation_rejects_broken_copy(mutate, error):
    prepare_config, validate_config = ray_internals()
    broken = copy.deepcopy(load_yaml("ray-up.yaml"))
    mutate(broken)
    with pytest.raises(error):
        validate_config(prepare_config(broken))


def test_launcher_image_matches_installed_ray():
    image = load_yaml("ray-up.yaml")["docker"]["image"]
    assert re.fullmatch(rf"rayproject/ray:{re.escape(ray.__version__)}-py3\d+-gpu", image), (
        f"cluster/ray-up.yaml docker.image {image!r} must be the GPU image of Ray {ray.__version__} "
        "(the version pinned in pyproject.toml) so drivers and cluster speak the same protocol")


def test_launcher_gpu_nodes_fit_the_cluster_config():
    cfg = load_config(ROOT / "jobs/configs/cluster_gpu.yaml")
    e = cfg.engine
    conf = load_yaml("ray-up.yaml")
    types = conf["available_node_types"]
    head = types[conf["head_node_type"]]
    assert head["resources"].get("CPU") == 0, "the head must offer CPU: 0 so no client worker lands there"
    gpu_types = {n: t for n, t in types.items() if t["resources"].get("GPU", 0) > 0}
    assert gpu_types, "cluster/ray-up.yaml has no node type with GPUs"
    for name, t in gpu_types.items():
        gpus, cpus = t["resources"]["GPU"], t["resources"]["CPU"]
        per_node = e.workers_per_gpu * gpus
        assert e.worker_num_gpus * per_node <= gpus + 1e-9, (
            f"{name}: {per_node} workers x {e.worker_num_gpus} GPU exceed the node's {gpus} GPU")
        assert e.worker_num_cpus * per_node <= cpus, (
            f"{name}: {per_node} workers x {e.worker_num_cpus} CPU exceed the node's {cpus} Ray CPUs")
        assert e.num_workers is None or e.num_workers <= t["max_workers"] * per_node, (
            f"{name}: engine.num_workers={e.num_workers} needs more than max_workers={t['max_workers']} nodes")
        assert t["max_workers"] <= conf["max_workers"]


@pytest.mark.parametrize("rel", LAUNCHER_YAMLS)
def test_launcher_token_auth_and_code_shipping(rel):
    conf = load_yaml(rel)
    mounts = conf["file_mounts"]
    for key in ("head_start_ray_commands", "worker_start_ray_commands"):
        starts = [c for c in conf[key] if "ray start" in c]
        assert starts, f"cluster/{rel}: {key} has no `ray start`"
        for cmd in starts:
            assert "RAY_AUTH_MODE=token" in cmd, f"cluster/{rel}: {key} must start Ray with RAY_AUTH_MODE=token"
            m = re.search(r"RAY_AUTH_TOKEN_PATH=\$HOME/(\S+)/auth_token", cmd)
            assert m and f"~/{m.group(1)}" in mounts, (
                f"cluster/{rel}: {key} must read the token from a file_mounts directory ({cmd!r})")
    code = [remote for remote, local in mounts.items() if local == "."]
    assert code, f"cluster/{rel}: file_mounts must ship the working tree ('.')"
    assert any("install" in c and f"-e {code[0]}" in c for c in conf["setup_commands"]), (
        f"cluster/{rel}: setup_commands must pip install -e {code[0]}")
    for pattern in (".venv/", "runs/", "data/"):
        assert pattern in conf["rsync_exclude"], f"cluster/{rel}: rsync_exclude must contain {pattern!r}"


# --------------------------------------------------------------------------- KubeRay manifests
def test_kuberay_schemas_are_valid_draft_2020_12():
    for path in SCHEMAS.glob("*.schema.json"):
        schema = json.loads(path.read_text())
        assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema", path.name
        jsonschema.Draft202012Validator.check_schema(schema)


@pytest.mark.parametrize("rel, kind", KUBERAY_YAMLS.items())
def test_kuberay_manifest_matches_schema(rel, kind):
    doc = load_yaml(rel)
    assert doc["kind"] == {"raycluster": "RayCluster", "rayjob": "RayJob"}[kind]
    errors = schema_errors(doc, kind)
    assert not errors, f"cluster/{rel} does not match cluster/schemas/{kind}.schema.json:\n" + "\n".join(errors)


def _del(path):
    def f(doc):
        *parents, last = path
        node = doc
        for p in parents:
            node = node[p]
        del node[last]
    return f


def _set(path, value):
    def f(doc):
        *parents, last = path
        node = doc
        for p in parents:
            node = node[p]
        node[last] = value
    return f


def _rename(path, new):
    def f(doc):
        *parents, last = path
        node = doc
        for p in parents:
            node = node[p]
        node[new] = node.pop(last)
    return f


W0 = ("spec", "workerGroupSpecs", 0)
BROKEN_RAYCLUSTER = {
    "misspelt-maxReplicas": _rename(W0 + ("maxReplicas",), "maxReplica"),
    "misspelt-authOptions-mode": _rename(("spec", "authOptions", "mode"), "mod"),
    "misspelt-template": _rename(("spec", "headGroupSpec", "template"), "tempalte"),
    "missing-groupName": _del(W0 + ("groupName",)),
    "missing-container-image": _del(W0 + ("template", "spec", "containers", 0, "image")),
    "missing-metadata-name": _del(("metadata", "name")),
    "rayStartParams-int": _set(W0 + ("rayStartParams", "num-cpus"), 4),
    "minReplicas-string": _set(W0 + ("minReplicas",), "0"),
    "bad-gpu-quantity": _set(W0 + ("template", "spec", "containers", 0, "resources", "limits",
                                   "nvidia.com/gpu"), "one"),
    "auth-mode-unknown": _set(("spec", "authOptions", "mode"), "password"),
    "wrong-apiVersion": _set(("apiVersion",), "ray.io/v1alpha1"),
}
J = ("spec",)
BROKEN_RAYJOB = {
    "misspelt-shutdownAfterJobFinishes": _rename(J + ("shutdownAfterJobFinishes",), "shutdownAfterJobFinished"),
    "misspelt-nested-worker-field": _rename(J + ("rayClusterSpec", "workerGroupSpecs", 0, "groupName"), "group"),
    "missing-entrypoint": _del(J + ("entrypoint",)),
    "missing-cluster": _del(J + ("rayClusterSpec",)),
    "cluster-and-selector": _set(J + ("clusterSelector",), {"ray.io/cluster": "fedray"}),
    "ttl-string": _set(J + ("ttlSecondsAfterFinished",), "600"),
    "submissionMode-unknown": _set(J + ("submissionMode",), "K8sJob"),
    "runtimeEnvYAML-mapping": _set(J + ("runtimeEnvYAML",), {"working_dir": "."}),
}


@pytest.mark.parametrize(
    "rel, kind, name",
    [("kuberay/raycluster.yaml", "raycluster", n) for n in BROKEN_RAYCLUSTER]
    + [("kuberay/rayjob.yaml", "rayjob", n) for n in BROKEN_RAYJOB],
)
def test_kuberay_schema_rejects_broken_copy(rel, kind, name):
    doc = copy.deepcopy(load_yaml(rel))
    assert not schema_errors(doc, kind), f"cluster/{rel} must be valid before breaking it"
    (BROKEN_RAYCLUSTER if kind == "raycluster" else BROKEN_RAYJOB)[name](doc)
    assert schema_errors(doc, kind), f"cluster/schemas/{kind}.schema.json accepted the broken copy {name!r}"


@pytest.mark.parametrize("rel", KUBERAY_YAMLS)
def test_kuberay_token_auth_and_versions(rel):
    spec = cluster_spec(rel)
    assert spec.get("authOptions", {}).get("mode") == "token", (
        f"cluster/{rel}: set authOptions.mode: token (KubeRay >= 1.5.1) so the dashboard/job API need a token")
    assert version_tuple(spec["rayVersion"]) >= MIN_TOKEN_AUTH_RAY, f"cluster/{rel}: token auth needs Ray >= 2.52.0"
    assert spec["rayVersion"] == ray.__version__, (
        f"cluster/{rel}: rayVersion {spec['rayVersion']} != Ray {ray.__version__} pinned by pyproject.toml")
    groups = [spec["headGroupSpec"], *spec["workerGroupSpecs"]]
    images = {c["image"] for g in groups for c in containers(g)}
    for image in images:
        assert f"ray{ray.__version__}" in image or f":{ray.__version__}" in image, (
            f"cluster/{rel}: image {image!r} does not name Ray {ray.__version__}")
    assert len(images) == 1, f"cluster/{rel}: head and workers should run one image, got {sorted(images)}"


@pytest.mark.parametrize("rel", KUBERAY_YAMLS)
def test_kuberay_gpu_packing_fits_worker_pods(rel):
    e = rayjob_config().engine
    spec = cluster_spec(rel)
    head = spec["headGroupSpec"]
    assert head["rayStartParams"].get("num-cpus") == "0", f"cluster/{rel}: the head must run no client workers"
    assert spec.get("enableInTreeAutoscaling") is True, f"cluster/{rel}: enableInTreeAutoscaling must be true"
    gpu_groups = 0
    for g in spec["workerGroupSpecs"]:
        name = g["groupName"]
        assert g["minReplicas"] <= g.get("replicas", g["minReplicas"]) <= g["maxReplicas"], (
            f"cluster/{rel}: {name}: need minReplicas <= replicas <= maxReplicas")
        (c,) = containers(g)
        res = c["resources"]
        gpu = quantity(res.get("limits", {}).get("nvidia.com/gpu", 0))
        if not gpu:
            continue
        gpu_groups += 1
        assert quantity(res["requests"].get("nvidia.com/gpu", gpu)) == gpu, (
            f"cluster/{rel}: {name}: nvidia.com/gpu request must equal the limit")
        per_pod = e.workers_per_gpu * gpu
        assert e.worker_num_gpus * per_pod <= gpu + 1e-9, (
            f"cluster/{rel}: {name}: {per_pod:g} workers x engine.worker_num_gpus={e.worker_num_gpus} "
            f"> nvidia.com/gpu limit {gpu:g}")
        cpu_needed = e.worker_num_cpus * math.floor(gpu / e.worker_num_gpus + 1e-9)
        cpu_request = quantity(res["requests"]["cpu"])
        assert cpu_needed <= cpu_request, (
            f"cluster/{rel}: {name}: {cpu_needed:g} CPUs for the client workers of one pod "
            f"(worker_num_cpus={e.worker_num_cpus} x 1/worker_num_gpus x {gpu:g} GPU) > cpu request {cpu_request:g}")
        ray_cpus = g.get("rayStartParams", {}).get("num-cpus")
        assert ray_cpus is None or cpu_needed <= float(ray_cpus) <= cpu_request, (
            f"cluster/{rel}: {name}: rayStartParams num-cpus={ray_cpus} must lie in [{cpu_needed:g}, {cpu_request:g}]")
        assert "memory" in res["requests"] and "memory" in res["limits"], f"cluster/{rel}: {name}: set memory"
        assert e.num_workers is None or e.num_workers <= g["maxReplicas"] * per_pod, (
            f"cluster/{rel}: {name}: engine.num_workers={e.num_workers} > maxReplicas x {per_pod:g} workers per pod")
    assert gpu_groups, f"cluster/{rel}: no worker group has a nvidia.com/gpu limit"


@pytest.mark.parametrize("rel", KUBERAY_YAMLS)
def test_kuberay_shared_volume_on_every_pod(rel):
    spec = cluster_spec(rel)
    for g in [spec["headGroupSpec"], *spec["workerGroupSpecs"]]:
        pod = g["template"]["spec"]
        volumes = {v["name"]: v for v in pod.get("volumes", [])}
        mounts = {m["mountPath"]: m["name"] for c in pod["containers"] for m in c.get("volumeMounts", [])}
        assert SHARED_MOUNT in mounts, f"cluster/{rel}: every Ray pod must mount shared storage at {SHARED_MOUNT}"
        assert "persistentVolumeClaim" in volumes[mounts[SHARED_MOUNT]], (
            f"cluster/{rel}: {SHARED_MOUNT} must be a PersistentVolumeClaim (ReadWriteMany)")


# --------------------------------------------------------------------------- RayJob <-> repository
def test_rayjob_entrypoint_runs_an_existing_job_with_a_loadable_config():
    module, flags = rayjob_entrypoint()
    m = re.fullmatch(r"jobs\.([a-z_][a-z0-9_]*)", module)
    assert m, f"RayJob entrypoint must run `python -m jobs.<name>`, got module {module!r}"
    name = m.group(1)
    assert (ROOT / "jobs" / f"{name}.py").is_file() or name in PLANNED_JOBS, (
        f"jobs/{name}.py does not exist (known job entrypoints: {sorted(PLANNED_JOBS)})")
    assert "--config" in flags, "RayJob entrypoint must pass --config"
    config_path = ROOT / flags["--config"]
    assert config_path.is_file(), f"RayJob --config {flags['--config']} does not exist in the repository"
    cfg = load_config(config_path)  # raises ConfigError naming the bad field
    assert cfg.engine.device == "cuda" and cfg.engine.worker_num_gpus, "the GPU RayJob must run a GPU config"
    out = flags.get("--output-dir", cfg.output.root)
    assert out.startswith(SHARED_MOUNT + "/"), f"outputs ({out}) must go to the shared volume {SHARED_MOUNT}"
    for path in (cfg.data.cache_dir, cfg.data.root):
        assert path is None or path.startswith(SHARED_MOUNT + "/"), (
            f"{path}: data paths of a cluster config must be on {SHARED_MOUNT} (same path on every node)")


def test_rayjob_cluster_config_is_the_expected_experiment():
    cfg = rayjob_config()
    assert (cfg.data.source, cfg.data.partition.name, cfg.data.partition.params) == (
        "mnist5k", "dirichlet", {"alpha": 0.3})
    assert (cfg.data.partition.num_clients, cfg.train.clients_per_round, cfg.train.rounds) == (100, 10, 50)
    assert (cfg.model.name, cfg.algorithm.name) == ("fedavg_cnn", "fedavg")
    assert (cfg.engine.worker_num_gpus, cfg.engine.worker_num_cpus) == (0.25, 1.0)


def test_rayjob_lifecycle_and_runtime_env():
    spec = load_yaml("kuberay/rayjob.yaml")["spec"]
    assert spec["shutdownAfterJobFinishes"] is True and spec["ttlSecondsAfterFinished"] > 0
    # A local working_dir can only be uploaded by a submitter (K8sJobMode), not over HTTP.
    assert spec["submissionMode"] == "K8sJobMode"
    env = yaml.safe_load(spec["runtimeEnvYAML"])
    ref = load_yaml(RUNTIME_ENV_YAML)
    assert env["excludes"] == ref["excludes"], "runtimeEnvYAML excludes drifted from cluster/runtime_env.yaml"
    assert env["env_vars"] == ref["env_vars"], "runtimeEnvYAML env_vars drifted from cluster/runtime_env.yaml"
    # The submitter uploads the fedray tree baked into the image (cluster/README.md builds it there);
    # Ray checks that a local working_dir exists, so the repository stands in for that copy.
    assert env["working_dir"] == IMAGE_WORKDIR, f"runtimeEnvYAML working_dir must be {IMAGE_WORKDIR}"
    assert f"COPY --chown=ray:users . {IMAGE_WORKDIR}" in (CLUSTER / "README.md").read_text()
    _check_runtime_env({**env, "working_dir": str(ROOT)}, "cluster/kuberay/rayjob.yaml runtimeEnvYAML")


# --------------------------------------------------------------------------- runtime_env
def _check_runtime_env(env: dict, where: str):
    from ray.runtime_env import RuntimeEnv

    unknown = set(env) - set(RuntimeEnv.known_fields)
    assert not unknown, f"{where}: unknown runtime_env fields {sorted(unknown)}"
    RuntimeEnv(**env)  # Ray's own type checks (env_vars Dict[str, str], excludes list, ...)


def test_runtime_env_yaml_is_valid_for_ray():
    env = load_yaml(RUNTIME_ENV_YAML)
    assert env["working_dir"] == ".", "cluster/runtime_env.yaml: working_dir is the repository root"
    _check_runtime_env({**env, "working_dir": str(ROOT)}, "cluster/runtime_env.yaml")
    assert "pip" not in env and "conda" not in env, "no per-job package installs by default (use an image)"
    for pattern in ("/runs/", "/.venv/"):
        assert pattern in env["excludes"], f"cluster/runtime_env.yaml must exclude {pattern}"


def test_runtime_env_excludes_upload_only_code(tmp_path):
    """Walk a fake working tree with Ray's own upload filter and compare what would be uploaded."""
    try:
        from ray._private.runtime_env.packaging import _dir_travel, _get_excludes
    except ImportError as e:  # pragma: no cover - only when Ray moves its private API
        pytest.fail(f"Ray {ray.__version__} moved its runtime_env packaging helpers ({e}); update this test")
    keep = ["fedray/config.py", "jobs/train.py", "jobs/configs/cluster_gpu.yaml", "cluster/runtime_env.yaml",
            "tuning/__init__.py", "pyproject.toml", "fedray/data/embedded/readme.txt"]
    drop = ["runs/fedavg-1/metrics.jsonl", "runs/_partitions/c0.arrow", "runs-gpu/x/rounds.parquet",
            "runs-gpu/x/_partitions/c1.arrow", "runs-gpu/cache/h/data/part-00000.arrows", ".venv/bin/python",
            ".venv/lib/site.py", "data/mnist/train.npz",
            "bench/out/t.json", ".fedray/cache.db", ".git/HEAD", "fedray/__pycache__/config.cpython-311.pyc",
            "fedray.egg-info/PKG-INFO", ".pytest_cache/v/x", "study/_partitions/c2.arrow"]
    for rel in keep + drop:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("x")
    uploaded: list[str] = []

    def handler(p: Path):
        if p.is_file():
            uploaded.append(p.relative_to(tmp_path).as_posix())

    excludes = load_yaml(RUNTIME_ENV_YAML)["excludes"]
    _dir_travel(tmp_path, [_get_excludes(tmp_path, excludes)], handler, include_gitignore=False)
    assert sorted(uploaded) == sorted(keep), (
        f"cluster/runtime_env.yaml excludes upload {sorted(set(uploaded) - set(keep))} "
        f"and drop {sorted(set(keep) - set(uploaded))}")


# --------------------------------------------------------------------------- README
def test_readme_documents_the_commands_and_existing_files():
    text = (CLUSTER / "README.md").read_text()
    for needle in ("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0", "ray start --head --port=6379 --node-ip-address=127.0.0.1",
                   "--dashboard-host=127.0.0.1", "export RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH=",
                   "--address 127.0.0.1:6379", "ray up", "ray dashboard", "ray job submit",
                   "ray job stop", "--resume", "kubectl apply -f cluster/kuberay/rayjob.yaml",
                   "RAY_AUTH_MODE=token", "ray get-auth-token", "authOptions", "data.root"):
        assert needle in text, f"cluster/README.md must document {needle!r}"
    # the local head keeps token auth on: no recipe switches it off
    assert "RAY_AUTH_MODE=disabled" not in text, "cluster/README.md must not turn Ray's token auth off"
    for rel in set(re.findall(r"\b((?:cluster|jobs)/[\w./-]+\.(?:ya?ml|json|md))", text)):
        assert (ROOT / rel).is_file(), f"cluster/README.md refers to {rel}, which does not exist"
