"""Check an EAGLE-3 head directory against the real ``speculators`` package (0.9.0).

specserve writes EAGLE-3 heads in the ``speculators`` format (``specserve.loading.spec_heads``)
so that vLLM and ``speculators`` load them. This script checks that claim with the package
itself, without putting it (or its pins: transformers<=5.19, torchvision, ...) into the
project's environment:

1. It installs ``speculators==0.9.0`` and the few packages it imports at import time into a
   private folder with ``pip install --no-deps --target`` (default
   ``$SPECSERVE_CACHE_DIR/speculators-0.9.0``, else ``~/.cache/specserve/speculators-0.9.0``),
   once; later runs reuse it.
2. In a subprocess with ``PYTHONPATH`` set to that folder (this process never imports
   ``speculators``) it parses the head's ``config.json`` with ``SpeculatorModelConfig``
   (it must give an ``Eagle3SpeculatorConfig`` whose fields equal the file's), loads the
   directory with ``SpeculatorModel.from_pretrained`` and compares every tensor the package
   loaded with ``model.safetensors`` exactly, and checks the vocabulary map the way
   ``speculators`` reads it (``target = draft + d2t[draft]``, ``t2d.sum() == draft_vocab``).

The verifier named in the head is not needed: the check loads with a config whose verifier
``name_or_path`` is None (``speculators`` would otherwise fetch the verifier's weights and
config); the head directory is never modified.

    python benchmarks/speculators_roundtrip.py                 # a tiny random head
    python benchmarks/speculators_roundtrip.py --head DIR      # a head on disk
    python benchmarks/speculators_roundtrip.py --head DIR --target-config TARGET_DIR

``--target-config`` (a Hugging Face ``config.json`` or its folder) also checks the head's
layer ids with ``speculators``' ``resolve_target_layer_ids`` and its widths and vocabulary
against that target. Exit status 0 when every check passes, 1 otherwise (2: the package
could not be installed).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

SPECULATORS_VERSION = "0.9.0"
# speculators itself plus what `import speculators` and `from_pretrained` import at run time
# (hs_connectors at import; loguru in utils/loading.py; datasets via models/eagle3/data.py, and
# the modules datasets imports at import). Everything else it declares (torch, transformers,
# pydantic, numpy, safetensors, huggingface_hub, fsspec, ...) comes from the project's venv.
PINNED = (
    f"speculators=={SPECULATORS_VERSION}",
    "hs-connectors==0.9.0",
    "loguru==0.7.3",
    "datasets==5.1.0",
    "multiprocess==0.70.19",
    "dill==0.4.1",
    "pandas==3.1.1",
    "python-dateutil==4.0.0",
    "pyarrow==26.0.1",
    "xxhash==4.1.0",
)
MARKER = ".specserve-install.json"
NETWORK_ERRORS = re.compile(
    r"NewConnectionError|ConnectTimeout|ReadTimeout|Max retries exceeded|Name or service not "
    r"known|Temporary failure in name resolution|Network is unreachable|Connection refused|"
    r"ProxyError|SSLError|Could not fetch URL",
)


class InstallError(RuntimeError):
    """pip could not install the pinned packages."""


class PyPIUnreachable(InstallError):
    """pip could not reach the package index (offline machine)."""


def default_install_dir() -> Path:
    env = os.environ.get("SPECSERVE_CACHE_DIR")
    root = Path(env).expanduser() if env else Path.home() / ".cache" / "specserve"
    return root / f"speculators-{SPECULATORS_VERSION}"


def _installed(path: Path) -> bool:
    try:
        return json.loads((path / MARKER).read_text()).get("packages") == list(PINNED)
    except (OSError, ValueError, AttributeError):
        return False


def ensure_install(path: Path | None = None, log: Any = print) -> Path:
    """The private install folder, created with ``pip install --no-deps --target`` unless a
    complete one (same pins) is there already.

    Raises:
        PyPIUnreachable: pip could not reach the index (the message quotes pip).
        InstallError: pip failed for another reason.
    """
    path = (path or default_install_dir()).expanduser().resolve()
    if _installed(path):
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    cmd = [
        sys.executable, "-m", "pip", "install", "--no-deps", "--only-binary=:all:",
        "--disable-pip-version-check", "--no-input", "--timeout", "20", "--retries", "1",
        "--target", str(tmp), *PINNED,
    ]  # fmt: skip
    log(f"installing into {path}: {' '.join(cmd[1:])}")
    start = time.monotonic()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            output = (proc.stdout + proc.stderr).strip()
            tail = "\n".join(output.splitlines()[-15:])
            kind = PyPIUnreachable if NETWORK_ERRORS.search(output) else InstallError
            what = "could not reach the package index" if kind is PyPIUnreachable else "failed"
            raise kind(f"pip install {what} (exit {proc.returncode}):\n{tail}")
        (tmp / MARKER).write_text(json.dumps({"packages": list(PINNED)}, indent=1) + "\n")
        if path.exists():
            shutil.rmtree(path)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    size = sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
    log(f"installed in {time.monotonic() - start:.0f} s, {size / 2**20:.0f} MiB")
    return path


def write_tiny_head(path: Path, seed: int = 0) -> Path:
    """A random EAGLE-3 head written by specserve (hidden 64, 4 heads / 2 KV heads of 16,
    vocabulary 1000, draft vocabulary 200), its floating tensors in bf16."""
    import torch

    from specserve.loading.head_writer import eagle3_head_config, write_head
    from specserve.models.eagle3 import Eagle3Config, Eagle3Head

    cfg = Eagle3Config(
        hidden_size=64,
        intermediate_size=128,
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        target_hidden_size=64,
        aux_layer_ids=(2, 4, 5),
        target_vocab_size=1000,
        draft_vocab_size=200,
        rope_theta=10000.0,
        rms_norm_eps=1e-5,
        norm_before_residual=True,  # not speculators' default, so a dropped key shows
    )
    torch.manual_seed(seed)
    head = Eagle3Head(cfg)
    with torch.no_grad():
        for p in head.parameters():  # norms too, so a norm left at 1.0 shows
            p.normal_(1.0 if p.dim() == 1 else 0.0, 0.2)
    ids = torch.randperm(1000, generator=torch.Generator().manual_seed(seed))[:200]
    head.set_vocab_map(ids.sort().values)
    tensors = {
        k: (v.to(torch.bfloat16) if v.is_floating_point() else v)
        for k, v in head.state_dict().items()
    }
    config = eagle3_head_config(
        cfg, verifier="tiny", verifier_arch="LlamaForCausalLM", num_speculative_tokens=3
    )
    write_head(path, config, tensors)
    return path


def run_check(
    head: Path, install: Path, target_config: Path | None = None, timeout: float = 600
) -> dict[str, Any]:
    """Run :func:`_check` in a subprocess that imports ``speculators`` from ``install``.

    Returns:
        ``{"ok": bool, "passed": [...], "failed": [...], "info": {...}}``; a subprocess that
        died is reported as one failure quoting its output.
    """
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(install), env.get("PYTHONPATH")) if p)
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env["HF_HUB_OFFLINE"] = "1"  # nothing in the check may fetch anything
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "report.json"
        cmd = [
            sys.executable,
            str(Path(__file__).resolve()),
            "--_check",
            str(head),
            "--_report",
            str(out),
        ]
        if target_config is not None:
            cmd += ["--target-config", str(target_config)]
        proc = subprocess.run(
            cmd, env=env, capture_output=True, text=True, timeout=timeout, check=False
        )
        if out.is_file():
            report: dict[str, Any] = json.loads(out.read_text())
        else:
            tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-30:])
            report = {"passed": [], "failed": [f"check process exit {proc.returncode}:\n{tail}"]}
            report["info"] = {}
        report["stderr_tail"] = "\n".join(proc.stderr.strip().splitlines()[-10:])
    report["ok"] = not report["failed"] and bool(report["passed"])
    return report


# ----------------------------------------------------------------------------------------
# The check (runs in the subprocess, the only place that imports speculators)


def _check(head: Path, target_config: Path | None) -> dict[str, Any]:
    import torch
    from safetensors.torch import load_file

    passed: list[str] = []
    failed: list[str] = []
    info: dict[str, Any] = {}

    def expect(what: str, got: Any, want: Any) -> None:
        if got == want:
            passed.append(what)
        else:
            failed.append(f"{what}: speculators has {got!r}, the head's files say {want!r}")

    raw = json.loads((head / "config.json").read_text())
    layer_raw = raw.get("transformer_layer_config") or {}
    file_tensors = load_file(str(head / "model.safetensors"))

    from importlib.metadata import version

    import speculators
    from speculators import SpeculatorModel, SpeculatorModelConfig
    from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig

    info["speculators"] = version("speculators")
    info["speculators_file"] = speculators.__file__

    # 1. config.json through speculators' (pydantic) config classes
    try:
        config = SpeculatorModelConfig.from_pretrained(str(head))
    except Exception as exc:
        failed.append(f"SpeculatorModelConfig.from_pretrained: {type(exc).__name__}: {exc}")
        return {"passed": passed, "failed": failed, "info": info}
    expect("config class", type(config).__name__, Eagle3SpeculatorConfig.__name__)
    spec = config.speculators_config
    expect("speculators_config.algorithm", spec.algorithm, "eagle3")
    expect("speculators_model_type", config.speculators_model_type, "eagle3")
    expect("draft_vocab_size", config.draft_vocab_size, raw.get("draft_vocab_size"))
    expect("norm_before_residual", config.norm_before_residual, raw.get("norm_before_residual"))
    for key in ("norm_before_fc", "fc_norm", "norm_output", "target_hidden_size"):
        if key in raw:
            expect(key, getattr(config, key, None), raw[key])
    expect(
        "eagle_aux_hidden_state_layer_ids",
        config.eagle_aux_hidden_state_layer_ids,
        raw.get("eagle_aux_hidden_state_layer_ids"),
    )
    tl = config.transformer_layer_config
    expect("transformer_layer_config class", type(tl).__name__, "LlamaConfig")
    for key in (
        "hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim",
        "intermediate_size", "vocab_size", "num_hidden_layers", "rms_norm_eps",
    ):  # fmt: skip
        expect(f"transformer_layer_config.{key}", getattr(tl, key, None), layer_raw.get(key))
    rope = getattr(tl, "rope_parameters", None) or {}
    theta = rope.get("rope_theta", getattr(tl, "rope_theta", None))
    expect("transformer_layer_config rope theta", theta, layer_raw.get("rope_theta", theta))
    want_k = raw["speculators_config"]["proposal_methods"][0]["speculative_tokens"]
    expect("speculative_tokens", spec.proposal_methods[0].speculative_tokens, want_k)
    expect("default_proposal_method", spec.default_proposal_method, "greedy")
    expect(
        "verifier architectures",
        list(spec.verifier.architectures or []),
        raw["speculators_config"]["verifier"].get("architectures"),
    )
    info["verifier"] = spec.verifier.name_or_path

    # 2. the weights through SpeculatorModel.from_pretrained, without reaching the verifier:
    # with name_or_path None it neither loads the verifier's embedding / LM head
    # (DraftVocabMixin.load_verifier_weights returns early) nor reads its config for the layer
    # ids. speculators 0.9.0's Eagle3DraftModel.load_verifier_weights then still calls
    # AutoConfig.from_pretrained(None) (a hub look-up of "None"); that override only checks
    # the verifier's hidden size, so here it gets the same early return as its base class.
    config.speculators_config.verifier.name_or_path = None
    expect(
        "SpeculatorModel registry class for the config",
        SpeculatorModel.registered_model_class_from_config(config).__name__,
        Eagle3DraftModel.__name__,
    )
    eagle3_load_verifier = Eagle3DraftModel.load_verifier_weights

    def load_verifier_weights(self: Any) -> None:
        if self.config.speculators_config.verifier.name_or_path is not None:
            eagle3_load_verifier(self)

    Eagle3DraftModel.load_verifier_weights = load_verifier_weights  # type: ignore[method-assign]
    info["patched"] = "Eagle3DraftModel.load_verifier_weights skips a verifier of None"
    try:
        model = SpeculatorModel.from_pretrained(str(head), config=config)
    except Exception as exc:
        failed.append(f"SpeculatorModel.from_pretrained: {type(exc).__name__}: {exc}")
        return {"passed": passed, "failed": failed, "info": info}
    expect("model class", type(model).__name__, Eagle3DraftModel.__name__)
    state = model.state_dict()
    info["loaded_dtype"] = str(model.fc.weight.dtype)
    info["file_tensors"] = {k: [list(v.shape), str(v.dtype)] for k, v in file_tensors.items()}
    ignored_on_load = set(getattr(type(model), "_keys_to_ignore_on_load_missing", []))
    for key in sorted(file_tensors):
        want = file_tensors[key]
        if key not in state:
            failed.append(
                f"tensor {key}: in model.safetensors, but speculators has no such "
                "tensor (it would be ignored on load)"
            )
            continue
        got = state[key].detach().cpu()
        if got.shape != want.shape:
            failed.append(
                f"tensor {key}: shape {tuple(got.shape)} in speculators, "
                f"{tuple(want.shape)} in the file"
            )
        elif want.is_floating_point() != got.is_floating_point() or (
            not want.is_floating_point() and got.dtype != want.dtype
        ):
            failed.append(
                f"tensor {key}: dtype {got.dtype} in speculators, {want.dtype} in the file"
            )
        elif not torch.equal(got, want.to(got.dtype)) or not torch.equal(got.to(want.dtype), want):
            diff = (got.double() - want.double()).abs().max().item()
            failed.append(f"tensor {key}: values differ (max |diff| {diff:g})")
        else:
            passed.append(f"tensor {key} {list(want.shape)} {want.dtype}")
    skip_missing = ignored_on_load | {"verifier_lm_head.weight", "verifier_norm.weight"}
    not_in_file = sorted(k for k in state if k not in file_tensors and k not in skip_missing)
    if not_in_file:
        failed.append(
            f"speculators' model has tensors the file lacks (left at their initial "
            f"values): {', '.join(not_in_file)}"
        )
    else:
        passed.append("every speculators tensor (but the verifier's) is in the file")
    if torch.isnan(model.lm_head.weight).any():
        failed.append("lm_head is NaN (speculators' 'not loaded' marker)")

    # 3. the vocabulary map as speculators (and vLLM) read it
    vd, v = config.draft_vocab_size, tl.vocab_size
    if vd == v:
        expect("no d2t/t2d when draft vocabulary == target vocabulary", model.d2t, None)
    elif model.d2t is None or model.t2d is None:
        failed.append("speculators has no d2t/t2d although draft_vocab_size != vocab_size")
    else:
        d2t, t2d = model.d2t.cpu(), model.t2d.cpu()
        expect("d2t dtype", str(d2t.dtype), "torch.int64")
        expect("t2d dtype", str(t2d.dtype), "torch.bool")
        expect("t2d.sum() == draft_vocab_size", int(t2d.sum()), vd)
        targets = torch.arange(vd) + d2t  # speculators: target = draft_idx + d2t[draft_idx]
        in_range = bool(((targets >= 0) & (targets < v)).all())
        expect("draft -> target ids within the target vocabulary", in_range, True)
        if in_range:
            expect("draft -> target ids strictly ascending", bool((targets.diff() > 0).all()), True)
            expect("t2d marks exactly the mapped target ids", bool(t2d[targets].all()), True)
            mask = torch.zeros(v, dtype=torch.bool)
            mask[targets] = True
            expect("t2d == mask of the mapped ids", bool(torch.equal(mask, t2d)), True)
        try:  # speculators' own validation of a vocabulary map
            model.load_vocab_mappings(t2d.clone(), d2t.clone())
            passed.append("speculators' load_vocab_mappings accepts d2t/t2d")
        except Exception as exc:
            failed.append(f"load_vocab_mappings: {type(exc).__name__}: {exc}")

    # 4. optionally against a target's Hugging Face config
    if target_config is not None:
        from speculators.models.utils import resolve_target_layer_ids
        from transformers import AutoConfig

        folder = target_config if target_config.is_dir() else target_config.parent
        target = AutoConfig.from_pretrained(str(folder))
        target = getattr(target, "text_config", target)
        ids = raw.get("eagle_aux_hidden_state_layer_ids")
        try:
            resolved = resolve_target_layer_ids(ids, str(folder))
            expect("resolve_target_layer_ids(target)", resolved, ids or resolved)
        except ValueError as exc:
            failed.append(f"resolve_target_layer_ids: {exc}")
        want_h = raw.get("target_hidden_size") or layer_raw.get("hidden_size")
        expect("target hidden size", target.hidden_size, want_h)
        expect("target vocab_size", target.vocab_size, layer_raw.get("vocab_size"))
    return {"passed": passed, "failed": failed, "info": info}


# ----------------------------------------------------------------------------------------


def print_report(report: dict[str, Any], head: Path) -> None:
    info = report.get("info", {})
    print(f"head: {head}")
    if info:
        print(
            f"speculators {info.get('speculators')} ({info.get('speculators_file')}), loaded "
            f"dtype {info.get('loaded_dtype')}, verifier {info.get('verifier')!r}"
        )
    for line in report["passed"]:
        print(f"  ok    {line}")
    for line in report["failed"]:
        print(f"  FAIL  {line}")
    if report["failed"] and report.get("stderr_tail"):
        print("check process stderr (last lines):\n" + report["stderr_tail"])
    print(f"{len(report['passed'])} passed, {len(report['failed'])} failed")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--head", type=Path, help="a head directory (default: a tiny random one)")
    parser.add_argument(
        "--target-config", type=Path, help="a target's config.json (or its folder) to check against"
    )
    parser.add_argument(
        "--install-dir", type=Path, help=f"private install (default {default_install_dir()})"
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--_check", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--_report", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args._check is not None:  # the subprocess
        report = _check(args._check, args.target_config)
        args._report.write_text(json.dumps(report, indent=1))
        return 0

    try:
        install = ensure_install(args.install_dir)
    except InstallError as exc:
        print(f"error: cannot install speculators {SPECULATORS_VERSION}: {exc}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        head = args.head or write_tiny_head(Path(tmp) / "tiny-eagle3")
        report = run_check(head, install, args.target_config)
        if args.json:
            print(json.dumps(report, indent=1))
        else:
            print_report(report, args.head or Path("(tiny random head)"))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
