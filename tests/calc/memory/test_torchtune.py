"""training.framework torchtune: the engine against torchtune's own step measured on the CPU
(data/measured_torchtune.jsonl, measure/frameworks/torchtune_run.py), the chunks of its output projection, the
recipes' defaults and what the framework refuses."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from calc.contract.record import load_records
from calc.contract.scenario import FRAMEWORK_DEFAULTS, Scenario
from calc.memory.activations import block_context
from calc.memory.estimate import clear_memo, estimate, reference_estimate
from calc.sim import profiles
from calc.sim.frameworks.torchtune import output_chunk_lengths, torchtune_head_block, torchtune_layer
from calc.sim.profiles import block_profile

RECORDS = load_records(Path(__file__).parents[3] / "data" / "measured_torchtune.jsonl")
SMALL = {"model_type": "llama", "vocab_size": 32000, "hidden_size": 256, "intermediate_size": 688,
         "num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 2, "max_position_embeddings": 4096}


def _tt(model=None, **training) -> Scenario:
    return Scenario.model_validate({"model": model or SMALL, "training": {"framework": "torchtune",
                                                                          "seq_len": 1024, **training}})


def _error(rec) -> float:
    return (estimate(rec.run_scenario(), target="cpu").peak_allocated_bytes - rec.peak_allocated_bytes) \
        / rec.peak_allocated_bytes


def test_records_cover_the_torchtune_step():
    kinds = {(r.scenario.training.activation_checkpointing.value, r.scenario.training.cross_entropy,
              r.scenario.training.precision.value) for r in RECORDS}
    assert all(r.scenario.training.framework == "torchtune" for r in RECORDS)
    assert {("none", "chunked", "bf16"), ("full", "chunked", "bf16"), ("none", "standard", "bf16"),
            ("none", "chunked", "fp32")} <= kinds
    assert {r.scenario.training.lora.targets for r in RECORDS if r.scenario.training.lora} == \
        {"attention", "all-linear", ("q_proj", "v_proj")}
    qlora = {(r.scenario.spec.family, r.scenario.training.activation_checkpointing.value) for r in RECORDS
             if r.scenario.training.lora and r.scenario.training.lora.quantized}
    assert {("llama", "none"), ("llama", "full"), ("mistral", "full"), ("qwen2", "none"), ("qwen2", "full")} <= qlora
    assert {r.device for r in RECORDS} == {"cpu", "fake"}


def test_engine_matches_torchtune_within_half_a_percent_median_and_two_worst():
    errors = [abs(_error(r)) for r in RECORDS]
    assert statistics.median(errors) <= 0.005
    assert max(errors) <= 0.02


@pytest.mark.parametrize("rec", RECORDS, ids=[r.name for r in RECORDS])
def test_each_phase_within_half_a_percent(rec):
    tl = estimate(rec.run_scenario(), target="cpu").timeline
    predicted: dict[str, int] = {}
    for i, phase in enumerate(tl.phases):
        phase = "forward" if phase == "loss" else phase
        predicted[phase] = max(predicted.get(phase, 0), tl.total(i))
    for phase in ("forward", "backward", "optimizer"):
        measured = getattr(rec.phase_peaks_bytes, phase)
        assert abs(predicted[phase] - measured) <= 0.005 * measured, phase


@given(seq=st.integers(1, 5000), chunks=st.integers(1, 64))
def test_output_chunks_follow_torch_chunk(seq, chunks):
    lengths = output_chunk_lengths(seq, chunks)
    size = -(-seq // chunks)
    assert sum(lengths) == seq
    assert len(lengths) <= chunks
    assert all(n == size for n in lengths[:-1])
    assert 0 < lengths[-1] <= size


def test_more_output_chunks_lower_the_loss_peak():
    """Each chunk is upcast to fp32 on its own: the loss's transient shrinks with the chunk."""
    peaks = [block_profile(torchtune_head_block, block_context(_tt(cross_entropy_chunks=n), "cpu")).fwd_peak
             for n in (1, 2, 8, 32)]
    assert peaks == sorted(peaks, reverse=True)
    assert len(set(peaks)) == len(peaks)


