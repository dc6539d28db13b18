"""Dequantised GGUF weights cached as safetensors, so the second load skips dequantisation.

Layout: ``$SPECSERVE_CACHE_DIR/weights/<stem>-<key>/`` holding ``arch.json``, ``tokenizer/``
and one ``model.<dtype>.safetensors`` per requested dtype. ``key`` hashes the GGUF file's
resolved path, size and mtime (no need to read 1 GB to hash it), plus a format version.

Why one file per dtype: GGUF weights are dequantised to fp32 (block scales are fp16, quants
small integers; the results need more mantissa than bf16 has). An fp32 request reads the fp32
file and gets bit-identical weights to a fresh dequantisation; a bf16
request reads a bf16 file holding exactly ``fp32.to(bfloat16)``, the same rounding a fresh
load does, at half the bytes. Files are memory-mapped (copy-on-write), so loading is cheap and
several processes share the page cache.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import json
import mmap
import os
import struct
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

from specserve.loading.errors import CorruptModelError
from specserve.models.arch import ArchConfig
from specserve.paths import weights_dir

FORMAT_VERSION = 1
_DTYPE_NAMES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}
_ST_DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}


def dtype_name(dtype: torch.dtype) -> str:
    try:
        return _DTYPE_NAMES[dtype]
    except KeyError:
        raise ValueError(
            f"unsupported weight dtype {dtype}; use float32, bfloat16 or float16"
        ) from None


def cache_dir_for(gguf_path: Path) -> Path:
    """The cache directory of one GGUF file (not created)."""
    st = gguf_path.stat()
    ident = f"{FORMAT_VERSION}|{gguf_path.resolve()}|{st.st_size}|{st.st_mtime_ns}"
    key = hashlib.sha256(ident.encode()).hexdigest()[:20]
    return weights_dir() / f"{gguf_path.stem}-{key}"


def weights_file(directory: Path, dtype: torch.dtype) -> Path:
    return directory / f"model.{dtype_name(dtype)}.safetensors"


@contextlib.contextmanager
def cache_lock(directory: Path) -> Iterator[None]:
    """Exclusive lock so that concurrent processes dequantise a file only once."""
    directory.parent.mkdir(parents=True, exist_ok=True)
    with open(directory.with_name(directory.name + ".lock"), "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _atomic_write_text(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.replace(tmp, path)


def save_arch(directory: Path, arch: ArchConfig) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    _atomic_write_text(directory / "arch.json", json.dumps(dataclasses.asdict(arch), indent=1))


def load_arch(directory: Path) -> ArchConfig:
    raw = json.loads((directory / "arch.json").read_text())
    raw["eos_token_ids"] = tuple(raw["eos_token_ids"])
    return ArchConfig(**raw)


_ST_NAMES = {v: k for k, v in _ST_DTYPES.items()}
_ALIGN = 64  # cache-line alignment of the tensor data, so vector loads never straddle lines


def save_weights(path: Path, state: dict[str, torch.Tensor]) -> None:
    """Write ``state`` as safetensors, atomically (a temporary file, then rename).

    The header is padded with spaces (valid JSON whitespace) so the data starts on a 64-byte
    boundary; with hidden sizes that are multiples of 32 every tensor is then cache-line
    aligned when memory-mapped, as freshly allocated tensors are.
    """
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    tensors = {k: v.contiguous() for k, v in state.items()}
    for name, t in tensors.items():
        nbytes = t.numel() * t.element_size()
        header[name] = {
            "dtype": _ST_NAMES[t.dtype],
            "shape": list(t.shape),
            "data_offsets": [offset, offset + nbytes],
        }
        offset += nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-(8 + len(raw)) % _ALIGN)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(struct.pack("<Q", len(raw)))
            fh.write(raw)
            for t in tensors.values():
                fh.write(t.reshape(-1).view(torch.uint8).numpy().data)
        os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)


def _mapped(path: Path) -> tuple[torch.Tensor, int, dict[str, dict]]:  # type: ignore[type-arg]
    """A safetensors file memory-mapped copy-on-write: (its bytes, the offset of the data, the
    tensor entries of its header), every entry checked to lie inside the file."""
    with open(path, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        if size < 8:
            raise CorruptModelError(f"{path} is not a safetensors file")
        buf = mmap.mmap(fh.fileno(), size, access=mmap.ACCESS_COPY)
    (header_len,) = struct.unpack("<Q", buf[:8])
    try:
        header = json.loads(bytes(buf[8 : 8 + header_len]))
    except ValueError as e:
        raise CorruptModelError(f"{path}: unreadable safetensors header: {e}") from e
    base = 8 + header_len
    entries = {k: v for k, v in header.items() if k != "__metadata__"}
    for name, info in entries.items():
        if base + info["data_offsets"][1] > size:
            raise CorruptModelError(f"{path}: tensor {name!r} runs past the end of the file")
    return torch.frombuffer(buf, dtype=torch.uint8), base, entries


def load_weights_mmap(path: Path) -> dict[str, torch.Tensor]:
    """Tensors of a safetensors file, memory-mapped copy-on-write (no read until touched)."""
    return read_weights(path, lambda shape, dtype: torch.empty(shape, dtype=dtype), lambda _: False)


def read_weights(
    path: Path,
    empty: Callable[[tuple[int, ...], torch.dtype], torch.Tensor],
    which: Callable[[str], bool],
) -> dict[str, torch.Tensor]:
    """Tensors of a safetensors file: those named by ``which`` read into memory from
    ``empty(shape, dtype)`` (e.g. huge pages, models/native/huge_pages.py), each its own, so
    the file's pages under them never count in the process's resident memory beside the
    copies; the others memory-mapped copy-on-write (read as touched: an embedding table's
    rows)."""
    data, base, entries = _mapped(path)
    out: dict[str, torch.Tensor] = {}
    with open(path, "rb") as fh:
        for name, info in entries.items():
            begin, end = info["data_offsets"]
            dtype = _ST_DTYPES[info["dtype"]]
            if not which(name):
                out[name] = data[base + begin : base + end].view(dtype).view(info["shape"])
                continue
            t = empty(tuple(info["shape"]), dtype)
            raw = memoryview(t.view(-1).view(torch.uint8).numpy())  # type: ignore[arg-type]
            fh.seek(base + begin)
            if raw.nbytes != end - begin or fh.readinto(raw) != raw.nbytes:
                raise CorruptModelError(f"{path}: tensor {name!r} has the wrong size")
            out[name] = t
    return out
