"""calc.export for framework torchtune and litgpt: the torchtune recipe config states the scenario's values and
passes torchtune's own parser and builders (OmegaConf + torchtune.config.instantiate of the model and the loss,
every key the installed recipe reads present, `tune validate`, the checkpointer loading a tiny Hugging Face
checkpoint into the exported model); the LitGPT command line passes LitGPT's own jsonargparse CLI
(litgpt/__main__.py) with the scenario's values; the CLI writes the files; what the frameworks cannot say is
refused by name."""

from __future__ import annotations

import importlib.util
import json
import re
import shlex
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from calc.contract.scenario import Scenario
from calc.export import ExportOptions, export_bundle
from calc.export.litgpt import FABRIC_PRECISION, litgpt_argv, litgpt_launch_script
from calc.export.torchtune import (
    PRESET_BUILDERS,
    TORCHTUNE_FILE,
    recipe_name,
    torchtune_builder_args,
    torchtune_config,
    torchtune_yaml,
)

TINY_LLAMA = {"model_type": "llama", "vocab_size": 2000, "hidden_size": 128, "intermediate_size": 344,
              "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
              "max_position_embeddings": 256, "tie_word_embeddings": False}
TINY_QWEN = {**TINY_LLAMA, "model_type": "qwen2", "tie_word_embeddings": True}
NF4_LLAMA = {**TINY_LLAMA, "hidden_size": 256, "intermediate_size": 512}  # whole torchao NF4 blocks
NF4_QWEN = {**NF4_LLAMA, "model_type": "qwen2", "tie_word_embeddings": True}


def tt(model=TINY_LLAMA, **training) -> Scenario:
    return Scenario.model_validate({"model": model, "training": {"framework": "torchtune", **training}})


def lit(model=TINY_LLAMA, **training) -> Scenario:
    return Scenario.model_validate({"model": model, "training": {"framework": "litgpt", **training}})


LORA_TARGETS = st.sampled_from(["attention", "all-linear", ("q_proj", "v_proj"),
                                ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),
                                ("v_proj", "lm_head")])
TORCHTUNE_SCENARIOS = st.builds(
    lambda model, micro, seq, accum, ckpt, loss, chunks, impl, lora, rank: tt(
        model, micro_batch_size=micro, seq_len=seq, gradient_accumulation_steps=accum,
        activation_checkpointing=ckpt, cross_entropy=loss, cross_entropy_chunks=chunks if loss == "chunked" else None,
        optimizer_impl=impl, **({"lora": {"rank": rank, "alpha": 2 * rank, "targets": lora}} if lora else {})),
    st.sampled_from([TINY_LLAMA, TINY_QWEN, "llama-3.2-1b", "qwen2.5-0.5b"]), st.integers(1, 8),
    st.integers(16, 256), st.integers(1, 4), st.sampled_from(["none", "full"]), st.sampled_from(["chunked", "standard"]),
    st.one_of(st.none(), st.integers(1, 16)), st.sampled_from(["foreach", "fused", "for-loop"]),
    st.one_of(st.none(), LORA_TARGETS), st.integers(1, 64))


@settings(max_examples=40, deadline=None)
@given(TORCHTUNE_SCENARIOS)
def test_torchtune_config_states_what_the_estimate_assumed(sc):
    cfg = yaml.safe_load(torchtune_yaml(sc))
    t = sc.training
    assert cfg["batch_size"] == t.micro_batch_size
    assert cfg["gradient_accumulation_steps"] == t.gradient_accumulation_steps
    assert cfg["tokenizer"]["max_seq_len"] == t.seq_len
    assert cfg["dtype"] == {"bf16": "bf16", "fp32": "fp32"}[t.precision.value]
    assert cfg["enable_activation_checkpointing"] is (t.activation_checkpointing.value == "full")
    opt = cfg["optimizer"]
    assert opt["_component_"] == "torch.optim.AdamW"
    assert opt.get("fused", False) is (t.optimizer_impl.value == "fused")
    assert opt.get("foreach", False) is (t.optimizer_impl.value == "foreach")
    loss = cfg["loss"]
    if t.cross_entropy == "chunked":
        assert loss["num_output_chunks"] == (t.cross_entropy_chunks or 8)
    else:
        assert loss == {"_component_": "torch.nn.CrossEntropyLoss"}
    model = cfg["model"]
    assert (".lora_" in model["_component_"]) is (t.lora is not None)
    if t.lora is None:
        assert cfg["optimizer_in_bwd"] is t.optimizer_in_backward
    else:
        assert model["lora_rank"] == t.lora.rank and model["lora_alpha"] == t.lora.alpha
        assert model["lora_dropout"] == t.lora.dropout
        _check_torchtune_lora_targets(model, t.lora.targets)


