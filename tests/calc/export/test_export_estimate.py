"""The estimate is of the run the export writes: DeepSpeed's optimizer (its temporaries), its ZeRO
buckets, and the host RAM that offload and model loading need (modelled from DeepSpeed 0.19's source;
tests/calc/export/test_export_run.py checks the optimizer class and ZeRO-3 partitioning against real DeepSpeed)."""

from __future__ import annotations

import pytest

from calc.contract import parallel, precision
from calc.contract.parallel import REDUCE_BUCKET_ELEMENTS
from calc.contract.scenario import Scenario
from calc.contract.units import GiB
from calc.export import deepspeed_config, export_deepspeed
from calc.memory.engine import estimate, model_states


def scen(model: str = "llama-2-7b", gpus: int = 8, **training) -> Scenario:
    t = {"micro_batch_size": 1, "seq_len": 2048, "precision": "bf16-mixed", **training}
    return Scenario(model=model, hardware={"gpu": "a100-80gb", "num_gpus": gpus}, training=t)


def layers(sc: Scenario) -> int:
    return sc.spec.num_layers


@pytest.mark.parametrize("impl", ["fused", "foreach", "for-loop"])
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_exported_optimizer_is_the_estimated_one(impl, stage):
    """FusedAdam has no temporaries; torch's AdamW (torch_adam) has foreach's list or for-loop's
    per-tensor pair. The export writes the one whose temporaries the estimate counts."""
    sc = scen(zero_stage=stage, optimizer_impl=impl)
    params = deepspeed_config(sc)["optimizer"]["params"]
    st = model_states(sc, layers(sc), True, True)
    if impl == "fused":
        assert "torch_adam" not in params and st.opt_temp == 0
    else:
        assert params["torch_adam"] is True and params["foreach"] is (impl == "foreach")
        assert st.opt_temp > 0


def test_issue_7b_zero2_fused_adam_has_no_foreach_temporary():
    """Issue 9: 7B on 8 GPUs at ZeRO-2 with DeepSpeed's FusedAdam was estimated ~3.1 GiB high."""
    fused, foreach = scen(zero_stage=2, optimizer_impl="fused"), scen(zero_stage=2, optimizer_impl="foreach")
    st = model_states(foreach, layers(foreach), True, True)
    assert st.opt_temp == pytest.approx(4 * foreach.spec.total_params() / 8, rel=1e-3)  # fp32 sqrt list / 8
    assert 3.0 * GiB < st.opt_temp < 3.3 * GiB
    assert model_states(fused, layers(fused), True, True).opt_temp == 0
    assert "FusedAdam" in export_deepspeed(fused).notes[0]


@pytest.mark.parametrize(("prec", "dtype_bytes"), [("bf16-mixed", (2,)), ("fp32", (4,)), ("amp-bf16", (4, 2))])
@pytest.mark.parametrize("gpus", [1, 8])
def test_zero3_reduce_bucket_is_counted(prec, dtype_bytes, gpus):
    """ZeRO-3 with the exported contiguous_gradients allocates one reduce_bucket_size bucket per
    communication dtype at any data-parallel size (0.93 GiB in bf16, issue 9; under torch_autocast a
    bf16 one for the Linear weights beside the fp32 one)."""
    sc = scen(zero_stage=3, precision=prec, gpus=gpus)
    assert deepspeed_config(sc)["zero_optimization"]["contiguous_gradients"] is True
    bucket = REDUCE_BUCKET_ELEMENTS * sum(dtype_bytes)
    assert parallel.reduce_bucket_bytes(dtype_bytes[0], 3, sum(dtype_bytes[1:])) == bucket
    st = model_states(sc, layers(sc), True, True)
    gathered = parallel.stage3_live_param_bytes(sc.spec.layer_params(), max(sc.spec.embedding_params(),
                                                sc.spec.lm_head_params()), precision.weight_bytes_per_param(
                                                    sc.training.precision), 3, gpus, total_params=st.params_local)
    assert (st.zero_buffers, st.zero3_gathered) == (bucket, gathered)
    est = estimate(sc)
    at_step = est.peak_phase == "optimizer"  # the gathered weights are released before the step
    assert next(c for c in est.components if c.key == "zero_buffers").bytes == bucket + (0 if at_step else gathered)
    if prec == "bf16-mixed":
        assert bucket / GiB == pytest.approx(0.93, abs=0.01)


def test_pinned_bytes_round_up_on_cuda_only():
    assert parallel.pinned_bytes(3 * 2**30, "cuda") == 4 * 2**30
    assert parallel.pinned_bytes(2**30, "cuda") == 2**30
    assert parallel.pinned_bytes(3 * 2**30, "cpu") == 3 * 2**30
    assert parallel.pinned_bytes(0, "cuda") == 0


