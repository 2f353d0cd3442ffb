"""A quantized frozen base as transformers + bitsandbytes store it: only the decoder linears are quantized, each as
bnb_weight_bytes says (checked against real bitsandbytes tensors), the rest stays 16-bit; int8 bases keep fp32
adapters; the committed CPU records of QLoRA runs agree with the engine."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from calc.contract.quantized import QUANTIZED_KINDS, bnb_weight_bytes, frozen_base
from calc.contract.scenario import Scenario
from calc.evidence.validate import compare, load_all
from calc.memory.estimate import estimate

SMALL = {"model_type": "llama", "vocab_size": 2000, "hidden_size": 128, "intermediate_size": 344,
         "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2}
QUANT_RECORD_MARKERS = ("qlora", "lora-int8", "fp16-base", "adamw-8bit", "paged-adamw")


def _sc(model=None, **lora) -> Scenario:
    return Scenario.model_validate({"model": model or SMALL, "training": {
        "micro_batch_size": 1, "seq_len": 64, "precision": "bf16", "lora": {"rank": 8, **lora}}})


def _weights(sc: Scenario, target: str = "cuda") -> int:
    return next(c.bytes for c in estimate(sc, target).components if c.key == "weights")


@pytest.mark.parametrize("kind", QUANTIZED_KINDS)
def test_embeddings_and_lm_head_stay_16bit(kind):
    """A wider vocabulary adds embedding + lm_head rows at 2 B each whatever the base's quantization."""
    wider = {**SMALL, "vocab_size": 3000}
    added = _weights(_sc(wider, base_weights=kind)) - _weights(_sc(base_weights=kind))
    assert added == 2 * 2 * 1000 * 128  # embed_tokens + lm_head (untied), bf16


@pytest.mark.parametrize("kind", QUANTIZED_KINDS)
def test_quantized_base_is_its_linears_plus_the_16bit_rest(kind):
    sc = _sc(base_weights=kind)
    spec = sc.spec
    linears = [(lin.out_features, lin.in_features) for lin in spec.linear_layers()] * spec.num_layers
    quantized = sum(bnb_weight_bytes(kind, o, i) for o, i in linears)
    rest = spec.total_params() - sum(o * i for o, i in linears)
    adapters = _weights(sc) - frozen_base(spec, kind, False, spec.num_layers, 1, True).total_bytes(spec.total_params())
    assert _weights(sc) - adapters == quantized + 2 * rest


def test_double_quant_saves_on_large_weights_only():
    big = {**SMALL, "hidden_size": 1024, "intermediate_size": 2816}
    assert _weights(_sc(big, base_weights="nf4", double_quant=True)) < _weights(_sc(big, base_weights="nf4"))
    # the nested state's 256-value map (1 KiB per weight) outweighs what it saves on a 64 x 128 weight
    assert bnb_weight_bytes("nf4", 64, 128, True) > bnb_weight_bytes("nf4", 64, 128)


def test_nf4_and_fp4_take_the_same_bytes_and_fp16_the_bf16_bytes():
    assert estimate(_sc(base_weights="nf4")).peak_allocated_bytes == estimate(_sc(base_weights="fp4")).peak_allocated_bytes
    assert estimate(_sc(base_weights="fp16")).peak_allocated_bytes == estimate(_sc(base_weights="bf16")).peak_allocated_bytes


def test_int8_base_keeps_fp32_adapters():
    """peft leaves adapters on an Int8Params base in torch's default fp32: twice the bf16 run's optimizer states."""
    def states(kind: str) -> int:
        return next(c.bytes for c in estimate(_sc(base_weights=kind)).components if c.key == "optimizer_states")
    assert states("int8") == 2 * states("nf4")


@given(out_f=st.integers(1, 4096), in_f=st.integers(1, 4096))
@settings(max_examples=200, deadline=None)
def test_4bit_storage_is_half_a_byte_per_weight_plus_its_state(out_f, in_f):
    n = out_f * in_f
    plain, nested = bnb_weight_bytes("nf4", out_f, in_f), bnb_weight_bytes("nf4", out_f, in_f, True)
    assert plain == bnb_weight_bytes("fp4", out_f, in_f) and nested == bnb_weight_bytes("fp4", out_f, in_f, True)
    assert n / 2 < plain <= n / 2 + 4 * (n / 64 + 1) + 64 + 1
    assert bnb_weight_bytes("int8", out_f, in_f) == n + 4 * out_f
    assert bnb_weight_bytes("bf16", out_f, in_f) == 2 * n


