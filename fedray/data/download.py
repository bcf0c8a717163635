"""The transfer behind :func:`fedray.data.fetch.fetch`: resumable HTTP downloads, checksums, atomic unpacking.

Under ``<root>/.fedray-downloads/`` (one exclusive lock per dataset, so two processes never fetch the same one
at once) every file is downloaded as ``<name>.part``: a transfer cut short is continued from where it stopped
(an HTTP ``Range`` request; a server that answers with the whole file starts it over), first at the same URL,
then at the next. A complete file is renamed ``<name>`` only once its digest equals the published one; a file
with another digest is refused (:class:`FetchError` naming the file, the URL and both digests) and moved aside as
``<name>.bad``, never unpacked. Unpacking writes into a temporary folder beside the final one and renames it
into place, so the layout the loader reads is either complete or absent; a verified archive is kept until its
unpacking has succeeded, so an interrupted unpacking costs no second download.
"""

from __future__ import annotations

import hashlib
import http.client
import os
import shutil
import tarfile
import tempfile
import urllib.error
import urllib.request
import zipfile
from pathlib import Path

from fedray.reporting.progress import bars_on

from .table import DataError

__all__ = ["FetchError", "download_file", "file_digest", "parse_digest", "unpack"]

CHUNK = 1 << 20
TIMEOUT_S = 30.0  # per connection attempt and per read
TRIES_PER_URL = 3  # transfers at one URL while each one makes progress


class FetchError(DataError):
    """A dataset could not be fetched: no URL answered, a checksum differed, an archive was not the layout."""


class _Cut(Exception):
    """A transfer that ended before its announced length (the part file keeps what arrived)."""


def file_digest(path: Path, algo: str) -> str:
    h = hashlib.new(algo)
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


def parse_digest(text: str, where: str) -> tuple[str, str]:
    algo, _, hexd = text.partition(":")
    algo, hexd = algo.strip().lower(), hexd.strip().lower()
    if algo not in ("md5", "sha256") or not hexd or any(c not in "0123456789abcdef" for c in hexd) \
            or len(hexd) != (32 if algo == "md5" else 64):
        raise FetchError(f"{where}: expected md5:<32 hex digits> or sha256:<64 hex digits>, got {text!r}")
    return algo, hexd


def _open(url: str, offset: int):
    headers = {"User-Agent": "fedray-data-fetch"}
    if offset:
        headers["Range"] = f"bytes={offset}-"
    return urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=TIMEOUT_S)


def _transfer(url: str, part: Path, name: str, log, progress: bool) -> None:
    """One request for ``url`` into ``part``, continuing it when it holds a part already."""
    offset = part.stat().st_size if part.exists() else 0
    try:
        resp = _open(url, offset)
    except urllib.error.HTTPError as e:
        if e.code == 416 and offset:  # nothing after the bytes we have: the part is the whole file
            return
        raise
    with resp:
        if offset and resp.status == 206:
            start = (resp.headers.get("Content-Range") or "").removeprefix("bytes ").split("-")[0]
            if start != str(offset):  # another range than asked for: this URL cannot continue the part
                part.unlink()
                raise _Cut(f"asked for bytes {offset}- and got {resp.headers.get('Content-Range')!r}")
        elif offset:  # the whole file (a server without ranges): start over
            offset = 0
        length = resp.headers.get("Content-Length")
        total = offset + int(length) if length is not None else None
        size = "" if total is None else f" ({total / 1e6:.1f} MB)" if total >= 100_000 else f" ({total:,} bytes)"
        log(f"[fedray] resuming {url} at byte {offset:,}{size}" if offset else f"[fedray] downloading {url}{size}")
        bar = None
        if bars_on(progress):  # on a terminal, as fedray's other long commands
            from tqdm import tqdm

            bar = tqdm(total=total, initial=offset, unit="B", unit_scale=True, unit_divisor=1024, desc=name,
                       dynamic_ncols=True, disable=False)
        try:
            with open(part, "ab" if offset else "wb") as f:
                while chunk := resp.read(CHUNK):
                    f.write(chunk)
                    if bar is not None:
                        bar.update(len(chunk))
        except (TimeoutError, http.client.IncompleteRead, ConnectionError) as e:
            raise _Cut(f"transfer cut at byte {part.stat().st_size:,}: {e}") from None
        finally:
            if bar is not None:
                bar.close()
        if total is not None and part.stat().st_size < total:
            raise _Cut(f"transfer ended at byte {part.stat().st_size:,} of {total:,}")


