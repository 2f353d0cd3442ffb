"""The waterfall of an inference scenario with quantized weights: the steps the scenario cannot take (ZeRO-3 and
parameter offload do not partition or offload bitsandbytes / GPTQ / FP8 storage) are left out, not estimated with
negative weights."""

from __future__ import annotations

import pytest

from calc.contract.scenario import Scenario
from calc.recommend.waterfall import optimization_waterfall


@pytest.mark.parametrize("weights", ["nf4", "fp4", "gptq-int4", "fp8"])
def test_quantized_inference_waterfall_leaves_out_zero3_steps(weights):
    sc = Scenario.model_validate({"model": "llama-2-70b", "hardware": {"cluster": "1x-h100-sxm"}, "mode": "inference",
                                  "inference": {"weights": weights}})
    steps = optimization_waterfall(sc)
    assert [s.step for s in steps] == list(range(len(steps)))
    assert all(s.scenario.training.zero_stage < 3 and s.scenario.training.offload_params.value == "none"
               for s in steps)
    assert all(s.peak_allocated_bytes > 0 for s in steps)


def test_quantized_inference_under_zero3_is_refused():
    with pytest.raises(ValueError, match="not partitioned or offloaded by ZeRO-3"):
        Scenario.model_validate({"model": "llama-2-70b", "mode": "inference", "inference": {"weights": "nf4"},
                                 "training": {"zero_stage": 3}})