def _quantized_records():
    return [r for r in load_all() if r.device == "cpu" and any(m in (r.name or "") for m in QUANT_RECORD_MARKERS)]


def test_quantized_and_bitsandbytes_records_match_the_engine():
    records = _quantized_records()
    assert len(records) >= 20
    assert {r.scenario.spec.family for r in records} >= {"llama", "qwen2", "gpt2"}
    bases = {r.scenario.training.lora.base_weights for r in records if r.scenario.training.lora}
    assert bases >= {"nf4", "fp4", "int8", "fp16"}
    assert any(r.scenario.training.lora and r.scenario.training.lora.double_quant for r in records)
    worst = max((compare(r) for r in records), key=lambda c: abs(c.error_pct))
    assert abs(worst.error_pct) <= 1.0, (worst.name, worst.error_pct)


@pytest.mark.slow
@pytest.mark.parametrize(("out_f", "in_f"), [(128, 256), (344, 128), (33, 77), (1000, 4096)])
def test_bnb_weight_bytes_is_what_bitsandbytes_allocates(out_f, in_f):
    torch = pytest.importorskip("torch")
    bnb = pytest.importorskip("bitsandbytes")
    from measure.runner import unique_storage_bytes

    w = torch.randn(out_f, in_f, dtype=torch.bfloat16)
    for kind in ("nf4", "fp4"):
        for dq in (False, True):
            p = bnb.nn.Params4bit(w.clone(), requires_grad=False, quant_type=kind, compress_statistics=dq).to("cpu")
            qs = p.quant_state
            tensors = [p.data, qs.absmax, qs.code] + ([qs.offset, qs.state2.absmax, qs.state2.code] if dq else [])
            assert unique_storage_bytes(tensors) == bnb_weight_bytes(kind, out_f, in_f, dq), (kind, dq)
    p8 = bnb.nn.Int8Params(w.clone(), requires_grad=False, has_fp16_weights=False).to("cpu")
    assert unique_storage_bytes([p8.data, p8.SCB]) == bnb_weight_bytes("int8", out_f, in_f)


@pytest.mark.parametrize(("kind", "double_quant"), [("nf4", False), ("fp4", True)])
def test_trainer_script_quantizes_as_the_estimate_does(kind, double_quant):
    from calc.export.hf import trainer_snippet

    sc = Scenario.model_validate({"model": SMALL, "training": {"precision": "amp-bf16", "lora": {
        "base_weights": kind, "double_quant": double_quant}}})
    script = trainer_snippet(sc)
    assert f"'bnb_4bit_quant_type': '{kind}'" in script
    assert f"'bnb_4bit_use_double_quant': {double_quant}" in script


@pytest.mark.slow
@pytest.mark.parametrize(("family", "tied"), [("gpt2", True), ("llama", False)])
def test_reference_loop_quantizes_what_the_engine_quantizes(family, tied):
    """The measured model: every decoder linear (GPT-2's Conv1D too) bitsandbytes 4-bit, lm_head and the rest
    bf16; its weights and quantization state are the engine's weights component."""
    torch = pytest.importorskip("torch")
    bnb = pytest.importorskip("bitsandbytes")
    from measure.runner import unique_storage_bytes
    from measure.workload import build_model, quantization_state_tensors

    gpt2 = {"model_type": "gpt2", "vocab_size": 2000, "n_embd": 128, "n_layer": 2, "n_head": 4, "n_positions": 256}
    sc = _sc(gpt2 if family == "gpt2" else SMALL, base_weights="nf4", double_quant=True)
    model = build_model(sc, torch.device("cpu"))
    linears = [m for m in model.modules() if isinstance(m, bnb.nn.Linear4bit)]
    assert len(linears) == sum(lin.count for lin in sc.spec.linear_layers()) * sc.spec.num_layers
    assert not isinstance(model.get_output_embeddings(), bnb.nn.Linear4bit)
    assert (model.get_output_embeddings().weight is model.get_input_embeddings().weight) == tied
    stored = unique_storage_bytes(list(model.parameters()) + list(model.buffers()) + quantization_state_tensors(model))
    assert stored == _weights(sc, "cpu") + unique_storage_bytes(list(model.buffers()))
