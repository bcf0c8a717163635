"""Plugins (fedray/core/plugin_loader.py, the registries of fedray/core/registry.py): how a config's ``plugins``
are found, hashed and imported, and every bad input refused before any work with ``plugins[i]`` named."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from fedray.config import ConfigError, config_hash, load_config
from fedray.core import plugin_loader, registry
from fedray.plugins import check_registries

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "custom-method"

ALGO = """
import fedray

@fedray.register_algorithm
class A(fedray.Algorithm):
    name = {name!r}
"""


@pytest.fixture
def plugins():
    """Write plugin modules into a project directory; whatever they registered in this process is forgotten
    afterwards (the registries are process-wide)."""
    made: list[str] = []

    class Project:
        def __init__(self, root: Path):
            self.root = root

        def module(self, name: str, code: str, package: bool = False) -> Path:
            made.append(name.split(".")[0])
            path = self.root / (f"{name}/__init__.py" if package else f"{name}.py")
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(textwrap.dedent(code))
            return path

        def config(self, plugins: list, **sections) -> Path:
            import yaml

            data = {"plugins": plugins, "engine": {"backend": "local"}, "output": {"root": str(self.root / "runs")},
                    **sections}
            path = self.root / "exp.yaml"
            path.write_text(yaml.safe_dump(data))
            return path

    yield Project
    for name in made:
        plugin_loader._forget(name)


def test_registries_are_read_only_and_name_the_function_to_use():
    from fedray.algorithms import ALGORITHMS
    from fedray.data.partition import PARTITIONERS
    from fedray.data.sources import SOURCES
    from fedray.models import MODELS

    for reg, fn in ((MODELS, "register_model"), (SOURCES, "register_source"), (PARTITIONERS, "register_partitioner"),
                    (ALGORITHMS, "register_algorithm")):
        with pytest.raises(TypeError, match=f"read-only: register 'x' with fedray.{fn}"):
            reg["x"] = object()
        with pytest.raises(TypeError, match="read-only"):
            del reg[next(iter(reg))]
    assert MODELS.module("fedavg_cnn") == "fedray.models.registry" and not MODELS.plugin_names()


def test_a_taken_name_is_refused_naming_both_modules():
    reg = registry.Registry("test thing", "fedray.register_test_thing")
    try:
        reg.add("a", 1, "fedray.x")
        reg.add("b", 2, "mylab.models")
        with pytest.raises(registry.RegistryError, match=r"test thing 'a' is registered by fedray.x \(built-in\); "
                                                         r"otherlab cannot register it again"):
            reg.add("a", 3, "otherlab")
        with pytest.raises(registry.RegistryError, match="'b' is registered by mylab.models; otherlab cannot"):
            reg.add("b", 3, "otherlab")
        reg.add("b", 4, "mylab.models")  # the same module again (a re-imported plugin): its own entry replaced
        assert reg["b"] == 4 and reg.owned_by("mylab") == ["b"] and reg.plugin_names() == ["b"]
        with pytest.raises(registry.RegistryError, match="non-empty name"):
            reg.add(" ", 1, "m")
    finally:
        del registry.ALL["test thing"]


def test_the_example_resolves_next_to_its_config_from_any_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = load_config(EXAMPLE / "exp.yaml")
    assert cfg.plugins == ["mymethod"] and cfg.plugin_roots == {"mymethod": str(EXAMPLE)}
    digest = plugin_loader.digest_files(str(EXAMPLE / "mymethod"))
    assert cfg.plugin_code == {"mymethod": digest} and digest.startswith("sha256:")


def test_resolving_imports_nothing_and_hashes_the_code(plugins, tmp_path):
    p = plugins(tmp_path)
    p.module("fr_hash", ALGO.format(name="fr_hash"))
    cfg_path = p.config(["fr_hash"], algorithm={"name": "fr_hash"})
    cfg = load_config(cfg_path)
    import sys

    assert "fr_hash" not in sys.modules
    h = config_hash(cfg)
    assert config_hash(load_config(cfg_path)) == h
    p.module("fr_hash", ALGO.format(name="fr_hash") + "\n# an edit\n")
    assert config_hash(load_config(cfg_path)) != h  # edited code: another run directory
    # named by its path instead of its name: the same code, the same hash
    p.module("fr_hash", ALGO.format(name="fr_hash"))
    assert config_hash(load_config(cfg_path, ["plugins=[./fr_hash.py]"])) == h


def test_a_config_without_plugins_keeps_its_hash_and_its_file():
    from fedray.config import dump_config, from_dict

    cfg = from_dict({})
    assert config_hash(cfg) == "b9fa92c9b9db"  # the hash of the default config before plugins existed
    assert "plugin" not in dump_config(cfg)


def test_a_recorded_digest_must_match_the_code(plugins, tmp_path):
    p = plugins(tmp_path)
    p.module("fr_rec", ALGO.format(name="fr_rec"))
    cfg_path = p.config(["fr_rec"], plugin_code={"fr_rec": "sha256:0000000000000000"})
    with pytest.raises(ConfigError, match=r"plugins\[0\]: the code of 'fr_rec' .* is sha256:\w+, but this config "
                                          r"records sha256:0000000000000000"):
        load_config(cfg_path)
    with pytest.raises(ConfigError, match="plugin_code: records 'other', which no entry of plugins names"):
        load_config(p.config(["fr_rec"], plugin_code={"other": "sha256:1"}))


@pytest.mark.parametrize("entry,message", [
    ("fr_nothere", r"plugins\[0\]: no module 'fr_nothere' in .* \(the config's directory\)"),
    ("./missing.py", r"plugins\[0\]: './missing.py': no such file or directory"),
    ("notes.txt/", r"plugins\[0\]: 'notes.txt/': .*"),
    ("not a name", r"plugins\[0\]: 'not a name' is not a module name"),
    ("fedray.models", r"plugins\[0\]: 'fedray.models' is part of fedray, not a plugin"),
])
def test_bad_entries_fail_before_any_work(plugins, tmp_path, entry, message):
    p = plugins(tmp_path)
    (tmp_path / "notes.txt").mkdir()
    with pytest.raises(ConfigError, match=message):
        check_registries(load_config(p.config([entry])))


@pytest.mark.parametrize("code,message", [
    ("x = 1\n", r"plugins\[0\]: 'fr_bad' registered nothing"),
    ("import fedray\n\n1 / 0\n", r"plugins\[0\]: importing 'fr_bad' failed: ZeroDivisionError: division by zero "
                                  r"\(.*fr_bad.py:3\)"),
    ("import fr_missing_dependency\n", r"importing 'fr_bad' failed: ModuleNotFoundError: No module named "
                                        r"'fr_missing_dependency'"),
    ("import fedray\nfedray.register_model('fedavg_cnn', lambda inp, nc: None)\n",
     r"plugins\[0\]: importing 'fr_bad' failed: RegistryError: model 'fedavg_cnn' is registered by "
     r"fedray.models.registry \(built-in\); fr_bad cannot register it again"),
    (ALGO.format(name="fedavg"), r"algorithm 'fedavg' is registered by fedray.algorithms.fedavg \(built-in\); "
                                 r"fr_bad cannot"),
    ("from fedray.models import MODELS\nMODELS['fedavg_cnn'] = None\n",
     r"importing 'fr_bad' failed: TypeError: the model registry is read-only"),
])
def test_bad_plugin_modules_fail_naming_the_entry(plugins, tmp_path, code, message):
    p = plugins(tmp_path)
    p.module("fr_bad", code)
    with pytest.raises(ConfigError, match=message):
        check_registries(load_config(p.config(["fr_bad"])))


def test_two_plugins_claiming_one_name_are_refused(plugins, tmp_path):
    p = plugins(tmp_path)
    p.module("fr_one", ALGO.format(name="fr_same"))
    p.module("fr_two", ALGO.format(name="fr_same"))
    with pytest.raises(ConfigError, match=r"plugins\[1\]: importing 'fr_two' failed: RegistryError: algorithm "
                                          r"'fr_same' is registered by fr_one; fr_two cannot register it again"):
        check_registries(load_config(p.config(["fr_one", "fr_two"], algorithm={"name": "fr_same"})))


def test_a_process_with_other_code_fails_naming_its_node(plugins, tmp_path):
    import socket

    p = plugins(tmp_path)
    p.module("fr_node", ALGO.format(name="fr_node"))
    cfg = load_config(p.config(["fr_node"]))
    with pytest.raises(ConfigError, match=rf"plugins\[0\]: node {socket.gethostname()} imported 'fr_node' from .* "
                                          r"with digest sha256:\w+, but the run's driver hashed sha256:0"):
        plugin_loader.load(cfg.plugins, {"fr_node": "sha256:0"}, cfg.plugin_roots)


def test_an_edited_plugin_is_imported_again_in_the_same_process(plugins, tmp_path):
    """A notebook's second run after an edit runs the edited code, not the module already imported."""
    from fedray.algorithms import ALGORITHMS

    p = plugins(tmp_path)
    p.module("fr_edit", ALGO.format(name="fr_v1"))
    check_registries(load_config(p.config(["fr_edit"], algorithm={"name": "fr_v1"})))
    assert ALGORITHMS.module("fr_v1") == "fr_edit"
    p.module("fr_edit", ALGO.format(name="fr_v2"))
    check_registries(load_config(p.config(["fr_edit"], algorithm={"name": "fr_v2"})))
    assert "fr_v2" in ALGORITHMS and "fr_v1" not in ALGORITHMS


