"""Sequences a model can take: GPT-2's learned position table has n_positions rows (the scenario refuses more);
random scenarios draw a length, then keep it within the table."""

from __future__ import annotations

from calc.contract.hf_rules import NO_ROPE
from calc.contract.presets import resolve_model


def within_positions(model: str, seq: int) -> int:
    spec = resolve_model(model)
    return min(seq, spec.max_position_embeddings) if spec.family in NO_ROPE else seq
