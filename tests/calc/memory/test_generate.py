"""model.generate (inference.new_tokens) and inference.weights: the engine against the committed CPU records of
HF generate under MemTracker, and the mechanisms' invariants."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from calc.contract.quantized import bnb_weight_bytes
from calc.contract.record import load_records
from calc.contract.scenario import LoraConfig, Scenario
from calc.memory.activations import block_context
from calc.memory.estimate import estimate
from calc.memory.generate import cache_position_bytes, generate_loop_bytes
from ui import state

DATA = Path(__file__).resolve().parents[3] / "data" / "measured_cpu.jsonl"
WORST_PCT = 3.0
SMALL = {"model_type": "llama", "vocab_size": 32000, "hidden_size": 128, "intermediate_size": 344,
         "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2}
WINDOW = 64
MISTRAL = {**SMALL, "model_type": "mistral", "sliding_window": WINDOW}


def _generate_records():
    return [r for r in load_records(DATA) if r.scenario.mode.value == "inference" and r.scenario.inference.new_tokens]


def _gen(model=None, new_tokens=64, seq=16, batch=2, **inference) -> Scenario:
    return Scenario.model_validate({"model": model or SMALL, "mode": "inference",
                                    "training": {"precision": "bf16", "micro_batch_size": batch, "seq_len": seq},
                                    "inference": {"new_tokens": new_tokens, **inference}})


def test_generate_records_cover_the_families_and_caches():
    recs = _generate_records()
    assert len(recs) >= 10
    assert {"llama", "gpt2", "qwen2", "mistral", "gemma2", "gemma3_text"} <= {r.scenario.spec.family for r in recs}
    assert {"dynamic", "static"} <= {r.scenario.inference.kv_cache for r in recs}


@pytest.mark.parametrize("record", _generate_records(), ids=lambda r: r.name)
def test_engine_matches_measured_generate(record):
    predicted = estimate(record.scenario, "cpu").peak_allocated_bytes
    error = 100 * (predicted / record.peak_allocated_bytes - 1)
    assert abs(error) <= WORST_PCT, f"{record.name}: {error:+.2f} %"


def test_each_new_token_adds_one_position_of_cache_once_decoding_dominates():
    """Past the prompt's peak, one more token adds one position to every layer's cache and one int64 column to
    input_ids and the attention mask."""
    a, b = (estimate(_gen(new_tokens=n), "cpu") for n in (400, 401))
    ctx = block_context(_gen(), "cpu")
    per_position = SMALL["num_hidden_layers"] * sum(cache_position_bytes(ctx))
    assert b.peak_event.startswith("decode")
    assert b.peak_allocated_bytes - a.peak_allocated_bytes == per_position + (
        generate_loop_bytes(ctx, 1) - generate_loop_bytes(ctx, 0))


def test_a_sliding_window_caps_the_dynamic_cache():
    """DynamicSlidingWindowLayer keeps min(tokens, window) positions: past the window only generate's own int64
    tensors still grow."""
    a, b = (estimate(_gen(MISTRAL, new_tokens=n), "cpu") for n in (300, 400))
    ctx = block_context(_gen(MISTRAL), "cpu")
    assert b.breakdown.activations == a.breakdown.activations
    assert b.peak_allocated_bytes - a.peak_allocated_bytes == generate_loop_bytes(ctx, 100) - generate_loop_bytes(ctx, 0)


def test_static_cache_is_preallocated_at_the_prefill():
    dyn, static = (estimate(_gen(new_tokens=400, seq=512, batch=1, kv_cache=k), "cpu") for k in ("dynamic", "static"))
    ctx = block_context(_gen(seq=512, batch=1), "cpu")
    extra = SMALL["num_hidden_layers"] * sum(cache_position_bytes(ctx)) * (400 - 1)
    first = dyn.timeline.events.index("layer 1")
    assert static.timeline.activations[first] - dyn.timeline.activations[first] == extra // 2  # layer 0 only


def test_generate_computes_the_last_positions_logits_only():
    """logits_to_keep=1: a one-token generate holds B x V logits where the plain forward holds B x S x V."""
    big_vocab = {**SMALL, "vocab_size": 128_000}
    one = estimate(_gen(big_vocab, new_tokens=1, seq=1024), "cpu")
    forward = estimate(_gen(big_vocab, new_tokens=0, seq=1024), "cpu")
    assert one.peak_allocated_bytes < forward.peak_allocated_bytes


@settings(max_examples=25, deadline=None)
@given(n=st.integers(1, 600), more=st.integers(1, 300), kv=st.sampled_from(["dynamic", "static"]),
       model=st.sampled_from([SMALL, MISTRAL]))
def test_more_new_tokens_never_need_less_memory(n, more, kv, model):
    assert (estimate(_gen(model, new_tokens=n, kv_cache=kv), "cpu").peak_allocated_bytes
            <= estimate(_gen(model, new_tokens=n + more, kv_cache=kv), "cpu").peak_allocated_bytes)


# ---- inference.weights -----------------------------------------------------------------------------------------------

def _weights(kind: str | None, **inference) -> int:
    sc = _gen(new_tokens=0, seq=16, weights=kind, **inference)
    return estimate(sc).breakdown.parameters


def test_plain_weights_set_the_dtype():
    assert _weights("fp32") == 2 * _weights("bf16") == 2 * _weights("fp16")


def test_quantized_weights_replace_only_the_decoder_linears():
    spec = _gen().spec
    linears = sum(lin.weights for lin in spec.linear_layers()) * spec.num_layers
    nf4 = sum(bnb_weight_bytes("nf4", lin.out_features, lin.in_features, False) for lin in spec.linear_layers())
    assert _weights("nf4") == _weights("bf16") - 2 * linears + nf4 * spec.num_layers
    assert _weights("nf4", double_quant=True) < _weights("nf4") < _weights("int8")
    assert _weights("awq-int4") < _weights("gptq-int4") < _weights("int8")  # GPTQ adds g_idx
    assert _weights("int8") < _weights("gptq-int8") < _weights("bf16")  # fp16 scales per group of 128 and g_idx
    assert _weights("fp8") < _weights("int8") < _weights("bf16")  # int8 keeps an fp32 scale per row


@pytest.mark.parametrize("kind", ["nf4", "int8", "gptq-int4", "awq-int4", "fp8"])
def test_quantized_weights_say_what_is_not_measured(kind):
    est = estimate(_gen(new_tokens=0, weights=kind))
    weights = next(c for c in est.components if c.key == "weights")
    assert "not measured" in weights.source


def test_double_quant_needs_4bit_weights():
    with pytest.raises(ValueError, match="double_quant"):
        _gen(weights="int8", double_quant=True)


def test_inference_weights_with_lora_are_refused():
    with pytest.raises(ValueError, match="lora.base_weights"):
        Scenario.model_validate({"model": SMALL, "mode": "inference", "training": {"lora": {"rank": 8}},
                                 "inference": {"weights": "nf4"}})


@pytest.mark.parametrize("inference", [{"new_tokens": 128, "kv_cache": "static"}, {"weights": "nf4", "double_quant": True},
                                       {"new_tokens": 5, "weights": "gptq-int4"}, {"weights": "fp16"}])
def test_url_round_trip(inference):
    sc = _gen(**inference)
    params = state.scenario_to_params(sc)
    assert {"gen", "kv", "wq", "wdq"} & set(params)
    assert state.params_to_scenario(params) == sc


@pytest.mark.slow
@pytest.mark.parametrize(("out_f", "in_f"), [(344, 128), (128, 128), (1000, 96), (7, 9)])
def test_bnb_bytes_match_bitsandbytes(out_f, in_f):
    """bnb_weight_bytes against the tensors bitsandbytes itself makes (its CPU quantization)."""
    torch = pytest.importorskip("torch")
    functional = pytest.importorskip("bitsandbytes.functional")
    w = torch.randn(out_f, in_f, dtype=torch.bfloat16)
    for double in (False, True):
        for kind in ("nf4", "fp4"):
            q, s = functional.quantize_4bit(w, quant_type=kind, compress_statistics=double)
            # the nested state's 256-value code is a copy per weight (quantize_blockwise: code.to(device, copy=True))
            tensors = [q, s.absmax, s.code] + ([s.offset, s.state2.absmax, s.state2.code] if double else [])
            assert sum(t.numel() * t.element_size() for t in tensors) == bnb_weight_bytes(kind, out_f, in_f, double)
    cb, scb, _ = functional.int8_vectorwise_quant(w.half())
    assert cb.numel() * cb.element_size() + scb.numel() * scb.element_size() == bnb_weight_bytes("int8", out_f, in_f,
                                                                                                 False)


GEMMA3 = {"model_type": "gemma3_text", "vocab_size": 2000, "hidden_size": 128, "intermediate_size": 256,
          "num_hidden_layers": 6, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
          "sliding_window": 64}


@pytest.mark.parametrize("model", [SMALL, MISTRAL, GEMMA3], ids=["llama", "mistral", "gemma3"])
@pytest.mark.parametrize("kv", ["dynamic", "static"])
@pytest.mark.parametrize("new_tokens", [1, 2, 100])
def test_fast_peak_is_the_largest_listed_moment(model, kv, new_tokens):
    """The peak asked at the pieces' ends equals the largest of every listed moment (hybrid layers' caches differ
    from layer to layer under a static cache)."""
    from calc.memory.estimate import reference_estimate

    sc = _gen(model, new_tokens=new_tokens, seq=96, kv_cache=kv)
    assert estimate(sc, "cpu").peak_allocated_bytes == reference_estimate(sc, "cpu").peak_allocated_bytes


@pytest.mark.parametrize("inference", [{"new_tokens": -1}, {"new_tokens": 4_194_305}, {"new_tokens": "many"},
                                       {"new_tokens": True}, {"kv_cache": "paged"}, {"weights": "int3"},
                                       {"weights": "nf4", "double_quant": "yes"}, {"beams": 4}])
def test_hostile_inference_values_are_refused(inference):
    from calc.contract.boundary import validate

    with pytest.raises(ValueError):
        validate(Scenario, {"model": SMALL, "mode": "inference", "inference": inference}, "scenario")


def test_the_longest_generation_is_estimated():
    sc = _gen(new_tokens=4_194_304, seq=4_194_304, batch=1, kv_cache="static")
    tl = estimate(sc).timeline
    ctx = block_context(sc, "cuda")
    decode = next(i for i, e in enumerate(tl.events) if e.startswith("decode"))
    assert tl.activations[decode] == SMALL["num_hidden_layers"] * sum(cache_position_bytes(ctx)) * (2 * 4_194_304 - 1)


def _stored_bytes(model) -> int:
    """Every parameter's bytes with the bitsandbytes constants beside it (4-bit QuantState, int8 SCB)."""
    total = 0
    for p in model.parameters():
        total += p.numel() * p.element_size()
        qs = getattr(p, "quant_state", None)
        if qs is not None:
            total += sum(t.numel() * t.element_size()
                         for t in [qs.absmax, qs.code] + ([qs.offset, qs.state2.absmax, qs.state2.code] if qs.nested
                                                          else []))
        scb = getattr(p, "SCB", None)
        total += 0 if scb is None else scb.numel() * scb.element_size()
    return total


