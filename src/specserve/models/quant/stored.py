"""A :class:`DecoderLM` whose linears and embedding compute GGUF codes as stored (``gguf``).

The portable state (what ``loading/gguf_stored.py`` decodes from the file and the disk cache
keeps) holds, per original module name, either the int4 tensors of
:class:`~specserve.models.quant.int4_weight.Int4Weight` (``<name>.nibbles``, ``.scale``,
``.minimum``) or those of :class:`~specserve.models.quant.int8_group.Int8GroupWeight`
(``<name>.codes``, ``.scale``, ``.offset``); the group size is ``K`` over the scales'
columns. A linear without state (a GGUF type with no native mapping, or a float tensor)
keeps its float weights.

Fused projections (``qkv_proj``, ``gate_up_proj``) concatenate their parts' rows. Parts of
one kind and group size concatenate as they are; otherwise every part is written in the
int8 group format at the smallest group size (an int4 code is a byte code, a group's
constants repeat over its sub-groups), which changes no weight. In a Q4_K_M file that is
the case of ``qkv`` where ``v`` is Q6_K and ``q``/``k`` are Q4_K.

The embedding keeps the codes too (:class:`GroupEmbedding`): a lookup dequantises the rows
it reads, in fp32 and then rounded to the compute dtype, as the dequantised model would.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from math import gcd

import torch
from torch import nn

from specserve.models.decoder import DecoderLM
from specserve.models.native import fused_layer, int4_native, int4_superblock
from specserve.models.quant.int4_weight import Int4Weight
from specserve.models.quant.int8_group import Int8GroupLinear, Int8GroupWeight
from specserve.models.quant.layers import Int4Linear
from specserve.models.quant.quantize import EMBED, FUSED, fused_bias

StoredWeight = Int4Weight | Int8GroupWeight


def stored_weight(state: Mapping[str, torch.Tensor], name: str) -> StoredWeight | None:
    """The stored weight of module ``name`` in ``state`` (None: it has none)."""
    if f"{name}.nibbles" in state:
        nibbles = state[f"{name}.nibbles"]
        scale = state[f"{name}.scale"].float()
        group = 2 * nibbles.shape[1] // scale.shape[1]
        return Int4Weight(nibbles, scale, state[f"{name}.minimum"].float(), group)
    if f"{name}.codes" in state:
        codes = state[f"{name}.codes"]
        scale = state[f"{name}.scale"].float()
        group = codes.shape[1] // scale.shape[1]
        return Int8GroupWeight(codes, scale, state[f"{name}.offset"].float(), group)
    return None


def as_int8_group(weight: StoredWeight, group_size: int) -> Int8GroupWeight:
    """``weight`` in the int8 group format with groups of ``group_size`` (dividing its own):
    the same weights, exactly."""
    if isinstance(weight, Int4Weight):
        weight = Int8GroupWeight(
            weight.codes().to(torch.int8), weight.scale, weight.minimum, weight.group_size
        )
    if weight.group_size % group_size:
        raise ValueError(f"group {group_size} does not divide {weight.group_size}")
    repeat = weight.group_size // group_size
    return Int8GroupWeight(
        weight.codes,
        weight.scale.repeat_interleave(repeat, dim=1),
        weight.offset.repeat_interleave(repeat, dim=1),
        group_size,
    )


def concat_rows(parts: list[StoredWeight]) -> StoredWeight:
    """One stored weight with the rows of ``parts`` in order (see the module docstring)."""
    int4 = [p for p in parts if isinstance(p, Int4Weight)]
    if len(int4) == len(parts) and len({p.group_size for p in int4}) == 1:
        return Int4Weight(
            torch.cat([p.nibbles for p in int4]),
            torch.cat([p.scale for p in int4]),
            torch.cat([p.minimum for p in int4]),
            int4[0].group_size,
        )
    group = 0
    for p in parts:
        group = gcd(group, p.group_size)
    bytes_ = [as_int8_group(p, group) for p in parts]
    return Int8GroupWeight(
        torch.cat([p.codes for p in bytes_]),
        torch.cat([p.scale for p in bytes_]),
        torch.cat([p.offset for p in bytes_]),
        group,
    )


def stored_linear(
    weight: StoredWeight, bias: torch.Tensor | None, dtype: torch.dtype, device: torch.device
) -> nn.Module:
    """The linear module computing ``weight`` (its native kernel where available)."""
    if isinstance(weight, Int4Weight):
        linear = Int4Linear(weight, bias, dtype, device)
        native = linear.native
        if native is not None and not native.superblock_constants:
            # the file's Q4_0 / Q4_1 blocks keep bf16 x, as do its Q4_K ones packed per group
            # beside the AMX tiles; the AVX2 kernel (the one with a quantised one-row path) has
            # no superblock layout, and there Q4_K takes int8 x as the K-quants do elsewhere
            native.exact_x = not (int4_native.quantised_x() and int4_superblock.has_form(weight))
        return linear
    return Int8GroupLinear(weight, bias, dtype, device)


class GroupEmbedding(nn.Module):
    """An embedding table kept as stored codes; a lookup dequantises the rows it reads with
    the weight's own ``dequantize`` (fp32, then the compute dtype)."""

    def __init__(self, weight: StoredWeight, dtype: torch.dtype, device: torch.device) -> None:
        super().__init__()
        self.dtype = dtype
        self.kind = type(weight)
        self.group_size = weight.group_size
        # the weight's tensors (codes or nibbles, scale, offset or minimum) as buffers
        self.tensors = [f.name for f in dataclasses.fields(weight) if f.name != "group_size"]
        for name in self.tensors:
            self.register_buffer(name, getattr(weight, name).to(device))
        self.num_embeddings = weight.scale.shape[0]
        self.embedding_dim = weight.group_size * weight.scale.shape[1]

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        ids = input_ids.reshape(-1)
        picked = {name: getattr(self, name)[ids] for name in self.tensors}
        rows = self.kind(group_size=self.group_size, **picked)
        return rows.dequantize(self.dtype).reshape(*input_ids.shape, self.embedding_dim)

    def extra_repr(self) -> str:
        kind = "int4" if self.kind is Int4Weight else "int8"
        return f"{self.num_embeddings}, {self.embedding_dim}, {kind} group={self.group_size}"