def _check_torchtune_lora_targets(model, targets):
    if targets in ("attention", "all-linear"):
        assert model["lora_attn_modules"] == ["q_proj", "k_proj", "v_proj", "output_proj"]
        assert model["apply_lora_to_mlp"] is (targets == "all-linear")
        assert model["apply_lora_to_output"] is False
        return
    hf = {"output_proj": "o_proj"}
    assert {hf.get(m, m) for m in model["lora_attn_modules"]} == set(targets) & {"q_proj", "k_proj", "v_proj",
                                                                                  "o_proj"}
    assert model["apply_lora_to_mlp"] is ("gate_proj" in targets)
    assert model["apply_lora_to_output"] is ("lm_head" in targets)


def test_torchtune_model_is_the_presets_builder_or_the_component_builder_with_its_dims():
    assert torchtune_config(tt("llama-3.2-1b"))["model"] == {"_component_": PRESET_BUILDERS["llama-3.2-1b"]}
    model = torchtune_config(tt(TINY_QWEN))["model"]
    path, args = torchtune_builder_args(tt(TINY_QWEN))
    assert model == {"_component_": path, **args}
    assert args["embed_dim"] == TINY_QWEN["hidden_size"] and args["tie_word_embeddings"] is True
    assert recipe_name(tt(lora={"rank": 4})) == "lora_finetune_single_device"
    assert "tune run lora_finetune_single_device --config torchtune.yaml" in export_bundle(
        tt(lora={"rank": 4}))[0]["launch.sh"]


@pytest.mark.parametrize(("training", "words"), [
    ({"activation_checkpointing": "full", "checkpoint_every": 2}, "checkpoint_every"),
    ({"lora": {"targets": ("q_proj", "gate_proj")}}, "cannot adapt"),
    ({"lora": {"modules_to_save": ("lm_head",)}}, "modules_to_save"),
    ({"optimizer": "adafactor"}, "adafactor"),
])
def test_torchtune_refuses_what_its_recipe_cannot_say(training, words):
    with pytest.raises(ValueError, match=words):
        torchtune_config(tt(**training))


def test_bundle_and_cli_write_the_framework_files(tmp_path):
    from calc.cli.main import main

    for sc, names in ((tt(), {TORCHTUNE_FILE, "launch.sh", "requirements.txt"}), (lit(), {"launch.sh", "requirements.txt"})):
        path = tmp_path / f"{sc.training.framework}.json"
        path.write_text(sc.model_dump_json())
        out = tmp_path / sc.training.framework
        assert main(["export", str(path), "-o", str(out)]) == 0
        assert {p.name for p in out.iterdir()} == names
        files, notes = export_bundle(sc)
        for name, text in files.items():
            assert (out / name).read_text() == text


LITGPT_SCENARIOS = st.builds(
    lambda micro, seq, precision, impl, lora, rank, dropout: lit(
        micro_batch_size=micro, seq_len=seq, precision="bf16" if lora else precision, optimizer_impl=impl,
        **({"lora": {"rank": rank, "alpha": 2 * rank, "targets": lora, "dropout": dropout}} if lora else {})),
    st.integers(1, 8), st.integers(16, 256), st.sampled_from(["bf16", "amp-bf16"]),
    # LitGPT's path models adapters on q, k and v together, without dropout (calc.contract.scenario)
    st.sampled_from(["foreach", "fused", "for-loop"]), st.one_of(st.none(), st.sampled_from(["attention", "all-linear"])),
    st.integers(1, 64), st.just(0.0))


def _litgpt_words(sc: Scenario) -> dict[str, str]:
    argv = litgpt_argv(sc)
    return dict(zip(argv[3::2], argv[4::2], strict=True))


@settings(max_examples=30, deadline=None)
@given(LITGPT_SCENARIOS)
def test_litgpt_command_states_what_the_estimate_assumed(sc):
    words = _litgpt_words(sc)
    t = sc.training
    assert words["--precision"] == FABRIC_PRECISION[t.precision]
    assert words["--train.micro_batch_size"] == words["--train.global_batch_size"] == str(t.micro_batch_size)
    assert words["--train.max_seq_length"] == str(t.seq_len)
    assert litgpt_argv(sc)[1] == ("finetune_full" if t.lora is None else "finetune_lora")
    if t.lora is not None:
        assert words["--lora_r"] == str(t.lora.rank) and words["--lora_alpha"] == str(int(t.lora.alpha))
        assert words["--lora_mlp"] == str(t.lora.targets == "all-linear" or "gate_proj" in t.lora.targets).lower()
    script = litgpt_launch_script(sc)
    assert shlex.split(script.split('cd "$(dirname "$0")"\n')[1].replace("\\\n", " "))[:-1] == litgpt_argv(sc)