def test_grouped_kv_is_expanded_to_every_head_before_sdpa():
    """MultiHeadAttention copies grouped K / V to all heads and SDPA saves the copies: for Llama 3.2 3B at 2 x 4096,
    1.75 GiB over its 28 layers beyond K / V at their own 8 heads."""
    ctx = block_context(_tt("llama-3.2-3b", micro_batch_size=2, seq_len=4096), "cpu")
    g = torchtune_layer(ctx)
    ops = {op.name: op for op in g.ops}
    sdpa = ops["sdpa"]
    copies = [ops[f"{x} expanded to all heads"].out for x in "kv"]
    assert all(c in sdpa.saves for c in copies)
    spec = ctx.spec
    beyond = sum(g.sizes[c] for c in copies) - 2 * 2 * ctx.tokens * spec.kv_width
    assert spec.num_layers * beyond == 1.75 * 2**30


def test_a_single_kv_head_is_expanded_by_a_view():
    """With one K / V head the expand-and-flatten is a stride-0 view: no copies, SDPA saves K / V as they are."""
    mqa = block_context(_tt({**SMALL, "num_key_value_heads": 1}), "cpu")
    names = {op.name for op in torchtune_layer(mqa).ops}
    assert "k expanded to all heads" not in names and "v expanded to all heads" not in names
    assert "k expanded to all heads" in {op.name for op in torchtune_layer(block_context(_tt(), "cpu")).ops}


def test_torchtune_defaults_are_the_recipes():
    dumped = _tt().training.model_dump(mode="json")
    assert {k: dumped[k] for k in FRAMEWORK_DEFAULTS["torchtune"]} == FRAMEWORK_DEFAULTS["torchtune"]
    t = _tt().training
    assert (t.precision.value, t.cross_entropy, t.cross_entropy_chunks) == ("bf16", "chunked", None)
    assert _tt(precision="fp32").training.precision.value == "fp32"  # a field given is kept


def test_chunked_needs_a_framework_that_chunks():
    with pytest.raises(ValueError, match="chunked"):
        Scenario.model_validate({"model": SMALL, "training": {"cross_entropy": "chunked"}})


@pytest.mark.parametrize("training", [{"precision": "amp-bf16"}, {"attention": "eager"},
                                      {"activation_checkpointing": "selective"}, {"sharding": "deepspeed"},
                                      {"lora": {"rank": 8, "base_weights": "fp4"}}, {"cross_entropy": "liger-fused"},
                                      {"precision": "fp32", "lora": {"rank": 8}},
                                      {"activation_checkpointing": "full", "checkpoint_every": 2}])
def test_what_torchtune_does_not_run_is_refused(training):
    with pytest.raises(ValueError, match="torchtune"):
        _tt(**training)


def test_torchtune_qlora_stores_the_base_as_torchao_nf4():
    """torchtune's QLoRA (quantize_base): every decoder linear of a Llama an NF4Tensor (torchao's layout, not
    bitsandbytes'), so the weights differ from the transformers QLoRA of the same model; lm_head stays bf16."""
    from calc.contract.quantized import torchao_nf4_bytes

    model = {**SMALL, "intermediate_size": 512}  # whole NF4 scaler blocks in every linear
    tt = estimate(_tt(model, lora={"rank": 8, "base_weights": "nf4"}))
    hf = estimate(Scenario.model_validate({"model": model, "training": {"seq_len": 1024, "precision": "bf16",
                                                                        "lora": {"rank": 8, "base_weights": "nf4"}}}))
    assert tt.breakdown.parameters != hf.breakdown.parameters
    assert torchao_nf4_bytes(4096 * 4096) == 4096 * 4096 // 2 + 4096 * 4096 // 64 + 2 * (1024 + 1 + 16)


def test_torchao_nf4_bytes_is_what_to_nf4_stores():
    """The layout against torchao itself: every tensor an NF4Tensor holds, for a few shapes."""
    torch = pytest.importorskip("torch")
    nf4 = pytest.importorskip("torchao.dtypes.nf4tensor")
    from calc.contract.quantized import torchao_nf4_bytes

    for rows, cols in ((256, 64), (512, 256), (128, 384), (1024, 256)):
        t = nf4.to_nf4(torch.randn(rows, cols, dtype=torch.bfloat16))
        stored = sum(x.untyped_storage().nbytes() for x in (t.quantized_data, t.quantized_scalers,
                                                              t.quantization_factor, t.scaler_mean, t.nf4))
        assert stored == torchao_nf4_bytes(rows * cols), (rows, cols)


def test_torchtune_qlora_refuses_what_torchao_and_the_builders_cannot_do():
    with pytest.raises(ValueError, match="whole blocks of 16,384 weights"):
        _tt({**SMALL, "hidden_size": 192}, lora={"rank": 8, "base_weights": "nf4"})
    with pytest.raises(ValueError, match="leave lm_head out"):
        _tt(lora={"rank": 8, "base_weights": "nf4", "targets": ["q_proj", "lm_head"]})
    with pytest.raises(ValueError, match="choose base_weights nf4"):
        _tt(lora={"rank": 8, "base_weights": "int8"})