@torch.no_grad()
def apply_stored(model: DecoderLM, state: Mapping[str, torch.Tensor]) -> DecoderLM:
    """Replace ``model``'s linears and embedding by modules over the stored weights in
    ``state`` (see the module docstring); the compute dtype and device stay the model's.
    Returns the model, with the fused native layer path on where it qualifies."""
    dtype, device = model.dtype, model.device
    embed_weight = stored_weight(state, EMBED)
    tied = model.cfg.tie_word_embeddings

    def weight_of(name: str) -> StoredWeight | None:
        found = stored_weight(state, name)
        if found is None and name == "lm_head" and tied:
            return embed_weight
        return found

    layers = [f"model.layers.{i}" for i in range(len(model.model.layers))]
    in_fusion: set[str] = set()
    for layer in layers:
        for fused, parts in FUSED:
            names = [f"{layer}.{p}" for p in parts]
            weights = [weight_of(n) for n in names]
            if any(w is None for w in weights):
                continue  # a part without stored codes: the parts stay separate float linears
            linears = [model.get_submodule(n) for n in names]
            assert all(isinstance(lin, nn.Linear) for lin in linears)
            module = stored_linear(
                concat_rows([w for w in weights if w is not None]),
                fused_bias(linears, dtype),  # type: ignore[arg-type]
                dtype,
                device,
            )
            parent = model.get_submodule(f"{layer}.{fused.rpartition('.')[0]}")
            setattr(parent, fused.rpartition(".")[2], module)
            for p in parts:
                setattr(parent, p.rpartition(".")[2], None)
            in_fusion.update(names)
    singles = [
        f"model.layers.{n}"
        for n, m in model.model.layers.named_modules()
        if isinstance(m, nn.Linear) and f"model.layers.{n}" not in in_fusion
    ]
    for name in [*singles, "lm_head"]:
        weight = weight_of(name)
        if weight is None:
            continue
        linear = model.get_submodule(name)
        assert isinstance(linear, nn.Linear), name
        bias = None if linear.bias is None else linear.bias.detach().clone()
        parent_name, _, attr = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, attr, stored_linear(weight, bias, dtype, device))
    if embed_weight is not None:
        model.model.embed_tokens = GroupEmbedding(embed_weight, dtype, device)  # type: ignore[assignment]
    for module in model.modules():  # no parameter keeps a memory-mapped checkpoint alive
        for pname, param in list(module.named_parameters(recurse=False)):
            setattr(module, pname, nn.Parameter(param.detach().clone(), requires_grad=False))
    fused_layer.enable(model)
    return model
