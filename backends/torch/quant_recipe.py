"""Which bits each of a model's matrices gets: a QuantRecipe maps a matrix's role to a QuantSpec.

The layouts themselves live torch-free in localinfer/facts/quant.py (``torch_recipe_layout``), so
the budget predicts the bytes of the very table the runner quantizes by:

* ``int8``: layer matrices per row, the embedding table in groups of 32 (Q8_0-like);
* ``int4-g32|g64|g128``, ``int8-gN``: every matrix alike;
* ``int4``: the mixed recipe (facts/quant.py MIXED_INT4): the LM head at 8 bits in groups of
  32 (the embedding table too where it is the head), the layer matrices at 4 bits in groups of
  32, as llama.cpp's Q4_K_M keeps its output at Q6_K and MLX users keep the head at 8 bits.

Roles are the runner's matrices: q|k|v and gate|up are fused, so V cannot differ from Q and K.
"""

from __future__ import annotations

from dataclasses import dataclass

from localinfer.backends.torch.quant_layout import QuantSpec, parse_quant
from localinfer.facts.quant import TORCH_ROLES, torch_recipe_layout

# The matrix names weight_loading.py gives the quantizer, by their ending -> role.
_NAME_ENDINGS = (
    ("embed_tokens", "embed"),
    ("lm_head", "head"),
    (".qkv", "qkv"),
    (".o_proj", "o"),
    (".gate_up", "gate_up"),
    (".down_proj", "down"),
)


def role_of(name: str) -> str:
    """The role of the matrix ``name`` (as weight_loading.py names it); ValueError if none."""
    for ending, role in _NAME_ENDINGS:
        if name.endswith(ending):
            return role
    raise ValueError(f"no quantization role for matrix {name!r}")


@dataclass(frozen=True, slots=True)
class QuantRecipe:
    label: str  # what the runner reports and the quant cache keys on
    specs: tuple[tuple[str, QuantSpec], ...]  # (role, spec) for every role in TORCH_ROLES

    @property
    def bits(self) -> int:
        """The width most weights have (the kernels' default choice)."""
        return self.spec_for("gate_up").bits

    def spec_for(self, role: str) -> QuantSpec:
        for r, spec in self.specs:
            if r == role:
                return spec
        raise ValueError(f"unknown quantization role {role!r}")

    def layout(self) -> dict[str, QuantSpec]:
        return dict(self.specs)


def recipe(label: str, specs: dict[str, QuantSpec]) -> QuantRecipe:
    missing = set(TORCH_ROLES) - set(specs)
    if missing:
        raise ValueError(f"recipe {label!r} lacks roles {sorted(missing)}")
    return QuantRecipe(label, tuple((r, specs[r]) for r in TORCH_ROLES))


def parse_recipe(quant: str | None, tied: bool = True) -> QuantRecipe | None:
    """``int4`` -> the mixed recipe (``tied``: the model's LM head is its embedding table);
    ``int8``, ``int4-gN``, ``int8-gN`` -> a uniform one; None / a float name -> None. Anything
    else: UnsupportedModelError (from parse_quant)."""
    spec = parse_quant(quant)  # validates the name; None for float names
    if spec is None or quant is None:
        return None
    layout = torch_recipe_layout(quant, tied)
    assert layout is not None  # every name parse_quant takes has a layout
    label = "int4" if spec.bits == 4 and layout["head"].bits == 8 else spec.label
    return recipe(label, {r: QuantSpec(m.bits, m.group) for r, m in layout.items()})
