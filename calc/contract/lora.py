"""The LoRA block of a training scenario: adapters (or QLoRA's quantized base) on a frozen model, in peft's
terms, and the module names it may list."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StringConstraints, model_validator

from calc.contract.enums import BaseWeights, LoraTargetSet
from calc.contract.errors import UserError
from calc.contract.i18n import T_
from calc.contract.limits import MAX_LORA_ALPHA

MAX_MODULE_NAMES = 64  # LoRA targets / modules_to_save: more names than any model has kinds of module
MODULE_NAME = r"^[A-Za-z_][A-Za-z0-9_]{0,63}$"  # one module name in Hugging Face naming (q_proj, c_attn, lm_head)


def _list_as_tuple(value: Any) -> Any:
    """A JSON list as the tuple the frozen model keeps: TrainingConfig's before-validator hands nested values over
    as Python objects, where strict mode takes no list for a tuple."""
    return tuple(value) if isinstance(value, list) else value


# A JSON list of module names (each a strict string)
ModuleNames = Annotated[tuple[Annotated[str, StringConstraints(pattern=MODULE_NAME)], ...], BeforeValidator(_list_as_tuple)]


class LoraConfig(BaseModel):
    """LoRA / QLoRA adapters on a frozen base model (peft semantics)."""

    model_config = ConfigDict(extra="forbid")

    rank: int = Field(16, ge=1, le=4096, description="adapter rank r")
    alpha: float = Field(32, gt=0, le=MAX_LORA_ALPHA, allow_inf_nan=False,
                         description="scaling numerator; scale = alpha / r")
    targets: LoraTargetSet | ModuleNames = Field(
        "all-linear", description="which linear layers get adapters: every one but lm_head (peft's all-linear), "
        "the attention projections, or a list of module names in Hugging Face naming (q_proj, v_proj, lm_head, "
        "c_attn, query_key_value, qkv_proj, ...)")
    dropout: float = Field(0.0, ge=0, lt=1, allow_inf_nan=False,
                           description="lora_dropout: with p > 0 the dropped input is saved for backward")
    modules_to_save: ModuleNames = Field(
        (), description="modules trained in full beside the adapters (peft keeps the original and a trainable "
        "copy), e.g. lm_head, embed_tokens")
    base_weights: BaseWeights = Field(
        "bf16", description="storage of the frozen base weights: 16-bit, or bitsandbytes int8 / nf4 / fp4 "
        "(nf4 = QLoRA)")
    double_quant: bool = Field(False, description="bitsandbytes bnb_4bit_use_double_quant: the 4-bit blocks' "
                               "absmax constants quantized again (nf4 / fp4 only)")

    @model_validator(mode="before")
    @classmethod
    def _lists_as_tuples(cls, data: Any) -> Any:
        """JSON arrays of names as tuples: the training block's own before-validator hands this one Python values,
        which strict validation (records, scenario files) would otherwise refuse as lists."""
        if not isinstance(data, dict):
            return data
        return {k: tuple(v) if k in ("targets", "modules_to_save") and isinstance(v, list) else v
                for k, v in data.items()}

    @model_validator(mode="after")
    def _names(self) -> LoraConfig:
        for field in ("targets", "modules_to_save"):
            names = getattr(self, field)
            if isinstance(names, tuple) and len(names) > MAX_MODULE_NAMES:
                raise UserError(T_("lora.{field} lists {n} names; at most {most}", field=field, n=len(names),
                                   most=MAX_MODULE_NAMES))
            if isinstance(names, tuple) and len(set(names)) != len(names):
                raise UserError(T_("lora.{field} names a module twice", field=field))
        if self.targets == ():
            raise UserError(T_("lora.targets is an empty list: name at least one module"))
        if self.double_quant and self.base_weights not in ("nf4", "fp4"):
            raise UserError(T_("lora.double_quant applies to 4-bit base weights (nf4 / fp4)"))
        return self

    @property
    def quantized(self) -> bool:
        """The frozen base is stored by bitsandbytes (int8 / nf4 / fp4), not as plain 16-bit weights."""
        return self.base_weights in ("int8", "nf4", "fp4")