@pytest.mark.parametrize(("base", "double_quant", "flag"), [("nf4", False, "bnb.nf4"), ("nf4", True, "bnb.nf4-dq"),
                                                          ("fp4", False, "bnb.fp4"), ("fp4", True, "bnb.fp4-dq")])
def test_litgpt_qlora_command_quantizes_as_the_estimate_assumed(base, double_quant, flag):
    sc = lit(precision="bf16", optimizer="paged-adamw",
             lora={"rank": 8, "alpha": 16, "base_weights": base, "double_quant": double_quant})
    words = _litgpt_words(sc)
    assert words["--quantize"] == flag and words["--precision"] == "bf16-true"
    assert json.loads(words["--optimizer"])["class_path"] == "bitsandbytes.optim.PagedAdamW"


def test_litgpt_refuses_a_loss_chunk_its_command_line_cannot_set():
    with pytest.raises(ValueError, match="128-token chunks"):
        litgpt_argv(lit(cross_entropy_chunks=64))


# ---- the frameworks' own parsers ----------------------------------------------------------------------------------

def _recipe_keys(recipe: str) -> set[str]:
    """The top-level keys the installed recipe reads as `cfg.<key>` (cfg.get(...) ones are optional)."""
    spec = importlib.util.find_spec("recipes")
    assert spec is not None and spec.submodule_search_locations
    source = (Path(next(iter(spec.submodule_search_locations))) / f"{recipe}.py").read_text()
    return set(re.findall(r"\bcfg\.([a-z_]+)\b", source)) - {"get"}


TORCHTUNE_CHECKED = [tt(TINY_LLAMA), tt(TINY_QWEN, cross_entropy="standard", activation_checkpointing="full"),
                     tt(TINY_LLAMA, lora={"rank": 8, "alpha": 16, "targets": "all-linear", "dropout": 0.1}),
                     tt({**TINY_LLAMA, "model_type": "mistral"}, lora={"rank": 4, "targets": ("q_proj", "lm_head")}),
                     tt("llama-3.2-1b", optimizer_impl="fused"), tt("qwen2.5-0.5b", lora={"rank": 8}),
                     tt(TINY_LLAMA, optimizer="paged-adamw-8bit"), tt(TINY_QWEN, optimizer="sgd-momentum",
                                                                    optimizer_impl="for-loop"),
                     tt(TINY_LLAMA, optimizer_in_backward=True),
                     tt(NF4_LLAMA, lora={"rank": 8, "targets": "all-linear", "base_weights": "nf4"},
                        activation_checkpointing="full")]


@pytest.mark.slow
@pytest.mark.parametrize("sc", TORCHTUNE_CHECKED, ids=lambda s: f"{s.spec.family}-{recipe_name(s)}")
def test_torchtune_parses_and_builds_the_config(sc):
    import torch
    from omegaconf import OmegaConf
    from torchtune import config

    from calc.memory.engine import estimate

    cfg = OmegaConf.create(torchtune_yaml(sc))
    OmegaConf.resolve(cfg)  # the ${output_dir} interpolations
    missing = _recipe_keys(recipe_name(sc)) - set(cfg.keys())
    assert not missing, f"keys {recipe_name(sc)} reads but the config lacks: {missing}"
    with torch.device("meta"):
        model = config.instantiate(cfg.model)
    from torchtune.modules.peft import get_adapter_params

    summary = estimate(sc).model
    adapters = sum(p.numel() for p in get_adapter_params(model).values())  # what lora_finetune_* trains
    assert sum(p.numel() for p in model.parameters()) - adapters == summary.total_params
    if sc.training.lora is not None:
        assert adapters == summary.trainable_params
    loss = config.instantiate(cfg.loss)
    assert getattr(loss, "num_output_chunks", None) == cfg.loss.get("num_output_chunks")
    optimizer = config.instantiate(cfg.optimizer, [torch.nn.Parameter(torch.zeros(2))])
    assert optimizer.defaults["lr"] == ExportOptions().learning_rate
    for key, value in cfg.optimizer.items():  # fused / foreach / momentum reach the optimizer as written
        assert key == "_component_" or optimizer.defaults[key] == value


