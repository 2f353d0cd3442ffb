"""The engine's fast paths give the same bytes as the long way: memoized estimates and cached block
profiles equal a cold computation, and the peak found by asking each run of identical layers only at its
ends (calc.memory.estimate.estimate) equals the largest of every listed moment (calc.memory.estimate.reference_estimate);
on the whole committed data set and on random scenarios, including scenarios that differ from a memoized
one in a single field."""

from __future__ import annotations

import dataclasses
import itertools
import pickle

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

import calc.contract.presets as presets
from calc.contract.scenario import Scenario
from calc.evidence.validate import load_all
from calc.memory.estimate import clear_memo, estimate, reference_estimate, shape_free_values
from calc.memory.result import Estimate
from calc.sim import profiles
from calc.sim.graph import OUT, BlockProfile, Graph
from calc.sim.layers import liger_chunk_tokens
from calc.sim.symbolic import Trace, Unsupported, fixed
from calc.speed import SpeedAssumptions, hardware_of, step_time
from tests.calc.memory.test_properties import FAST, scenarios
from tests.positions import within_positions


def _cold(sc: Scenario, **kw) -> str:
    clear_memo()
    return estimate(sc, **kw).model_dump_json()


def _kw(rec) -> dict:
    return {"target": "cuda" if rec.device == "cuda" else "cpu",
            "sharding": "fsdp2" if rec.engine == "fsdp2" else "deepspeed"}


def test_data_set_memo_equals_cold():
    records = load_all()
    assert len(records) > 100
    cold = [_cold(r.scenario, **_kw(r)) for r in records]
    clear_memo()
    warm = [estimate(r.scenario, **_kw(r)) for r in records]  # fills the memo in data-set order
    again = [estimate(Scenario.model_validate_json(r.scenario.model_dump_json()), **_kw(r)) for r in records]
    assert [w.model_dump_json() for w in warm] == cold
    assert all(a is w for a, w in zip(again, warm, strict=True))  # an equal scenario is a memo hit


@FAST
@given(scenarios(), scenarios())
def test_random_scenarios_memo_equals_cold(a, b):
    sa, sb = Scenario.model_validate(a), Scenario.model_validate(b)
    want_a, want_b = _cold(sa), _cold(sb)
    clear_memo()
    assert estimate(sa).model_dump_json() == want_a
    assert estimate(sb).model_dump_json() == want_b
    assert estimate(sa).model_dump_json() == want_a
    assert estimate(sa, target="cpu").model_dump_json() == _cold(sa, target="cpu")


@FAST
@given(scenarios())
def test_one_field_apart_is_a_different_answer(data):
    sc = Scenario.model_validate(data)
    first = estimate(sc)
    data["training"]["micro_batch_size"] += 1
    bigger = Scenario.model_validate(data)
    assert estimate(bigger).model_dump_json() == _cold(bigger)
    assert estimate(bigger).peak_allocated_bytes > first.peak_allocated_bytes or sc.mode.value == "inference"


def test_reloaded_presets_are_not_served_from_the_memo():
    """The memo is keyed by value: reloaded presets that are equal serve the same answer, a changed one a new one."""
    sc = Scenario(model="llama-3.2-1b", hardware={"gpu": "a100-80gb"})
    before = estimate(sc)
    presets.gpu_presets.cache_clear()  # what a test or a reload does: new preset objects, equal to the old
    assert estimate(Scenario(model="llama-3.2-1b", hardware={"gpu": "a100-80gb"})) is before
    gpus = presets.gpu_presets()
    try:
        gpus["a100-80gb"] = gpus["a100-80gb"].model_copy(update={"memory_bytes": 40 * 2**30})  # a reload that changed
        after = estimate(Scenario(model="llama-3.2-1b", hardware={"gpu": "a100-80gb"}))
        assert after is not before and after.gpu_memory_bytes == 40 * 2**30
        assert after.peak_allocated_bytes == before.peak_allocated_bytes
    finally:
        presets.gpu_presets.cache_clear()


@FAST
@given(scenarios())
def test_step_time_without_formulas_has_the_same_numbers(data):
    sc = Scenario.model_validate(data)
    hw, a = hardware_of(sc), SpeedAssumptions()
    full = dataclasses.asdict(step_time(sc.spec, sc.training, hw, sc.mode, a))
    quick = dataclasses.asdict(step_time(sc.spec, sc.training, hw, sc.mode, a, explain=False))
    assert all(t["formula"] for t in full["terms"]) and not any(t["formula"] for t in quick["terms"])
    for t in full["terms"]:
        t["formula"] = ""
    assert quick == full