def test_a_ray_driver_imports_data_plugins_only(plugins, tmp_path):
    """The driver imports the plugins only when the data source or the partitioner is the user's (it runs them);
    models and algorithms are imported by the actors."""
    import sys

    from fedray.plugins import check_driver

    p = plugins(tmp_path)
    p.module("fr_algo", ALGO.format(name="fr_algo"))
    check_driver(load_config(p.config(["fr_algo"], algorithm={"name": "fr_algo"})))
    assert "fr_algo" not in sys.modules
    p.module("fr_part", """
        import numpy as np
        import fedray

        @fedray.register_partitioner("fr_halves")
        def halves(labels, num_clients, rng_seed, domains, natural):
            return [np.asarray(b) for b in np.array_split(np.arange(len(labels)), num_clients)]
    """)
    cfg = load_config(p.config(["fr_part"], data={"partition": {"name": "fr_halves", "num_clients": 4}},
                               train={"clients_per_round": 2}))
    check_driver(cfg)
    assert "fr_part" in sys.modules
    from fedray.data.partition import PARTITIONERS

    assert PARTITIONERS.module("fr_halves") == "fr_part"


def test_entry_points_load_only_when_named(plugins, tmp_path, monkeypatch):
    """An installed distribution's ``fedray.plugins`` entry point is found by its name (as ``pytest -p``), never
    loaded by being installed."""
    import importlib.metadata as md
    import sys

    p = plugins(tmp_path)
    site = tmp_path / "site"
    site.mkdir()
    (site / "fr_installed.py").write_text(textwrap.dedent(ALGO.format(name="fr_ep")))
    dist = site / "fr_installed-1.2.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: fr-installed\nVersion: 1.2\n")
    (dist / "entry_points.txt").write_text("[fedray.plugins]\nfr-ep = fr_installed\n")
    (dist / "top_level.txt").write_text("fr_installed\n")
    monkeypatch.syspath_prepend(str(site))
    cfg = load_config(p.config(["fr-ep"], algorithm={"name": "fr_ep"}))
    assert cfg.plugin_code and "fr_installed" in cfg.plugin_code and "fr_installed" not in sys.modules
    try:
        check_registries(cfg)
        assert plugin_loader.provenance(cfg.plugin_code, cfg.plugin_roots)["fr_installed"]["version"] == "1.2"
        assert md.version("fr-installed") == "1.2"
    finally:
        plugin_loader._forget("fr_installed")