@pytest.mark.slow
@pytest.mark.parametrize(("kind", "double"), [("nf4", False), ("nf4", True), ("fp4", False), ("int8", False)])
@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_quantized_weights_match_a_bitsandbytes_model(kind, double, family):
    """The estimate's weights against a transformers model whose decoder linears bitsandbytes quantized (its CPU
    kernels): the packed weights, their constants, and what stays 16-bit (embeddings, norms, biases, lm_head)."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("bitsandbytes")
    from measure.suite_models import LLAMA_GQA, QWEN2
    from measure.workload import build_model, quantize_base

    cfg = {"llama": LLAMA_GQA, "qwen2": QWEN2}[family]
    sc = Scenario.model_validate({"model": cfg, "mode": "inference", "training": {"precision": "bf16"},
                                  "inference": {"weights": kind, "double_quant": double}})
    model = build_model(sc.variant(inference={}), torch.device("cpu"))
    # bitsandbytes quantizes when the weights move to a device
    quantize_base(model, LoraConfig(base_weights=kind, double_quant=double), torch.device("cpu"))
    assert _stored_bytes(model) == estimate(sc, "cpu").breakdown.parameters


def test_fp8_converts_the_routed_experts_too():
    """FineGrainedFP8 replaces the routed experts' 3-D stacks by fp8 ones with block scales (transformers
    integrations/finegrained_fp8.py FP8Experts); bitsandbytes leaves them 16-bit (no nn.Linear)."""
    def weights(kind: str | None) -> int:
        sc = Scenario.model_validate({"model": "qwen3-30b-a3b", "mode": "inference", "training": {"precision": "bf16"},
                                      "inference": {"weights": kind}})
        return next(c.bytes for c in estimate(sc).components if c.key == "weights")

    spec = Scenario(model="qwen3-30b-a3b").spec
    experts = spec.routed_expert_params_per_layer() * spec.num_layers
    bf16, fp8, nf4 = weights("bf16"), weights("fp8"), weights("nf4")
    assert bf16 - fp8 > 0.99 * experts  # each expert weight 2 B -> 1 B, plus its fp32 block scales
    assert bf16 - nf4 < 0.1 * experts  # the stacks stay bf16 under bitsandbytes