def _same_as_reference(fast, ref) -> None:
    """Peak, its event, phase and step, components, device total and verdict, and every timeline point the
    charts draw (the fast estimate lists its timeline only now, when it is read). The fast estimate's models
    each hold exactly their fields, and validating them again changes nothing."""
    _exactly_its_fields(fast)
    fields = fast.model_dump(exclude={"components", "timeline"})
    assert Estimate.model_validate(fields).model_dump(exclude={"components", "timeline"}) == fields
    assert fast.model_dump_json(exclude={"timeline"}) == ref.model_dump_json(exclude={"timeline"})
    assert fast.timeline.model_dump_json() == ref.timeline.model_dump_json()
    tl = fast.timeline
    assert (tl.events[tl.peak_index], tl.phases[tl.peak_index]) == (fast.peak_event, fast.peak_phase)
    assert tl.total(tl.peak_index) == fast.peak_allocated_bytes == max(map(tl.total, range(len(tl.events))))


def _exactly_its_fields(model: BaseModel) -> None:
    """Every field in the model's order (the cached components and timeline aside), nothing else, and the same
    for the models inside it; an int is an int (a float would print as 1.0 in the JSON)."""
    held = [k for k in vars(model) if k not in type(model).model_computed_fields]
    assert held == list(type(model).model_fields), type(model).__name__
    assert model.model_fields_set == set(type(model).model_fields), type(model).__name__
    for value in vars(model).values():
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, BaseModel):
                _exactly_its_fields(item)
            assert not isinstance(item, float)


def test_a_copy_leaves_the_other_estimates_alone():
    """Estimates are made by pydantic's validation (calc.memory.result.make_estimate): a copy with changes, and an
    assignment, leave every other estimate's fields as they were."""
    a = estimate(Scenario.model_validate({"model": "llama-3.2-1b"}))
    b = estimate(Scenario.model_validate({"model": "llama-3.2-1b", "training": {"micro_batch_size": 3}}))
    changed = a.model_copy(update={"notes": ["a note"]})
    breakdown = a.breakdown.model_copy()
    breakdown.activations = 0
    assigned = estimate(Scenario.model_validate({"model": "llama-3.2-1b", "training": {"micro_batch_size": 5}}))
    assigned.notes = ["a note"]
    clear_memo()  # the estimate changed above is not served again
    assert changed.notes == ["a note"] and a.notes == b.notes == [] and a.breakdown.activations > 0
    assert a.model_fields_set == b.model_fields_set == set(Estimate.model_fields)
    assert a.breakdown.model_fields_set == set(type(a.breakdown).model_fields)


def test_data_set_fast_peak_equals_every_moment():
    records = load_all()
    assert len(records) > 100
    for r in records:
        clear_memo()
        _same_as_reference(estimate(r.scenario, **_kw(r)), reference_estimate(r.scenario, **_kw(r)))