def _fetch_from(url: str, part: Path, name: str, log, progress: bool) -> str | None:
    """Transfer ``url`` into ``part`` (retrying while each cut transfer brought more bytes); None when complete,
    else why this URL failed."""
    for _ in range(TRIES_PER_URL):
        before = part.stat().st_size if part.exists() else 0
        try:
            _transfer(url, part, name, log, progress)
            return None
        except _Cut as e:
            reason = str(e)
            if (part.stat().st_size if part.exists() else 0) <= before:
                return reason
            log(f"[fedray] {name}: {reason}; resuming")
        except urllib.error.HTTPError as e:
            return f"HTTP {e.code} {e.reason}"
        except (urllib.error.URLError, OSError, http.client.HTTPException) as e:
            return str(getattr(e, "reason", None) or e)
    return reason


def download_file(urls: list[str], dest: Path, digest: str, log=print, progress: bool = True) -> Path:
    """``dest`` downloaded from the first of ``urls`` that serves it, with the checksum ``digest``
    (``"md5:<hex>"``): resumed from ``dest.part`` if an earlier transfer left one; refused (FetchError, the
    file moved aside to ``dest.bad``) if its digest differs. A verified ``dest`` already there is reused."""
    algo, want = parse_digest(digest, f"checksum of {dest.name}")
    if dest.is_file():
        if file_digest(dest, algo) == want:
            return dest
        dest.unlink()
    part = dest.with_name(dest.name + ".part")
    errors = []
    for url in urls:
        why = _fetch_from(url, part, dest.name, log, progress)
        if why is None:
            got = file_digest(part, algo)
            if got != want:
                bad = dest.with_name(dest.name + ".bad")
                os.replace(part, bad)
                raise FetchError(f"checksum mismatch for {dest.name} from {url}: expected {algo} {want}, got {algo} "
                                 f"{got}; the file was not used (kept aside as {bad})")
            os.replace(part, dest)
            return dest
        errors.append(f"{url}: {why}")
        log(f"[fedray] {dest.name}: {url}: {why}" + ("; trying the next URL" if url != urls[-1] else ""))
    kept = f"; the {part.stat().st_size:,} bytes received are kept in {part} and resumed next time" \
        if part.exists() and part.stat().st_size else ""
    raise FetchError(f"cannot download {dest.name}: every URL failed ({'; '.join(errors)}){kept}. Set "
                     f"FEDRAY_DATA_MIRRORS (or data.mirrors / --mirror) to a mirror that serves it")


def _extract_tar(t: tarfile.TarFile, tmp: Path, archive: Path) -> None:
    if hasattr(tarfile, "data_filter"):  # Python >= 3.10.12 / 3.11.4
        t.extractall(tmp, filter="data")  # no absolute paths, no links out, no devices
        return
    for m in t.getmembers():
        p = Path(m.name)
        if p.is_absolute() or ".." in p.parts or not (m.isfile() or m.isdir()):
            raise FetchError(f"{archive}: member {m.name!r} is not a plain file or folder inside the dataset folder; "
                             f"refused")
    t.extractall(tmp)


def _safe_zip_names(z: zipfile.ZipFile, archive: Path) -> None:
    for name in z.namelist():
        p = Path(name)
        if p.is_absolute() or ".." in p.parts:
            raise FetchError(f"{archive}: member {name!r} would be written outside the dataset folder; refused")


def _locate(tmp: Path, spec, has_layout) -> Path | None:
    """The unpacked folder that holds ``spec``'s layout: ``top``, the whole content, or its only folder."""
    folders = [p for p in tmp.iterdir() if p.is_dir()]
    cands = [tmp / spec.top] if spec.top else [tmp, *(folders if len(folders) == 1 else [])]
    return next((c for c in cands if c.is_dir() and has_layout(c)), None)


def unpack(spec, files: list[Path], root: Path, has_layout) -> Path:
    """Put the verified ``files`` of ``spec`` (a :class:`~fedray.data.fetch.FetchSpec`) into ``root / spec.target``
    through a temporary folder in ``root`` renamed into place: the target is complete or absent, whatever happens on
    the way. ``has_layout(folder)``: whether ``folder`` itself holds the layout."""
    final = root / spec.target
    tmp = Path(tempfile.mkdtemp(prefix=f".fedray-unpack-{spec.source}-", dir=root))
    try:
        for f in files:
            if spec.unpack == "files":
                shutil.copyfile(f, tmp / f.name)
            elif spec.unpack == "tar":
                with tarfile.open(f) as t:
                    _extract_tar(t, tmp, f)
            else:
                with zipfile.ZipFile(f) as z:
                    _safe_zip_names(z, f)
                    z.extractall(tmp)
        layout = _locate(tmp, spec, has_layout)
        if layout is None:
            raise FetchError(f"{', '.join(f.name for f in files)}: unpacked, but no {spec.source} layout inside "
                             f"(expected {spec.top or 'its files'} with {[g[0] for g in spec.needs]})")
        final.parent.mkdir(parents=True, exist_ok=True)
        os.rename(layout, final)
    except (tarfile.TarError, zipfile.BadZipFile, EOFError) as e:
        raise FetchError(f"cannot unpack {', '.join(f.name for f in files)}: {e}") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final
