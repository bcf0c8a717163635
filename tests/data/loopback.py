"""A real HTTP server on 127.0.0.1 for the download tests (tests/data/test_fetch.py), and small dataset files
made here: MNIST-like IDX files, a CIFAR-10-like pickle archive, a Tiny-ImageNet-like zip, a CINIC-10-like tar."""

from __future__ import annotations

import gzip
import hashlib
import io
import pickle
import socket
import struct
import tarfile
import threading
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np


class Loopback:
    """``files``: URL path -> bytes. Answers ``Range: bytes=N-`` with 206 (unless ``ranges`` is off: then 200 and
    the whole file); a path in ``cut`` is answered once with its full Content-Length but only half its bytes, then
    the connection is closed. ``requests`` records (path, Range header) of every request."""

    def __init__(self, files: dict[str, bytes] | None = None):
        self.files = dict(files or {})
        self.requests: list[tuple[str, str | None]] = []
        self.cut: set[str] = set()
        self.ranges = True
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                rng = self.headers.get("Range")
                owner.requests.append((self.path, rng))
                data = owner.files.get(self.path)
                if data is None:
                    self.send_error(404)
                    return
                start = int(rng.removeprefix("bytes=").split("-")[0]) if rng and owner.ranges else 0
                if start >= len(data) and start:
                    self.send_error(416)
                    return
                self.send_response(206 if start else 200)
                if start:
                    self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
                self.send_header("Content-Length", str(len(data) - start))
                self.end_headers()
                body = data[start:]
                if self.path in owner.cut:
                    owner.cut.discard(self.path)
                    body = body[: len(body) // 2]
                self.wfile.write(body)
                self.wfile.flush()

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def hits(self, path: str) -> list[str | None]:
        return [r for p, r in self.requests if p == path]

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def dead_url() -> str:
    """A loopback URL nothing listens on: connecting is refused at once."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return f"http://127.0.0.1:{port}"


def sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _idx(arr: np.ndarray) -> bytes:
    return struct.pack(">BBBB", 0, 0, 8, arr.ndim) + struct.pack(">" + "I" * arr.ndim, *arr.shape) + arr.tobytes()


def mnist_files(n_train: int = 60, n_test: int = 20, seed: int = 0) -> dict[str, bytes]:
    """The four gzipped IDX files of a tiny MNIST-like dataset (28x28 uint8, labels 0..9)."""
    rng = np.random.default_rng(seed)
    arrays = {"train-images-idx3-ubyte.gz": rng.integers(0, 256, (n_train, 28, 28), dtype=np.uint8),
              "train-labels-idx1-ubyte.gz": (np.arange(n_train) % 10).astype(np.uint8),
              "t10k-images-idx3-ubyte.gz": rng.integers(0, 256, (n_test, 28, 28), dtype=np.uint8),
              "t10k-labels-idx1-ubyte.gz": (np.arange(n_test) % 10).astype(np.uint8)}
    return {name: gzip.compress(_idx(a), mtime=0) for name, a in arrays.items()}


def _tar(members: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as t:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def cifar10_archive(n: int = 20) -> bytes:
    """``cifar-10-python.tar.gz`` in the published layout: one train batch, the test batch and batches.meta."""
    rng = np.random.default_rng(1)

    def batch(k):
        return pickle.dumps({b"labels": [i % 10 for i in range(k)],
                             b"data": rng.integers(0, 256, (k, 3072), dtype=np.uint8)}, protocol=2)

    meta = pickle.dumps({b"label_names": [f"c{i}".encode() for i in range(10)]}, protocol=2)
    return _tar({"cifar-10-batches-py/data_batch_1": batch(n), "cifar-10-batches-py/test_batch": batch(10),
                 "cifar-10-batches-py/batches.meta": meta})


def _png(rng, size=4) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8)).save(buf, format="PNG")
    return buf.getvalue()


def cinic_archive() -> bytes:
    """``CINIC-10.tar.gz`` as published: train/, valid/, test/ at the top, one folder per class."""
    rng = np.random.default_rng(2)
    return _tar({f"{split}/{c}/{i}.png": _png(rng) for split in ("train", "valid", "test") for c in ("cat", "dog")
                 for i in range(2)})


def tiny_imagenet_zip() -> bytes:
    """``tiny-imagenet-200.zip`` in its published layout, two classes of two images each."""
    rng = np.random.default_rng(3)
    wnids = ["n001", "n002"]
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("tiny-imagenet-200/wnids.txt", "\n".join(wnids) + "\n")
        ann = []
        for k, w in enumerate(wnids):
            for i in range(2):
                z.writestr(f"tiny-imagenet-200/train/{w}/images/{w}_{i}.JPEG", _png(rng, 8))
            z.writestr(f"tiny-imagenet-200/val/images/val_{k}.JPEG", _png(rng, 8))
            ann.append(f"val_{k}.JPEG\t{w}\t0\t0\t8\t8")
        z.writestr("tiny-imagenet-200/val/val_annotations.txt", "\n".join(ann) + "\n")
    return buf.getvalue()