# beyond test_properties.scenarios: pipeline and tensor parallelism, LoRA, FSDP2, offload, kept outputs,
# fused cross-entropy, models whose layers differ (Gemma 3's and gpt-oss's sliding layers, DeepSeek's dense
# first layers) and checkpointing every k-th layer
@st.composite
def broad_scenarios(draw):
    data = draw(scenarios())
    t = data["training"]
    data["model"] = draw(st.sampled_from([data["model"], "gemma-3-1b", "gpt-oss-20b", "deepseek-v2-lite"]))
    t["checkpoint_every"] = draw(st.sampled_from([1, 2, 3]))
    t["keep_outputs"] = draw(st.booleans())
    t["cross_entropy"] = draw(st.sampled_from(["standard", "liger-fused"]))
    parallel = draw(st.sampled_from(["data", "pipeline", "tensor", "fsdp2", "offload", "expert"]))
    if parallel in ("pipeline", "tensor", "fsdp2", "expert"):
        data["hardware"]["num_gpus"] = 8
    if parallel == "pipeline":
        t["pipeline_parallel"], t["zero_stage"] = draw(st.sampled_from([2, 4])), draw(st.sampled_from([0, 1]))
    elif parallel == "tensor":
        t["tensor_parallel"], t["sequence_parallel"] = 2, draw(st.booleans())
    elif parallel == "fsdp2":
        t["sharding"], t["zero_stage"] = "fsdp2", draw(st.sampled_from([2, 3]))
    elif parallel == "expert":  # the experts' mid-layer reduce rows (DeepSeek-V2-Lite: a dense first layer)
        data["model"] = draw(st.sampled_from(["deepseek-v2-lite", "qwen3-30b-a3b"]))
        t["sharding"], t["zero_stage"], t["expert_parallel"] = "fsdp2", draw(st.sampled_from([2, 3])), 8
    elif parallel == "offload":
        t["offload_optimizer"], t["zero_stage"] = "cpu", draw(st.sampled_from([1, 2, 3]))
    else:  # DeepSpeed ZeRO-1/2: a bucket below the model's size puts rank 0's partition mid-backward
        t["reduce_bucket_size"] = draw(st.sampled_from([500_000_000, 20_000_000, 3_000_000]))
    if data["model"] != "deepseek-v2-lite" and draw(st.booleans()):  # no LoRA on latent attention
        quantized = t["precision"] in ("amp-bf16", "amp-fp16", "bf16")
        t["lora"] = {"rank": draw(st.sampled_from([8, 64])), "targets": draw(st.sampled_from(["all-linear", "attention"])),
                     "base_weights": draw(st.sampled_from(["bf16", "nf4"] if quantized else ["bf16"]))}
    return data


@settings(FAST, max_examples=150)
@given(broad_scenarios(), st.sampled_from(["cuda", "cpu"]))
def test_random_scenarios_fast_peak_equals_every_moment(data, target):
    try:
        sc = Scenario.model_validate(data)
        ref = reference_estimate(sc, target=target)
    except ValueError:  # a combination the scenario or the engine rejects
        return
    clear_memo()
    _same_as_reference(estimate(sc, target=target), ref)


@FAST
@given(broad_scenarios(), broad_scenarios(), st.data())
def test_the_memo_key_is_the_scenario_without_its_shape(a, b, data):
    """Two scenarios share the memo's shape-free key exactly when their JSON without the batch shape is equal:
    the second scenario takes some of its fields from the first (all of them, at times)."""
    mixed = {**b, "model": data.draw(st.sampled_from([a["model"], b["model"]])),
             "hardware": data.draw(st.sampled_from([a["hardware"], b["hardware"]])),
             "mode": data.draw(st.sampled_from([a["mode"], b["mode"]])), "training": dict(b["training"])}
    for name in data.draw(st.sets(st.sampled_from(sorted(a["training"])))):
        mixed["training"][name] = a["training"][name]
    try:
        sa, sb = Scenario.model_validate(a), Scenario.model_validate(mixed)
    except ValueError:  # a combination the scenario rejects
        return
    shape = {"training": {"micro_batch_size", "seq_len"}}
    same_json = sa.model_dump_json(exclude=shape) == sb.model_dump_json(exclude=shape)
    assert (shape_free_values(sa) == shape_free_values(sb)) == same_json
    hash(shape_free_values(sb))  # LoRA settings and all


def test_a_pickled_estimate_keeps_its_timeline():
    """st.cache_data pickles estimates: the timeline is listed before the builder is left behind."""
    est = estimate(Scenario(model="llama-3.2-1b", hardware={"gpu": "a100-80gb"}))
    again = pickle.loads(pickle.dumps(est))
    assert again.model_dump_json() == est.model_dump_json() and again == est


# ---- block profiles recorded once per shape-free context (calc.sim.profiles, calc.sim.symbolic) ----------------

def _shape_scenario(model: str, batch: int, seq: int, **training) -> Scenario:
    return Scenario.model_validate({"model": model, "hardware": {"gpu": "a100-80gb", "num_gpus": 8},
                                    "training": {"micro_batch_size": batch, "seq_len": within_positions(model, seq),
                                                 **training}})


