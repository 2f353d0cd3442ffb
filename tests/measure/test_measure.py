"""The measurement scripts (measure/): MemTracker against a hand count, records, the CLI, fake mode and
its extrapolation, and the committed CPU data set re-measured live."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from calc.contract.record import MeasurementRecord, RecordError, load_records

ROOT = Path(__file__).resolve().parents[2]
DATA_CPU = ROOT / "data" / "measured_cpu.jsonl"

TINY_LLAMA = {"model_type": "llama", "vocab_size": 1000, "hidden_size": 64, "intermediate_size": 128,
              "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2}


def _scenario(model: dict | str = TINY_LLAMA, **training) -> object:
    from calc.contract.scenario import Scenario

    mode = training.pop("mode", "train")
    gpus = training.pop("hardware_gpus", 1)
    return Scenario.model_validate({"model": model, "mode": mode, "hardware": {"num_gpus": gpus},
                                    "training": {"micro_batch_size": 2, "seq_len": 32, "precision": "fp32",
                                                 **training}})


# ---- MemTracker on a toy model, against a hand count ---------------------------------------------

def _hand_peaks(batch: int, d: int, layers: int) -> dict[str, int]:
    """Live bytes of one SGD step of L bias-free Linear(d, d) layers on x (B, d), loss = out.sum(), fp32.

    P = L d^2 * 4 (weights), X = A = B d * 4 (input, one activation). PyTorch keeps:
    forward   every layer's output is saved as the next layer's input; the last one is alive when sum()
              returns: P + X + L*A + 4 (loss).
    backward  torch.autograd.backward holds the seed gradient ones_like(loss) (4 bytes) until it returns.
              In layer k's backward (mm: weight grad first, then input grad) the live set is
              P + X + loss + seed + grads of layers k..L (d^2*4 each) + incoming grad (A; for the last
              layer a 4-byte expand of the seed) + the new input grad (A) + saved inputs of layers 2..k
              (k-1 activations). Layer 1 computes no input grad (x needs none).
    optimizer SGD without momentum, for-loop: param.add_(grad) in place, nothing new: 2P + X + loss.
    """
    P, X, A = layers * d * d * 4, batch * d * 4, batch * d * 4
    fwd = P + X + layers * A + 4
    bwd = []
    for k in range(layers, 0, -1):
        grads = (layers - k + 1) * d * d * 4
        incoming = 0 if k == layers else A
        new_input_grad = A if k > 1 else 0
        bwd.append(P + X + 8 + grads + incoming + new_input_grad + (k - 1) * A)
    return {"forward": fwd, "backward": max(bwd), "optimizer": 2 * P + X + 4}


@pytest.mark.parametrize(("batch", "d", "layers"), [(64, 16, 3), (8, 32, 4)])
def test_memtracker_matches_hand_count_on_linear_stack(batch: int, d: int, layers: int) -> None:
    torch = pytest.importorskip("torch")
    from measure.trackers import PhaseMemTracker

    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(d, d, bias=False) for _ in range(layers)])
    opt = torch.optim.SGD(model.parameters(), lr=0.1, foreach=False)
    x = torch.randn(batch, d)
    mt = PhaseMemTracker()
    mt.track_external(model, x)
    with mt:
        for _ in range(2):
            with mt.phase("forward"):
                loss = model(x).sum()
            with mt.phase("backward"):
                loss.backward()
            with mt.phase("optimizer"):
                opt.step()
                opt.zero_grad(set_to_none=True)
            del loss
            mt.step_done()
    hand = _hand_peaks(batch, d, layers)
    assert mt.phase_peak == hand, (mt.phase_peak, hand)
    assert mt.peak_total() == max(hand.values())  # MemTracker's own global peak agrees



def test_memtracker_does_not_count_meta_tensors() -> None:
    """Meta-device tensors hold no memory: DeepSpeed ZeRO-1/2 keep a meta copy of every parameter's
    shape (stage_1_and_2.py round_robin_bit16_meta), which MemTracker alone would count as bytes."""
    torch = pytest.importorskip("torch")
    from measure.trackers import PhaseMemTracker

    mt = PhaseMemTracker()
    with mt:
        with mt.phase("forward"):
            shapes = torch.zeros(1000, 1000, device="meta")
            real = torch.ones(100, 10)
            assert mt.current_total() == real.numel() * 4
            assert sum(mt.current_raw().values()) == real.numel() * 4
        del shapes, real
        mt.step_done()
    assert mt.phase_peak == {"forward": 4000}
    assert mt.peak_total() == 4000

# ---- records -----------------------------------------------------------------------------------

def _record_dict() -> dict:
    return {
        "scenario": {"model": TINY_LLAMA}, "device": "cpu",
        "env": {"python": "3.11", "torch": "2.13.0", "transformers": "5.23.0", "device_name": "cpu"},
        "peak_allocated_bytes": 123, "peak_phase": "forward", "phase_peaks_bytes": {"forward": 123},
        "step_phase_peaks_bytes": [{"forward": 123}], "weights_bytes": 100, "initial_allocated_bytes": 110,
        "num_params": 25, "trainable_params": 25, "steps": 1,
        "measured_at": "2025-01-01T00:00:00Z", "wall_seconds": 0.5,
    }


def test_record_round_trip(tmp_path: Path) -> None:
    rec = MeasurementRecord.model_validate(_record_dict())
    path = tmp_path / "r.jsonl"
    path.write_text(rec.to_json_line() + "\n\n" + rec.to_json_line() + "\n")
    back = load_records(path)
    assert back == [rec, rec]
    assert json.loads(rec.to_json_line())["peak_allocated_bytes"] == 123


def test_malformed_record_names_line_and_field(tmp_path: Path) -> None:
    good = MeasurementRecord.model_validate(_record_dict()).to_json_line()
    bad = _record_dict()
    bad["peak_allocated_bytes"] = -5
    path = tmp_path / "r.jsonl"
    path.write_text(good + "\n" + json.dumps(bad) + "\n")
    with pytest.raises(RecordError, match=r"r\.jsonl:2: peak_allocated_bytes"):
        load_records(path)
    bad = _record_dict()
    bad["surprise"] = 1
    path.write_text(json.dumps(bad) + "\n")
    with pytest.raises(RecordError, match=r":1: surprise: Extra inputs"):
        load_records(path)
    bad = _record_dict()
    bad["scenario"]["training"] = {"seq_len": 0}
    path.write_text(json.dumps(bad) + "\n")
    with pytest.raises(RecordError, match=r":1: scenario\.training\.seq_len"):
        load_records(path)


# ---- the CLI -------------------------------------------------------------------------------------

def _cli(*args: str, tmp: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "measure", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "HOME": str(tmp)})


def test_cli_end_to_end(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    sc = tmp_path / "s.json"
    sc.write_text(json.dumps({"model": TINY_LLAMA, "training": {"micro_batch_size": 1, "seq_len": 16,
                                                                "precision": "fp32"}}))
    out = tmp_path / "out.jsonl"
    res = _cli(str(sc), "--device", "cpu", "--steps", "2", "-o", str(out), tmp=tmp_path)
    assert res.returncode == 0, res.stderr
    rec = json.loads(res.stdout)
    assert rec["peak_allocated_bytes"] > 0
    assert rec["engine"] == "torch-single" and rec["steps"] == 2
    assert load_records(out)[0].peak_allocated_bytes == rec["peak_allocated_bytes"]


def test_cli_bad_input_exits_2_with_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    res = _cli(str(bad), "--device", "cpu", tmp=tmp_path)
    assert res.returncode == 2
    assert res.stderr.count("\n") == 1 and "not valid JSON" in res.stderr and "Traceback" not in res.stderr
    invalid = tmp_path / "invalid.json"
    invalid.write_text(json.dumps({"model": TINY_LLAMA, "training": {"seq_len": 0}}))
    res = _cli(str(invalid), "--device", "cpu", tmp=tmp_path)
    assert res.returncode == 2 and res.stderr.count("\n") == 1 and "training.seq_len" in res.stderr


@pytest.mark.parametrize(("training", "device", "message"), [
    ({"optimizer": "adamw-8bit"}, "fake", "adamw-8bit .* unsupported on this device"),
    ({"lora": {"base_weights": "nf4"}, "precision": "amp-bf16"}, "fake", "nf4 .* unsupported on this device"),
    ({"optimizer": "adafactor", "optimizer_impl": "fused"}, "cpu", "no fused implementation"),
    ({"optimizer": "adafactor"}, "fake", "adafactor is unsupported on this device"),
])
def test_unsupported_on_device_is_a_clear_error(training: dict, device: str, message: str) -> None:
    pytest.importorskip("torch")
    from measure.entry import measure
    from measure.workload import UnsupportedError

    sc = _scenario(seq_len=8, **training)
    with pytest.raises(UnsupportedError, match=message):
        measure(sc, device, steps=1)


def test_cli_maps_unsupported_to_exit_2(tmp_path: Path, capsys) -> None:
    pytest.importorskip("torch")
    from measure.__main__ import main

    sc = tmp_path / "s.json"
    sc.write_text(json.dumps({"model": TINY_LLAMA, "training": {"optimizer": "adamw-8bit", "seq_len": 8}}))
    assert main([str(sc), "--device", "fake"]) == 2  # bitsandbytes needs real tensors
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unsupported on this device" in err


# ---- fake mode -----------------------------------------------------------------------------------

@pytest.mark.parametrize("training", [
    {"precision": "amp-bf16", "seq_len": 64},
    {"precision": "bf16-mixed", "activation_checkpointing": "full", "checkpoint_every": 2, "seq_len": 64},
])
def test_fake_equals_cpu(training: dict) -> None:
    """Fake tensors take the same dispatch path as cpu ones, so MemTracker counts the same bytes."""
    pytest.importorskip("torch")
    from measure.entry import measure

    sc = _scenario(**training)
    cpu, fake = measure(sc, "cpu", steps=2), measure(sc, "fake", steps=2)
    assert fake.peak_allocated_bytes == cpu.peak_allocated_bytes
    assert fake.phase_peaks_bytes == cpu.phase_peaks_bytes
    assert fake.categories_at_peak_bytes == cpu.categories_at_peak_bytes


@pytest.mark.parametrize(("layers", "training"), [
    (7, {"precision": "amp-bf16", "seq_len": 64}),  # depths 3, 4, 5 -> 7
    (9, {"precision": "bf16", "activation_checkpointing": "full", "checkpoint_every": 2, "seq_len": 64}),  # 3, 5, 7
])
def test_fake_extrapolation_equals_full_depth(layers: int, training: dict) -> None:
    pytest.importorskip("torch")
    from measure.entry import measure

    sc = _scenario({**TINY_LLAMA, "num_hidden_layers": layers}, **training)
    full = measure(sc, "fake", steps=2)
    extra = measure(sc, "fake", steps=2, extrapolate_layers=True)
    assert extra.extrapolated_from_layers is not None and max(extra.extrapolated_from_layers) < layers
    assert extra.peak_allocated_bytes == full.peak_allocated_bytes
    assert extra.phase_peaks_bytes == full.phase_peaks_bytes
    assert extra.step_phase_peaks_bytes == full.step_phase_peaks_bytes
    assert extra.categories_at_peak_bytes == full.categories_at_peak_bytes
    assert (extra.weights_bytes, extra.num_params) == (full.weights_bytes, full.num_params)


def test_sharded_fake_equals_cpu_and_zero2_keeps_params_gathered() -> None:
    pytest.importorskip("torch")
    from measure.entry import measure

    recs = {}
    for stage in (2, 3):
        sc = _scenario(hardware_gpus=4, zero_stage=stage, precision="bf16-mixed", seq_len=64)
        cpu, fake = measure(sc, "cpu", steps=2), measure(sc, "fake", steps=2)
        assert cpu.engine == fake.engine == "fsdp2" and cpu.sharding.world_size == 4
        assert fake.peak_allocated_bytes == cpu.peak_allocated_bytes
        assert fake.raw_categories_at_peak_bytes == cpu.raw_categories_at_peak_bytes
        recs[stage] = cpu
    # ZeRO-3 shards the weights 4 ways: rank 0 holds a quarter of the fp32 parameters
    assert recs[3].weights_bytes * 4 == pytest.approx(recs[3].num_params * 4, rel=0.01)
    # ZeRO-2 (reshard_after_forward=False) keeps every layer's gathered bf16 params into the backward
    assert recs[2].phase_peaks_bytes.forward > recs[3].phase_peaks_bytes.forward


# ---- the committed data set cannot drift -----------------------------------------------------------

REMEASURE = ["llama-fp32-b1-seq32", "gpt2-dropout-amp-bf16", "llama-bf16-mixed-full-every2"]


@pytest.mark.parametrize("name", REMEASURE)
def test_committed_cpu_records_reproduce(name: str) -> None:
    pytest.importorskip("torch")
    from measure.entry import measure

    records = {r.name: r for r in load_records(DATA_CPU) if r.device == "cpu"}
    assert name in records, f"{name} missing from {DATA_CPU}"
    rec = records[name]
    again = measure(rec.scenario, "cpu", steps=rec.steps, name=name)
    assert again.peak_allocated_bytes == rec.peak_allocated_bytes
    assert again.phase_peaks_bytes == rec.phase_peaks_bytes
    assert again.categories_at_peak_bytes == rec.categories_at_peak_bytes


@pytest.mark.parametrize("path", sorted((ROOT / "data").glob("measured_*.jsonl")), ids=lambda p: p.name)
def test_committed_records_load_and_match_calc_parameter_counts(path: Path) -> None:
    """Every committed record is valid, and the measured model has calc's exact parameter count."""
    records = load_records(path)
    assert records
    for r in records:
        if r.scenario.training.lora is None and r.engine == "torch-single":
            assert r.num_params == r.scenario.spec.total_params(), r.name
        if r.categories_at_peak_bytes is not None:
            assert r.categories_at_peak_bytes.total() == r.peak_allocated_bytes, r.name


def test_optimizer_in_backward_model_is_freed_after_its_run() -> None:
    """Each parameter's post-accumulate-grad hook lives on the C++ side, where the garbage collector cannot see the
    cycle parameter -> hook -> optimizer -> parameter: a run that does not unhook leaves its whole model allocated
    (on a GPU, inside every later record of the suite)."""
    import gc
    import weakref

    import torch

    from measure.runner import measure_single
    from measure.workload import NullTracker, build_workload, prepare_optimizer, run_steps

    sc = _scenario(optimizer_in_backward=True)
    w = build_workload(sc, torch.device("cpu"))
    prepare_optimizer(w, NullTracker())
    run_steps(w, NullTracker(), 1)
    param = weakref.ref(next(w.model.parameters()))
    w.release()
    del w
    gc.collect()
    assert param() is None

    before = len([o for o in gc.get_objects() if isinstance(o, torch.nn.Parameter)])
    measure_single(sc, "cpu", steps=1)
    gc.collect()
    assert len([o for o in gc.get_objects() if isinstance(o, torch.nn.Parameter)]) == before