def test_zero2_offload_host_ram_counts_deepspeeds_buffers():
    """ZeRO-2 + CPU optimizer offload, per rank: Adam states (8 B/param) + pinned fp32 master and fp32
    gradient partitions + pinned 16-bit partition copy + two largest-parameter staging buffers (one
    pinned on the host, one on the GPU)."""
    sc = scen(zero_stage=2, offload_optimizer="cpu", gpus=8)
    p, n = sc.spec.total_params(), 8
    part = round(p / n)
    largest = sc.spec.vocab_size * sc.spec.hidden_size
    for target in ("cpu", "cuda"):
        st = model_states(sc, layers(sc), True, True, target)

        def pin(b, target=target):
            return parallel.pinned_bytes(b, target)

        want = 8 * part + pin(4 * part) + pin(4 * part) + pin(2 * part) + pin(2 * largest)
        assert st.offloaded_cpu == pytest.approx(want, rel=1e-6)
        # DeepSpeed's CPU accelerator: the host is the device, so the offloaded bytes are in its peak too
        on_device = st.offloaded_cpu if target == "cpu" else 0
        assert st.zero_buffers == 2 * largest + on_device
        # the reduce buckets live from the first gradient hook to the end of backward only
        assert st.reduce_buckets == parallel.reduce_bucket_bytes(2, 2)
    assert model_states(sc, layers(sc), True, True, "cuda").offloaded_cpu > \
        model_states(sc, layers(sc), True, True, "cpu").offloaded_cpu


def test_offload_host_ram_includes_loading_the_model():
    """Below ZeRO-3 each process holds the whole model on the host while it is loaded; at ZeRO-3 with
    zero.Init (train.py builds TrainingArguments first) only one tensor at a time."""
    z2 = scen(model="llama-3.1-70b", gpus=8, zero_stage=2, offload_optimizer="cpu")
    z3 = scen(model="llama-3.1-70b", gpus=8, zero_stage=3, offload_optimizer="cpu")
    p = z2.spec.total_params()
    load = 2 * p * 8  # bf16 weights, 8 processes per node
    assert estimate(z2).cpu_ram_bytes == max(load, model_states(z2, 80, True, True).offloaded_cpu * 8)
    assert estimate(z2).cpu_ram_bytes >= load > 1.0e12
    assert estimate(z3).cpu_ram_bytes == model_states(z3, 80, True, True).offloaded_cpu * 8
    assert estimate(scen(zero_stage=2)).cpu_ram_bytes == 0  # no offload: nothing to check against host RAM


def test_zero12_rank0_partition_holds_whole_tensors_from_the_reduction_that_holds_one():
    """stage_1_and_2.py by hand. Tensors [emb 10 | layer 0 (4, 6) | layer 1 (4, 6) | top (norm 1, lm_head 10)]
    start at 0, 10, 14, 20, 24, 30, 31: 41 elements. Hooks run top down, each block's tensors last-registered
    first (lm_head, norm | 6, 4 of layer 1 | 6, 4 of layer 0 | emb); a bucket of 12 is reduced before the
    gradient that would overflow it, an oversized one on its own at the next hook or the epilogue."""
    order = parallel.ParamOrder((10,), [(4, 6), (4, 6)], (1, 10))
    # 2 ranks: 44 padded, rank 0's range [0, 22) -> the tensors starting at 0, 10, 14, 20 (24 elements); layer 1's
    # 4 (rank 0's) joins the bucket after its 6 reduced [lm_head, norm], and layer 0's 6 reduces it: block 2
    two = parallel.zero12_rank0_partition(order, 2, 12)
    assert (two.elements, two.block, two.pending_at_end) == (24, 2, 0)
    # 3 ranks: range [0, 14) -> emb and layer 0's 4 (14 elements), first reduced at the embedding's hook
    three = parallel.zero12_rank0_partition(order, 3, 12)
    assert (three.elements, three.block, three.trigger) == (14, 3, 10)
    one = parallel.zero12_rank0_partition(order, 1, 12)  # every tensor is rank 0's: the first reduction
    assert (one.elements, one.block) == (41, 1)
    whole = parallel.zero12_rank0_partition(order, 2, 100)  # one bucket for all: the backward epilogue
    assert (whole.elements, whole.block, whole.pending_at_end) == (24, 4, 0)
    big_emb = parallel.zero12_rank0_partition(parallel.ParamOrder((30,), [(4, 6)], (1,)), 4, 12)
    assert (big_emb.elements, big_emb.block, big_emb.pending_at_end) == (30, 3, 30)  # waits for the epilogue


def test_zero2_partition_is_rank0s_whole_tensors_where_the_order_is_known():
    """Llama-2-7B on 8 GPUs: rank 0's range (1/8 of the parameters) starts with the 131 M-element embedding
    and ends inside a layer, whose tensor that crosses the end is held whole; with a 500 M-element bucket the
    first reduction holding one of them comes near the bottom, after the top layers' reductions."""
    sc = scen(zero_stage=2)
    st = model_states(sc, layers(sc), True, True)
    part = st.rank0_partition
    n = sc.spec.total_params()
    assert n / 8 <= part.elements < n / 8 + max(sc.spec.layer_param_numels())
    assert 1 < part.block <= sc.spec.num_layers + 1
    lora = scen(zero_stage=2, lora={"rank": 8, "targets": "all-linear"})
    assert model_states(lora, layers(lora), True, True).rank0_partition is None  # its share (P / N) instead