SHAPE_CONTEXTS = [  # (model, training options): families and branches whose ops or sizes differ
    ("llama-3.2-1b", {}), ("llama-3.2-1b", {"precision": "amp-bf16", "activation_checkpointing": "selective"}),
    ("gpt2", {"attention": "eager"}), ("pythia-160m", {"precision": "fp32"}), ("phi-3-mini", {}),
    ("mistral-7b", {}),  # a 4096-token sliding window: SDPA gets a mask from seq >= 4096 on
    ("gemma-3-1b", {"attention": "sdpa"}),  # 512-token windows on five of six layers
    ("gpt-oss-20b", {"attention": "eager"}), ("deepseek-v2-lite", {"precision": "bf16"}),
    ("qwen3-0.6b", {"cross_entropy": "liger-fused"}),  # Liger's chunk of tokens is a power of two of them
    ("llama-3.2-1b", {"tensor_parallel": 2, "sequence_parallel": True}),  # B*S // tp: replayed per shape
    ("mixtral-8x7b", {"lora": {"rank": 8, "targets": "attention"}}),
    ("qwen3-30b-a3b", {"sharding": "fsdp2", "zero_stage": 3, "expert_parallel": 8}),  # the experts' reduce moment
]


@settings(FAST, max_examples=120)
@given(st.sampled_from(SHAPE_CONTEXTS), st.integers(1, 9), st.integers(1, 9000), st.sampled_from(["cuda", "cpu"]))
def test_recorded_blocks_equal_a_replay_of_each_shape(context, batch, seq, target):
    """Recordings stay warm across examples: each context is evaluated at many shapes, among them sequences
    on both sides of a sliding window and token counts that change Liger's chunk. Every context is recorded
    at its first shape here, so that every example after it is served by a recording."""
    model, training = context
    sc = _shape_scenario(model, batch, seq, **training)
    clear_memo()  # the estimate memo and the profiles kept per shape, not the recordings
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(profiles, "RECORD_AT", 1)
        _same_as_reference(estimate(sc, target=target), reference_estimate(sc, target=target))


@pytest.mark.parametrize("model, training, shapes", [
    ("llama-3.2-1b", {}, [(1, 128), (3, 1000), (8, 4096), (2, 77), (5, 5)]),
    ("mistral-7b", {}, [(1, 4095), (2, 4096), (1, 8000), (4, 100), (2, 4095)]),
    ("qwen3-0.6b", {"cross_entropy": "liger-fused"}, [(1, 4096), (1, 100), (1, 101), (5, 3333)]),
])
def test_one_recording_serves_the_shapes_with_the_same_answers(model, training, shapes):
    """A new (B, S) reuses the recording of its context unless a guard's answer changes (the sliding window
    reached, another Liger chunk), and then records once more; every profile equals a replay. The first
    shapes of a context are replayed (profiles.RECORD_AT): short sequences here, then the listed ones."""
    clear_memo(shape_free=True)
    replayed = [(1, 10 + k) for k in range(profiles.RECORD_AT - 1)]
    for batch, seq in replayed + shapes:
        sc = _shape_scenario(model, batch, seq, **training)
        _same_as_reference(estimate(sc), reference_estimate(sc))
        if (batch, seq) == replayed[-1]:  # nothing recorded yet
            assert not profiles.counts.recorded
    counts = dict(profiles.counts.recorded)  # one context per block here: its recordings
    recorded = shapes
    if model == "llama-3.2-1b":  # no guard: one recording of each block for every listed shape
        assert counts == {"decoder_layer": 1, "embedding_block": 1, "head_block": 1}
    if model == "mistral-7b":  # the layer on each side of the window; the other blocks do not ask
        assert counts["decoder_layer"] == 2 and counts["head_block"] == 1
    if model == "qwen3-0.6b":  # Liger's head once per chunk size: 100 and 101 tokens make the same chunk
        spec = _shape_scenario(model, 1, 1).spec
        chunks = {liger_chunk_tokens(b * s, spec.hidden_size, spec.vocab_size) for b, s in recorded}
        assert counts["liger_head_block"] == len(chunks) == len(recorded) - 1 and counts["decoder_layer"] == 1


def test_sequence_parallel_blocks_are_replayed_per_shape():
    """B*S // tp is no polynomial with integer coefficients: such a layer is replayed for each shape."""
    clear_memo(shape_free=True)
    shapes = [(3, 1001), (2, 999), (1, 4096)] + [(1, 500 + k) for k in range(profiles.RECORD_AT - 2)]
    for batch, seq in shapes:  # the first shapes of a context are replayed in any case, then a recording is tried
        sc = _shape_scenario("llama-3.2-1b", batch, seq, tensor_parallel=2, sequence_parallel=True)
        _same_as_reference(estimate(sc), reference_estimate(sc))
    assert profiles.counts.undescribable["decoder_layer"] == 1 and "decoder_layer" not in profiles.counts.recorded