@pytest.mark.slow
@pytest.mark.parametrize("preset", sorted(PRESET_BUILDERS))
def test_each_preset_builder_has_the_presets_dims(preset):
    import importlib

    import torch

    def shapes(path, args):
        module, name = path.rsplit(".", 1)
        with torch.device("meta"):
            built = getattr(importlib.import_module(module), name)(**args)
        return {k: tuple(v.shape) for k, v in built.state_dict().items()}

    assert shapes(PRESET_BUILDERS[preset], {}) == shapes(*torchtune_builder_args(tt(preset)))


LITGPT_CHECKED = [lit(), lit(precision="bf16", optimizer_impl="fused"),
                  lit(precision="bf16", lora={"rank": 8, "alpha": 16, "targets": "all-linear"}),
                  lit("llama-3.1-8b", precision="bf16", lora={"rank": 4, "targets": "attention"}),
                  lit(optimizer="paged-adamw", optimizer_impl="fused"),
                  lit(precision="bf16", optimizer="paged-adamw",
                      lora={"rank": 8, "alpha": 16, "targets": ["q_proj", "v_proj"], "base_weights": "nf4",
                            "double_quant": True})]


@pytest.mark.slow
def test_litgpt_parses_the_command_line():
    import torch
    from jsonargparse import CLI, capture_parser
    from litgpt.__main__ import PARSER_DATA
    from litgpt.utils import instantiate_torch_optimizer

    for sc in LITGPT_CHECKED:
        argv = litgpt_argv(sc)
        parser = capture_parser(lambda argv=argv: CLI(PARSER_DATA, args=argv[1:]))
        parsed = parser.parse_args(argv[1:])
        run = parsed[argv[1]]
        t = sc.training
        assert run.precision == FABRIC_PRECISION[t.precision]
        assert run.train.micro_batch_size == t.micro_batch_size and run.train.max_seq_length == t.seq_len
        optimizer = instantiate_torch_optimizer(run.optimizer, [torch.nn.Parameter(torch.zeros(2))])
        assert type(optimizer).__name__ == run.optimizer["class_path"].rsplit(".", 1)[1]
        for key, value in run.optimizer["init_args"].items():  # the kernels and lr reach the optimizer
            assert optimizer.defaults[key] == value
        if t.lora is not None:
            assert (run.lora_r, run.lora_alpha, run.lora_dropout) == (t.lora.rank, t.lora.alpha, t.lora.dropout)
        assert getattr(run, "quantize", None) == (None if t.lora is None or not t.lora.quantized else "bnb.nf4-dq")
        with pytest.raises(SystemExit):  # the same parser refuses what setup() does not take
            parser.parse_args([*argv[1:], "--lora_nonsense", "1"])


@pytest.mark.slow
@pytest.mark.parametrize("sc", [tt(TINY_LLAMA), tt(TINY_QWEN, lora={"rank": 4, "targets": "all-linear"}),
                                tt(NF4_QWEN, lora={"rank": 4, "targets": ("q_proj", "v_proj"), "base_weights": "nf4"})],
                         ids=["llama-full", "qwen2-tied-lora", "qwen2-tied-qlora"])
def test_torchtune_loads_a_hugging_face_checkpoint_through_the_exported_blocks(sc, tmp_path):
    """The exported checkpointer (FullModelHFCheckpointer with the family's model_type) reads a tiny random
    Hugging Face checkpoint written here, and the exported model block takes every weight: all the model's
    keys but the LoRA adapters (which lora_finetune_single_device initialises) come from the checkpoint."""
    import json as json_
    import subprocess
    import sys

    import torch
    import transformers

    from calc.export.torchtune import CHECKPOINT_DIR

    torch.manual_seed(0)
    hf_class = {"llama": transformers.LlamaForCausalLM, "qwen2": transformers.Qwen2ForCausalLM}[sc.spec.family]
    config = transformers.AutoConfig.for_model(**sc.model)
    hf_class(config).save_pretrained(tmp_path / "hf", safe_serialization=True)
    text = torchtune_yaml(sc).replace(CHECKPOINT_DIR, str(tmp_path / "hf"))
    text = text.replace(torchtune_config(sc)["output_dir"], str(tmp_path / "out"))
    (tmp_path / TORCHTUNE_FILE).write_text(text)
    run = subprocess.run([sys.executable, "-m", "tests.calc.export.torchtune_check", str(tmp_path / TORCHTUNE_FILE)],
                         capture_output=True, text=True, timeout=120, check=False)
    assert run.returncode == 0, run.stderr[-2000:]
    result = json_.loads(run.stdout.strip().splitlines()[-1])
    assert result["unexpected"] == []
    assert all(".lora_" in key for key in result["missing"])
    assert bool(result["missing"]) is (sc.training.lora is not None)
