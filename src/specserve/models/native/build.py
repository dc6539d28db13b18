"""Build and load specserve's native CPU op library (``csrc/``) on first use.

``torch.utils.cpp_extension.load`` compiles the sources — the int4, int8-group and bf16
matmuls, the fused decoder layers, a draft's screened LM head and the AVX2 helpers they
share — (``-O3 -march=native``,
against torch's C++ headers: a few seconds) into
``$SPECSERVE_CACHE_DIR/kernels/int4_gemv-<key>/``.
The key hashes the sources and headers, the flags, the torch and Python versions and this CPU's
model and flags, so a cache shared between machines never loads a library built for another
CPU; later processes only load it. The ops register as ``torch.ops.specserve.*``; their
shape-only fakes let ``torch.compile`` trace through them. What the ops compute, and when they
are used, is in ``int4_native.py``, ``int8_native.py``, ``bf16_native.py`` and
``fused_layer.py``. Every op needs AVX2, FMA and F16C (:data:`REQUIRED_CPU_FLAGS`).
"""

from __future__ import annotations

import hashlib
import logging
import os
import platform
import shutil
import sys
import time
from pathlib import Path

import torch

from specserve.paths import cache_root

logger = logging.getLogger(__name__)

CSRC = Path(__file__).parent / "csrc"
# One library: the int4, int8-group and bf16 matmuls, the fused decoder layers
# (models/native/fused_layer.py) that call them, and a draft's screened LM head
# (models/native/head_screen.py).
SOURCES = (
    CSRC / "int4_gemv.cpp",
    CSRC / "int8_gemv.cpp",
    CSRC / "bf16_gemm.cpp",
    CSRC / "decoder_layer.cpp",
    CSRC / "quant_amx.cpp",
    CSRC / "head_screen.cpp",
)
HEADERS = (
    CSRC / "int4_gemv.h",
    CSRC / "int8_gemv.h",
    CSRC / "bf16_gemm.h",
    CSRC / "simd.h",
    CSRC / "amx_tiles.h",
    CSRC / "code_pairs.h",
    CSRC / "quant_amx.h",
    CSRC / "int8_x.h",
    CSRC / "key_lanes.h",
    CSRC / "attention_tiles.h",
)
# The library's matmul ops (all registered once it is loaded).
GEMM_OPS = ("int4_gemm", "int8_gemm", "bf16_gemm")
# -ffp-contract=off: no silent mul+add -> fma contraction, the fp32 operation order stays as
# written in every instantiation (batch invariance).
CFLAGS = ("-O3", "-march=native", "-ffp-contract=off")
# The least every kernel needs (AVX2 + FMA + F16C: Haswell, Zen 1 and later). The int4 matmul
# also has an AVX-512 BF16 / GFNI variant and the bf16 matmul an AVX-512 BF16 one, compiled
# instead of the AVX2 ones where ``-march=native`` provides those instructions.
REQUIRED_CPU_FLAGS = ("avx2", "fma", "f16c")
_STALE_LOCK_S = 600.0  # a build lock older than this is left over from a killed build


def cpu_signature() -> tuple[str, set[str]]:
    """(model name, flags) of this CPU from /proc/cpuinfo ("" and {} where unreadable)."""
    model, flags = "", set[str]()
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or platform.machine(), flags
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and not model:
            model = value.strip()
        elif key == "flags" and not flags:
            flags = set(value.split())
    return model, flags


def _build_dir(model: str, flags: set[str]) -> Path:
    h = hashlib.sha256()
    for part in (
        *(path.read_bytes() for path in (*SOURCES, *HEADERS)),
        " ".join(CFLAGS).encode(),
        torch.__version__.encode(),
        sys.version.encode(),
        platform.machine().encode(),
        model.encode(),
        " ".join(sorted(flags)).encode(),
    ):
        h.update(part)
        h.update(b"\0")
    return cache_root() / "kernels" / f"int4_gemv-{h.hexdigest()[:16]}"


def _ensure_ninja() -> None:
    """Put the ``ninja`` pip package's binary on PATH when none is there already."""
    if shutil.which("ninja"):
        return
    try:
        import ninja  # type: ignore[import-not-found]
    except ImportError:
        return
    os.environ["PATH"] = ninja.BIN_DIR + os.pathsep + os.environ.get("PATH", "")


def op_loaded() -> bool:
    try:
        return all(hasattr(torch.ops.specserve, name) for name in GEMM_OPS)
    except (AttributeError, RuntimeError):
        return False


def load_library() -> str | None:
    """Build (unless cached) and load the op library into this process if this CPU can run
    it; None on success (or when it is loaded already), else why not. Each kernel module
    then runs its own self-test."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return f"needs an x86-64 CPU, this is {platform.machine()}"
    model, flags = cpu_signature()
    if flags:
        missing = [f for f in REQUIRED_CPU_FLAGS if f not in flags]
        if missing:
            return f"this CPU lacks {', '.join(missing)}"
    if not op_loaded():
        start = time.perf_counter()
        try:
            directory = build_and_load(model, flags)
        except Exception as exc:  # no compiler / ninja, compile error, unwritable cache, ...
            return f"build failed: {type(exc).__name__}: {str(exc).strip()[-2000:]}"
        logger.debug("native ops loaded in %.1f s from %s", time.perf_counter() - start, directory)
    return None


def build_and_load(model: str, flags: set[str]) -> Path:
    """Compile (unless the cached build is current) and load the op library; its directory."""
    from torch.utils import cpp_extension

    _ensure_ninja()
    build = _build_dir(model, flags)
    build.mkdir(parents=True, exist_ok=True)
    lock = build / "lock"  # cpp_extension's inter-process build lock
    if lock.exists() and time.time() - lock.stat().st_mtime > _STALE_LOCK_S:
        lock.unlink(missing_ok=True)  # left by a build that was killed
    cpp_extension.load(
        name="specserve_int4_gemv",
        sources=[str(path) for path in SOURCES],
        extra_cflags=list(CFLAGS),
        build_directory=str(build),
        is_python_module=False,
        verbose=False,
    )
    return build


def register_fakes() -> None:
    """Shape-only implementations of the library's ops (the matmuls and the fused decoder
    layers of models/native/fused_layer.py), so ``torch.compile`` can trace through them."""

    def gemm(
        x: torch.Tensor,
        qweight: torch.Tensor,
        scales: torch.Tensor,
        row_scale: torch.Tensor,
        out_features: int,
        group_size: int,
        tiles: int = 1,
    ) -> torch.Tensor:
        return x.new_empty((x.shape[0], out_features))

    def bf16_gemm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        return x.new_empty((x.shape[0], weight.shape[0]))

    def decoder_layer(x: torch.Tensor, *args: object) -> torch.Tensor:
        return x.new_empty(x.shape)

    for name, fake in (
        ("int4_gemm", gemm),
        ("int8_gemm", gemm),
        ("bf16_gemm", bf16_gemm),
        ("int4_decoder_layer", decoder_layer),
        ("bf16_decoder_layer", decoder_layer),
    ):
        try:
            torch.library.register_fake(f"specserve::{name}", fake)
        except RuntimeError as exc:  # registered already (e.g. the module was reloaded)
            logger.debug("fake %s not registered: %s", name, exc)