def test_symbolic_sizes_and_guards():
    trace = Trace(batch=2, seq=100)
    b, s = trace.batch, trace.seq
    size = 4 * b * s * 8 + 8 * b * (s + 1)
    assert size.value == 4 * 2 * 100 * 8 + 8 * 2 * 101 and size.poly == {(1, 1): 40, (1, 0): 8}
    assert (b * s * s // s).poly == {(1, 1): 1}  # an exact division by a monomial
    assert (s >= 64) is True and trace.holds(1, 64) and not trace.holds(1, 63)
    assert fixed(liger_chunk_tokens, b * s, 2048, 151936) == liger_chunk_tokens(200, 2048, 151936)
    with pytest.raises(Unsupported):
        b * s // 3  # noqa: B018 - the quotient of this shape only


@settings(FAST, max_examples=40)
@given(st.integers(1, 64), st.integers(1, 5000), st.sampled_from([1, 512]))
def test_plan_rounds_like_the_allocator(batch, seq, round_to):
    """Sizes are rounded when the plan is evaluated: the recorded plan of a small graph gives what the graph
    built for the concrete shape gives."""
    def build(b, s):
        g = Graph(input_bytes=2 * b * s * 64, round_to=round_to)
        x = g.op(4 * b * s, ins=(0,), saves=(0, OUT))
        y = g.op(2 * b * s * s + 8 * b, ins=(x,), saves=(OUT,), ws_fwd=4 * b * s)
        g.op(2 * b * s * 64, ins=(y, 0), pgrad=100)
        return g

    trace = Trace(batch, seq)
    recorded, built = build(trace.batch, trace.seq).plan().at(batch, seq), build(batch, seq).profile()
    assert recorded == built and recorded._asdict() == built._asdict()  # every field, by name
    assert type(recorded) is BlockProfile


@FAST
@given(sc=scenarios(), batch=st.integers(1, 64), seq=st.integers(1, 1 << 15))
def test_a_memoized_context_with_a_new_shape_is_the_context_of_that_shape(sc, batch, seq):
    """The engine keeps each block context without its shape and copies it for a new (B, S) (Ctx.with_shape): the
    copy equals the context built for that shape, its shape-free key included."""
    from calc.memory.activations import block_context

    sc = Scenario.model_validate(sc)
    ctx = block_context(sc, "cuda")
    key = ctx.shape_free  # cached on the instance, then copied with the other fields
    shaped = ctx.with_shape(batch, seq)
    assert shaped == dataclasses.replace(ctx, batch=batch, seq=seq) and shaped.tokens == batch * seq
    assert shaped.shape_free == key == dataclasses.replace(ctx, batch=batch, seq=seq).shape_free
    assert (ctx.batch, ctx.seq) == (sc.training.micro_batch_size, sc.training.seq_len)  # the memoized one unchanged
    for kind in itertools.product([False, True], repeat=3):  # another kind of layer (calc.memory.activations.layer_ctxs)
        sliding, dense, grad = kind
        made = shaped.with_kind(*kind)
        assert made == dataclasses.replace(shaped, sliding=sliding, dense_mlp=dense, input_grad=grad)
        assert made.shape_free == dataclasses.replace(shaped, sliding=sliding, dense_mlp=dense,
                                                      input_grad=grad).shape_free
    assert shaped.shape_free == key  # the context copied from is unchanged


def test_per_layer_asks_once_per_kind_of_layer():
    """per_layer calls its function once per distinct context object, first seen first, whatever the pattern:
    one kind, layer 0 a kind of its own (LoRA on a frozen embedding without checkpointing), one kind at both
    ends and another between them; identical_layers compares the distinct profiles by value."""
    from calc.memory.activations import block_context, layer_ctxs, layer_profile
    from calc.memory.repeats import identical_layers, per_layer, repeats

    sc = Scenario.model_validate({"model": "llama-3.2-1b", "training": {"lora": {"rank": 8}}})
    own_first = layer_ctxs(block_context(sc, "cuda"), 16, first_input_grad=False)
    a, b = own_first[0], own_first[1]
    assert a is not b and a != b
    for ctxs in ([b] * 16, own_first, [a] + [b] * 14 + [a], [b, b, a, b]):
        asked: list = []
        out = per_layer(ctxs, lambda c, asked=asked: asked.append(c) or ("first" if c is a else "rest"))
        assert out == ["first" if c is a else "rest" for c in ctxs]
        assert [id(c) for c in asked] == list(dict.fromkeys(map(id, ctxs)))
    p, q = layer_profile(a, False), layer_profile(b, False)
    assert p != q  # layer 0 saves less: its input needs no gradient
    lay = per_layer(own_first, lambda c: layer_profile(c, False))  # the kinds and their pattern carried along
    assert lay.kinds == [p, q] and lay.pattern is own_first.pattern and list(lay) == [p] + [q] * 15
    assert repeats(lay, [0] * 16, 0) == repeats(list(lay), [0] * 16, 0) == (1, 1)
    assert repeats(lay, [0] * 16, 3) == repeats(list(lay), [0] * 16, 3) == (1, 3)
    assert not identical_layers(lay) and not identical_layers(list(lay))
    assert identical_layers([q] * 5) and identical_layers([q, BlockProfile(*q)] * 3)  # an equal copy
    assert not identical_layers([p] + [q] * 4) and not identical_layers([q] * 4 + [p] + [q])
    assert not identical_layers([q] * 5, [0, 0, 1, 0, 0])


@FAST
@given(lead=st.lists(st.integers(0, 3), max_size=4), cycle=st.lists(st.integers(0, 3), min_size=1, max_size=7),
       layers=st.integers(1, 130), every=st.integers(0, 4), drops=st.booleans())
def test_running_sums_of_repeating_layers_are_composed_exactly(lead, cycle, layers, every, drops):
    """Layers of a few kinds (objects) in any pattern, mostly a lead and then a repeating cycle (Gemma 3's local
    and global layers, a kind of its own at layer 0, DeepSeek's dense first layers), checkpointed every k-th:
    repeats finds where the layers repeat, and the running sums composed from the lead and one period
    (prefix_sums) equal the sums listed layer by layer, at every layer."""
    from itertools import accumulate

    from calc.memory.repeats import prefix_sums, repeats

    kinds = [object() for _ in range(4)]
    pattern = (lead + cycle * (layers // len(cycle) + 1))[:layers]
    lay = [kinds[k] for k in pattern]
    sel_drop = [10 * k if drops else 0 for k in pattern]
    lead, period = repeats(lay, sel_drop, every)
    if period:
        assert lead + period < layers
        for i in range(lead, layers - period):  # what the composition relies on
            assert lay[i] is lay[i + period] and sel_drop[i] == sel_drop[i + period]
            assert not every or (i % every == 0) == ((i + period) % every == 0)

    def value(i: int) -> int:  # a value that depends on the layer's kind, its drop and its checkpointing
        return 7 * pattern[i] + 1000 * (bool(every) and i % every == 0) + sel_drop[i] + 1

    listed = list(accumulate(map(value, range(layers)), initial=5))
    sums = prefix_sums(value, layers, period, 5, lead)
    assert [sums[i] for i in range(layers + 1)] == listed
    assert [sums.value(i) for i in range(layers)] == [value(i) for i in range(layers)]


def test_repeats_of_the_models_kinds_of_layer():
    """Where the layers start repeating, and how often: layer 0 a kind of its own (LoRA on a frozen embedding),
    Gemma 3's five local layers and a global one (with checkpointing of every 4th layer: both repeat every 12),
    DeepSeek's three dense first layers; nothing shorter than the run for layers that do not repeat."""
    from calc.memory.repeats import repeats

    a, b, c = object(), object(), object()
    assert repeats([a] + [b] * 125, [0] * 126, 0) == (1, 1)
    gemma = ([b] * 5 + [c]) * 4 + [b, b]
    assert repeats(gemma, [0] * 26, 0) == (0, 6)
    assert repeats(gemma, [0] * 26, 4) == (0, 12)
    assert repeats([a] * 3 + [b] * 58, [0] * 61, 1) == (3, 1)
    assert repeats([a, b, c, a, b, c, a], [0] * 7, 0) == (0, 3)
    assert repeats([a, b, c, b, a, c], [0] * 6, 0) == (2, 3)  # from layer 2 on: c, b, a, c
    assert repeats([a, b, b, c], [0] * 4, 0) == (0, 0)  # no repeat shorter than the run
