"""Devices are checked before anything loads: a malformed or missing device is a clear error
from the configuration, the loader and each command that takes ``--device``."""

from __future__ import annotations

import pytest
import torch

from specserve.cli import main
from specserve.config import ModelConfig, check_device
from specserve.loading import load_model
from specserve.loading.spec_heads import default_aux_layer_ids

no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")


def test_cpu_is_accepted() -> None:
    assert check_device("cpu") == torch.device("cpu")
    assert ModelConfig("m", device="cpu").device == "cpu"


@pytest.mark.parametrize(
    ("device", "says"),
    [
        ("cuda:x", "invalid device 'cuda:x'"),
        ("gpu", "invalid device 'gpu'"),
        ("meta", "only cpu and cuda devices"),
    ],
)
def test_malformed_or_unsupported_devices(device: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        check_device(device)
    with pytest.raises(ValueError, match=says):
        ModelConfig("m", device=device)


@no_cuda
def test_cuda_without_a_gpu_says_so_before_loading() -> None:
    with pytest.raises(ValueError, match="sees no CUDA device; use --device cpu"):
        load_model("no-such-model", device="cuda")  # the device is checked first
    # A configuration may name a GPU it will run on elsewhere (deploy manifests are
    # rendered and checked on machines without one).
    assert ModelConfig("m", device="cuda:1").device == "cuda:1"
    assert check_device("cuda", available=False) == torch.device("cuda")


@no_cuda
@pytest.mark.parametrize(
    "argv",
    [
        ["generate", "--model", "no-such-model", "--prompt", "x", "--device", "cuda"],
        ["serve", "--model", "no-such-model", "--device", "cuda"],
        ["train-draft", "--method", "eagle", "--model", "no-such-model", "--device", "cuda:1"],
    ],
)
def test_commands_refuse_a_missing_gpu(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) != 0
    assert "sees no CUDA device" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("layers", "ids"), [(28, (2, 14, 25)), (7, (2, 3, 4)), (6, (0, 3, 6)), (2, (0, 1, 2))]
)
def test_eagle_layers_are_distinct_for_any_depth(layers: int, ids: tuple[int, ...]) -> None:
    assert default_aux_layer_ids(layers) == ids
    with pytest.raises(ValueError, match=">= 2 layers"):
        default_aux_layer_ids(1)
