"""Every native source compiles for each kernel variant's instruction set, whatever this host
builds.

The library is compiled with ``-march=native``, so a host builds only its own variants (the
AVX2 kernels on an AVX2 CPU, the AVX-512 BF16 / VNNI / AMX ones where the CPU has those), and
a change that breaks another variant's code passes every test of the host it was made on.
These tests compile each source without generating code (``-fsyntax-only``, the build's own
flags otherwise) for an AVX2 CPU (Haswell), an AVX-512F one without BF16 (Skylake-SP) and one
with AVX-512 BF16, VNNI, FP16 and AMX (Sapphire Rapids).
"""

from __future__ import annotations

import shutil
import subprocess
import sysconfig

import pytest
from torch.utils import cpp_extension

from specserve.models.native import build

ARCHS = ("haswell", "skylake-avx512", "sapphirerapids")


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++, as the library build does")
@pytest.mark.parametrize("arch", ARCHS)
def test_every_source_compiles_for_each_variants_instruction_set(arch: str) -> None:
    includes = [f"-I{p}" for p in cpp_extension.include_paths()]
    includes.append(f"-I{sysconfig.get_paths()['include']}")
    flags = [f for f in build.CFLAGS if not f.startswith("-march=")]
    for source in (s for s in build.SOURCES if s.suffix == ".cpp"):
        command = ["g++", "-std=c++20", "-fsyntax-only", f"-march={arch}", *flags, *includes]
        result = subprocess.run([*command, str(source)], capture_output=True, text=True)
        if "bad value" in result.stderr and f"-march={arch}" in result.stderr:
            pytest.skip(f"this g++ does not know -march={arch}")
        assert result.returncode == 0, f"{source.name}, -march={arch}:\n{result.stderr[-4000:]}"
