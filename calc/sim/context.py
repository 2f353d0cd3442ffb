"""The context a block is built in (Ctx): the model, the batch shape on this GPU and the bytes per element of its
weights, activations and residual stream, with the parallel layout, LoRA and the kind of layer. Its shape-free key
(`Ctx.shape_free`) names every field but the shape, by value, for the recordings of calc.sim.profiles.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from calc.contract.model_spec import ModelSpec


@dataclass(frozen=True)
class Ctx:
    """Shapes and dtypes of one block as it runs on one GPU."""

    spec: ModelSpec
    batch: int
    seq: int
    weight_elem_bytes: int  # bytes per stored weight element (4 fp32/amp, 2 for 16-bit weights)
    act_elem_bytes: int  # bytes per activation element produced by matmuls (compute dtype)
    residual_elem_bytes: int  # bytes per residual-stream element (embedding output dtype: 4 under amp)
    amp: bool  # torch.autocast: casts matmul inputs and (cached) weights to 16-bit
    cuda: bool  # CUDA kernels (dropout masks are 1-byte bools) vs CPU (dtype-sized noise)
    tp: int = 1  # tensor-parallel degree: heads and MLP width are split
    sp: bool = False  # sequence parallel: norms/dropout/residual on S/tp tokens
    lora_rank: int = 0  # LoRA adapters on the listed projections
    lora_targets: frozenset[str] = frozenset()
    frozen_base: bool = False  # LoRA: base weights take no gradient
    adapter_bytes: int = 4  # LoRA adapter dtype: fp32 (peft's autocast_adapter_dtype) or 16-bit
    adapter_amp: bool = False  # LoRA under torch.autocast: fp32 adapters run their matmuls in 16-bit
    quantized_base: str = ""  # LoRA on a bitsandbytes base: "int8", "nf4" or "fp4" (calc.contract.quantized)
    lora_dropout: float = 0.0  # LoRA: peft's lora_dropout on each adapter's input
    lora_trained: frozenset[str] = frozenset()  # LoRA modules_to_save: "lm_head" / "embed_tokens" trained in full
    sliding: bool = True  # this layer attends through the spec's sliding window (Gemma 3's local layers)
    dense_mlp: bool = False  # a MoE model's dense layer (first_k_dense_replace)
    ep: int = 1  # expert parallelism: this rank runs num_experts / ep experts on tokens sent by all-to-all
    cast_expert_inputs: bool = False  # FSDP2 mixed precision on the experts' own group: float inputs cast to 16 bits
    use_cache: bool = True  # HF builds a DynamicCache in training unless gradient checkpointing is on
    train: bool = True  # model.train(): dropout active (eval/inference: every dropout is the identity)
    input_grad: bool = True  # the layer's input requires grad (not so for layer 0 on a frozen embedding)
    framework: str = "transformers"  # whose model code the blocks mirror (training.framework)
    stable_embedding: bool = False  # LitGPT QLoRA: wte is bitsandbytes' StableEmbedding, trained, in no optimizer
    fp32_rope: bool = False  # the RoPE cache is fp32 (LitGPT QLoRA: nothing casts the model's buffers)
    loss_chunks: int | None = None  # training.cross_entropy_chunks (LitGPT: tokens per chunk; None: its 128)
    output_chunks: int = 0  # torchtune: the output projection in this many chunks of the sequence (0: whole)

    @property
    def tokens(self) -> int:
        return self.batch * self.seq

    @cached_property
    def shape_free(self) -> tuple:
        """Every field but batch and seq, by value, as a key: the spec by its value key (ModelSpec.value_key, its
        JSON made once, whose hash a str keeps; hashing the ModelSpec itself costs more than evaluating a
        recorded block). Computed once per context (the cache is in the instance's __dict__, outside the
        dataclass fields)."""
        fields = self.__dict__.copy()
        del fields["batch"], fields["seq"]
        fields["spec"] = self.spec.value_key
        return tuple(fields.values())

    def with_shape(self, batch: int, seq: int) -> Ctx:
        """This context for another batch shape: every other field as it is, and the shape-free key with them."""
        return self._copy(True, batch=batch, seq=seq)

    def with_kind(self, sliding: bool, dense_mlp: bool, input_grad: bool) -> Ctx:
        """This context for another kind of layer (the engine's layer contexts); the shape-free key, which names these
        fields, is made again when asked."""
        return self._copy(False, sliding=sliding, dense_mlp=dense_mlp, input_grad=input_grad)

    def _copy(self, same_key: bool, **changed: object) -> Ctx:
        """This context with the `changed` fields, as dataclasses.replace makes it but without the frozen
        dataclass's __init__ (22 guarded assignments, and the key's copy again: a third of what a recorded block's
        evaluation costs); the shape-free key kept where `same_key` (no field of it changed)."""
        new = object.__new__(Ctx)
        fields = new.__dict__
        fields.update(self.__dict__)
        if not same_key:
            fields.pop("shape_free", None)
        fields.update(changed)
        return new

    def trains(self, module: str) -> bool:
        """Whether a module's weight takes a gradient: every one in full fine-tuning; under LoRA only the trainable
        copies of modules_to_save (lm_head, embed_tokens)."""
        return not self.frozen_base or module in self.lora_trained

    @property
    def rope_elem_bytes(self) -> int:
        """RoPE output dtype: q/k (compute dtype) times cos/sin (residual dtype, or an fp32 cache) promote."""
        return 4 if self.fp32_rope else max(self.act_elem_bytes, self.residual_elem_bytes)