def test_lora_qwen2_quantizes_only_the_adapted_linears():
    """lora_qwen2 leaves a linear without an adapter an nn.Linear; lora_llama3 makes it a FrozenNF4Linear."""
    from calc.contract.quantized import torchtune_nf4

    adapted = frozenset({"q", "v"})
    assert torchtune_nf4("qwen2", "q", adapted) and not torchtune_nf4("qwen2", "down", adapted)
    assert torchtune_nf4("llama", "down", adapted) and torchtune_nf4("mistral", "o", adapted)


def test_torchtune_is_one_device():
    with pytest.raises(ValueError, match="torchtune"):
        Scenario.model_validate({"model": SMALL, "hardware": {"num_gpus": 2},
                                 "training": {"framework": "torchtune"}})


def test_lora_records_load_again():
    """A LoRA scenario dumped to JSON (lists of module names) validates again under the records' strict rules."""
    lora = [r for r in RECORDS if r.scenario.training.lora is not None]
    assert lora and all(r.scenario.training.lora.modules_to_save == () for r in lora)


def test_torchtune_is_training():
    with pytest.raises(ValueError, match="torchtune"):
        Scenario.model_validate({"model": SMALL, "mode": "inference", "training": {"framework": "torchtune"}})


def test_rope_cache_buffer_is_in_the_weights():
    """One shared fp32 cache of max_seq_len x head_dim (+ theta), whatever the model's dtype."""
    plain = estimate(_tt(), "cpu").breakdown.parameters
    longer = estimate(_tt({**SMALL, "max_position_embeddings": 8192}), "cpu").breakdown.parameters
    assert longer - plain == 4 * 4096 * 32


@pytest.mark.slow
def test_a_committed_record_reproduces():
    """The committed set cannot drift from the measuring code: one record measured again (torchtune on the CPU)."""
    pytest.importorskip("torchtune")
    from measure.frameworks.torchtune_run import measure_torchtune, suite_scenario

    rec = next(r for r in RECORDS if r.name == "tt-llama3.2-tied-bf16-chunked8")
    assert rec.scenario == suite_scenario(rec.name)
    again = measure_torchtune(rec.scenario, "cpu", steps=rec.steps, name=rec.name)
    assert again.phase_peaks_bytes == rec.phase_peaks_bytes
    assert again.categories_at_peak_bytes == rec.categories_at_peak_bytes


@settings(max_examples=40, deadline=None)
@given(batch=st.integers(1, 6), seq=st.integers(1, 3000), chunks=st.sampled_from([None, 1, 3, 8, 16]),
       ckpt=st.sampled_from(["none", "full"]), model=st.sampled_from(["llama-3.2-1b", "qwen2.5-0.5b", "llama-3.1-8b"]))
def test_recorded_torchtune_blocks_equal_a_replay_of_each_shape(batch, seq, chunks, ckpt, model):
    """The chunk sizes are no polynomial of the sequence (torch.chunk's ceil): a recording serves only the shapes
    with the same chunks, and every estimate equals the one that simulates each block again."""
    sc = _tt(model, micro_batch_size=batch, seq_len=seq, cross_entropy_chunks=chunks, activation_checkpointing=ckpt)
    clear_memo()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(profiles, "RECORD_AT", 1)
        fast, slow = estimate(sc, "cpu"), reference_estimate(sc, "cpu")
    assert fast.peak_allocated_bytes == slow.peak_allocated_bytes
    assert fast.timeline == slow.timeline



def test_torchtune_lora_target_subsets_and_dropout_count_their_tensors():
    """torchtune's LoRALinear keeps what peft's does (dropout(x) -> lora_a -> lora_b, scaled): fewer targets hold
    fewer adapter activations, dropout adds its input and mask; modules_to_save is refused (adapters only)."""
    def peak(**lora):
        return estimate(Scenario.model_validate({"model": "llama-3.2-1b", "hardware": {"gpu": "a100-80gb"},
                                                 "training": {"framework": "torchtune",
                                                              "lora": {"rank": 8, **lora}}})).peak_allocated_bytes
    assert peak(targets=["q_proj", "v_proj"]) < peak(targets="attention") < peak(targets="all-linear")
    assert peak(targets="attention", dropout=0.1) > peak(targets="attention")
    with pytest.raises(ValueError, match="modules_to_save"):
        peak(modules_to_save=["lm_head"])
