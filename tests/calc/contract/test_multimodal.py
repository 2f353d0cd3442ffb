"""Multimodal wrappers (calc.contract.multimodal): config.json files shaped like the published ones (Gemma 3 4B /
12B, Mistral Small 3.1, Qwen2.5-VL 7B, Llama 4 Scout, LLaVA 1.5, under tests/data/multimodal) are read as their
language model, the vision tower's and projector's weights counted; the count equals what transformers'
<Wrapper>ForConditionalGeneration builds on the meta device, and the estimate says what it did."""

from __future__ import annotations

import copy
import json
import warnings
from pathlib import Path

import pytest

from calc.contract.architectures import spec_from_hf_config
from calc.contract.presets import model_presets
from calc.contract.scenario import Scenario
from calc.memory.engine import estimate

DATA = Path(__file__).resolve().parents[2] / "data" / "multimodal"
CONFIGS = {p.stem: json.loads(p.read_text()) for p in sorted(DATA.glob("*.json"))}


def _short(config: dict) -> dict:
    """The wrapper with a one-layer decoder (the vision side whole): a cheap meta-device build."""
    config = copy.deepcopy(config)
    text = config.get("text_config", config)
    text["num_hidden_layers"] = 1
    for key in ("layer_types", "no_rope_layers", "moe_layers"):
        text.pop(key, None)
    return config


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_vision_and_text_counts_equal_what_transformers_builds(name):
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    transformers.logging.set_verbosity_error()
    config = _short(CONFIGS[name])
    ours = spec_from_hf_config(copy.deepcopy(config))
    hf = dict(config)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hf_config = transformers.AutoConfig.for_model(hf.pop("model_type"), **hf)
        with torch.device("meta"):
            model = transformers.AutoModelForImageTextToText.from_config(hf_config)
    total = sum(p.numel() for p in model.parameters())
    language = sum(p.numel() for n, p in model.named_parameters() if "language_model" in n or n.startswith("lm_head"))
    assert total - language == ours.vision_params, name
    assert total == ours.total_params(), f"{name}: transformers {total:,} vs ours {ours.total_params():,}"


@pytest.mark.parametrize("name", ["gemma-3-12b-it", "gemma-3-4b-it"])
def test_gemma3_wrapper_is_the_gemma3_family_and_its_preset_plus_the_vision_tower(name):
    spec = spec_from_hf_config(CONFIGS[name])
    assert (spec.family, spec.wrapper) == ("gemma3_text", "gemma3")
    preset = model_presets()[name.removesuffix("-it")].spec
    text_only = spec.model_copy(update={"vision_params": 0, "wrapper": None, "name": preset.name})
    assert text_only.total_params() == preset.total_params()
    # the Gemma 3 report's 417M SigLIP encoder, with the projector (1152 x hidden + 1152)
    assert 416e6 < spec.vision_params - 1152 * (spec.hidden_size + 1) < 418e6


def test_llama4_scout_with_its_vision_side_is_the_published_109b():
    spec = spec_from_hf_config(CONFIGS["llama-4-scout-17b-16e"])
    assert spec.family == "llama4_text"
    assert abs(spec.total_params() - 109e9) / 109e9 < 0.005
    assert spec.total_params() - spec.vision_params == model_presets()["llama-4-scout"].spec.total_params()


def test_the_estimate_and_the_cli_table_say_the_model_was_read_as_its_language_model(tmp_path, capsys):
    from calc.cli.main import main

    sc = Scenario.model_validate({"model": CONFIGS["qwen2.5-vl-7b-instruct"], "hardware": {"gpu": "h100-sxm"},
                                  "training": {"seq_len": 1024}})
    est = estimate(sc)
    assert sc.spec.family == "qwen2" and est.model.total_params == sc.spec.total_params()
    assert any("qwen2_5_vl is read as its language model (qwen2)" in n for n in est.notes), est.notes
    path = tmp_path / "s.json"
    path.write_text(json.dumps(sc.model_dump(mode="json", exclude_defaults=True)))
    assert main(["estimate", str(path), "--format", "table"]) == 0
    assert "read as its language model" in capsys.readouterr().out


@pytest.mark.parametrize("change, needle", [
    ({"text_config": 3}, "text_config must be a JSON object"),
    ({"vision_config": {"hidden_size": 0}}, "vision_config.hidden_size must be >= 1"),
    ({"vision_config": {"num_hidden_layers": "27"}}, "vision_config.num_hidden_layers must be an integer"),
    ({"text_config": {"model_type": "bert"}}, "unsupported model_type"),
    ({"tie_word_embeddings": "yes"}, "tie_word_embeddings must be true or false"),
])
def test_a_bad_wrapper_is_one_line(change, needle):
    from calc.contract.errors import UserError

    with pytest.raises(UserError, match=needle):
        spec_from_hf_config({**CONFIGS["gemma-3-4b-it"], **change})
