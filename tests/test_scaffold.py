"""``fedray new NAME``: the project it writes passes its own tests as written and runs with ``fedray run``;
bad names and existing directories are refused with nothing written."""

from __future__ import annotations

import subprocess
import sys

import pytest

from fedray.config import ConfigError
from fedray.scaffold import new_project


def test_the_new_project_passes_its_own_tests_and_runs(tmp_path):
    r = subprocess.run([sys.executable, "-m", "fedray", "new", "fr_newmethod", "--dir", str(tmp_path)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    root = tmp_path / "fr_newmethod"
    assert sorted(p.name for p in root.iterdir()) == ["README.md", "exp.yaml", "fr_newmethod", "test_fr_newmethod.py"]
    tests = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"], cwd=root,
                           capture_output=True, text=True, timeout=300)
    assert tests.returncode == 0 and "2 passed" in tests.stdout, tests.stdout[-3000:] + tests.stderr[-2000:]
    run = subprocess.run([sys.executable, "-m", "fedray", "run", str(root / "exp.yaml"), "engine.backend=local",
                          "train.rounds=1", f"output.root={tmp_path / 'runs'}", "-q"],
                         capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "run directory: " + str(tmp_path / "runs" / "fr_newmethod-") in run.stdout


@pytest.mark.parametrize("name,message", [("Bad-Name", "lower-case Python identifier"), ("class", "identifier"),
                                          ("json", "importable already")])
def test_bad_names_are_refused(tmp_path, name, message):
    with pytest.raises(ConfigError, match=message):
        new_project(name, tmp_path)
    assert not list(tmp_path.iterdir())


def test_an_existing_directory_is_not_touched(tmp_path):
    (tmp_path / "fr_taken").mkdir()
    (tmp_path / "fr_taken" / "mine.txt").write_text("keep")
    with pytest.raises(ConfigError, match="exists; nothing was written"):
        new_project("fr_taken", tmp_path)
    assert [p.name for p in (tmp_path / "fr_taken").iterdir()] == ["mine.txt"]