def test_what_a_run_joining_a_cluster_ships(plugins, tmp_path, monkeypatch):
    """py_modules: the plugins outside the working directory and outside installed distributions; a worker on a
    node without the recorded directory imports the shipped copy (found on its sys.path), checked by digest."""
    import sys

    p = plugins(tmp_path / "proj")
    p.module("fr_ship", ALGO.format(name="fr_ship"), package=True)
    cfg = load_config(p.config(["fr_ship"], algorithm={"name": "fr_ship"}))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    assert plugin_loader.py_modules(cfg.plugins, cfg.plugin_code, cfg.plugin_roots, cwd=str(elsewhere)) == \
        [str(tmp_path / "proj" / "fr_ship")]
    assert plugin_loader.py_modules(cfg.plugins, cfg.plugin_code, cfg.plugin_roots, cwd=str(tmp_path / "proj")) == []
    monkeypatch.setattr(plugin_loader, "_package_limit", lambda: 10)
    with pytest.raises(ConfigError, match=r"plugins\[0\]: 'fr_ship' .* holds 0 MiB, more than the 0 MiB Ray ships"):
        plugin_loader.py_modules(cfg.plugins, cfg.plugin_code, cfg.plugin_roots, cwd=str(elsewhere))
    # a node where the recorded directory does not exist: the copy on its sys.path (what py_modules unpacks)
    shipped = tmp_path / "unpacked"
    import shutil

    shutil.copytree(tmp_path / "proj" / "fr_ship", shipped / "fr_ship")
    monkeypatch.syspath_prepend(str(shipped))
    plugin_loader.load(cfg.plugins, cfg.plugin_code, {"fr_ship": str(tmp_path / "gone")})
    assert sys.modules["fr_ship"].__file__ == str(shipped / "fr_ship" / "__init__.py")
