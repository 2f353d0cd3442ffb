"""Widgets that return validated Scenarios, and the frame every page shares.

`page_setup()` starts a page (config, state from the URL, navigation); `scenario_sidebar()` draws
the scenario editor in the sidebar and returns the validated Scenario, or None with the problem
shown next to the widget that caused it. Widget values are seeded from the session's scenario
(ui.state), so the scenario survives moving between pages.
"""

from __future__ import annotations

import json
from typing import Any

import streamlit as st
from pydantic import ValidationError

from calc.contract.boundary import decode, parse_json
from calc.contract.errors import UserError
from calc.contract.hf_rules import longest_sequence
from calc.contract.i18n import N_, T_
from calc.contract.presets import resolve_model
from calc.contract.scenario import (
    FRAMEWORK_DEFAULTS,
    FRAMEWORKS,
    Checkpointing,
    Mode,
    Precision,
    Scenario,
    TrainingConfig,
    default_seq_len,
    unmodelled_values,
)
from calc.contract.units import GiB, MiB
from ui import compute, fmt, layout, state
from ui.choices import radio, select
from ui.labels import (  # noqa: F401 - pages import some of them from here
    ATTENTION_LABELS,
    CKPT_LABELS,
    COMPARE_KIND_LABELS,
    CROSS_ENTROPY_LABELS,
    EXPERT_PARALLEL_LABEL,
    FRAMEWORK_LABELS,
    HW_KIND_LABELS,
    IMPL_LABELS,
    INFERENCE_WEIGHT_LABELS,
    KEEP_OUTPUTS_LABEL,
    KV_CACHE_LABELS,
    LORA_BASE_LABELS,
    LORA_LIST_LABEL,
    LORA_TARGET_LABELS,
    MODE_LABELS,
    MODEL_SOURCE_LABELS,
    OFFLOAD_LABELS,
    OPTIMIZER_LABELS,
    PRECISION_LABELS,
    SHARDING_LABELS,
    ZERO0_RUNNER_LABELS,
    ZERO_LABELS,
)
from ui.language import _, begin_run, current, language_switch, tr

PAGES: tuple[tuple[str, str, str], ...] = (
    ("app.py", N_("Calculator"), ":material/calculate:"),
    ("pages/2_Compare.py", N_("Compare"), ":material/compare_arrows:"),
    ("pages/3_Recommend.py", N_("Recommend"), ":material/recommend:"),
    ("pages/4_Explain.py", N_("Explain"), ":material/menu_book:"),
    ("pages/5_Export.py", N_("Export"), ":material/download:"),
    ("pages/6_Validation.py", N_("Validation"), ":material/fact_check:"),
    ("pages/7_Serve.py", N_("Serve"), ":material/dns:"),
)

MAX_CONFIG_BYTES = 1 * MiB  # a Hugging Face config.json is a few KiB


# Sidebar sections; a validation message goes to the first section whose keywords it mentions.
SECTIONS: dict[str, tuple[str, ...]] = {
    "framework": ("framework",),
    "inference": ("inference.", "new_tokens", "kv_cache"),
    "model": ("model preset", "config", "model_type", "family", "vocab", "hidden_size", "attention heads"),
    "hardware": ("gpu preset", "cluster preset", "memory_bytes", "cpu_ram"),
    "lora": ("lora", "quantized", "base weights", "int8/nf4"),
    "parallel": ("tensor_parallel", "pipeline_parallel", "sequence_parallel", "expert_parallel", "num_gpus"),
    "savers": ("offload", "zero_stage", "checkpoint"),
    "precision": ("optimizer", "precision", "adamw-8bit"),
    "batch": ("micro_batch", "seq_len", "gradient_accumulation", "global_batch"),
}


def section_for(message: str) -> str:
    low = message.lower()
    for name, words in SECTIONS.items():
        if any(w in low for w in words):
            return name
    return "model"


# ---- page frame ---------------------------------------------------------------------------


def page_setup(title: str, icon: str = ":material/memory:") -> None:
    """Page config, session state from the URL on first load, the language and the navigation links.
    `title` is an English page name marked with N_ (one of PAGES' labels)."""
    begin_run()
    st.set_page_config(page_title=f"{tr(title)} · vramcalc", page_icon=icon, layout="wide")
    layout.apply()
    state.init_state()
    state.enter_page(title)
    nav_links()
    err = st.session_state[state.URL_ERROR_SHOWN] = st.session_state.pop(state.URL_ERROR, None)
    if err:
        st.warning(fmt.literal(err), icon=":material/link_off:")


def nav_links() -> None:
    params = state.page_params()
    with st.sidebar:
        st.markdown(_("**vramcalc** · GPU memory calculator"))
        language_switch()
        for path, label, icon in PAGES:
            st.page_link(path, label=tr(label), icon=icon, query_params=params)
        st.divider()


# ---- scenario editor ----------------------------------------------------------------------


def _seed(values: dict[str, Any]) -> None:
    ss = st.session_state
    if ss.get(state.SYNC):
        for k in list(ss.keys()):
            if isinstance(k, str) and k.startswith("sc_"):
                del ss[k]
        ss[state.SYNC] = False
    for k, v in values.items():
        state.seed_widget(k, v)


def _widget_values(sc: Scenario) -> dict[str, Any]:
    """Widget key -> value that shows `sc`."""
    t, hw = sc.training, sc.hardware
    lora = t.lora
    if hw.cluster:
        kind = "cluster"
    elif hw.gpu is None and hw.memory_bytes:
        kind = "custom"
    else:
        kind = "gpu"
    return {
        "sc_model_source": "config" if isinstance(sc.model, dict) else "preset",
        "sc_model": sc.model if isinstance(sc.model, str) else state.DEFAULT_SCENARIO.model,
        "sc_config_text": json.dumps(sc.model, indent=2) if isinstance(sc.model, dict) else "",
        "sc_hw_kind": kind,
        "sc_gpu": hw.gpu or "rtx-4090",
        "sc_num_gpus": 1 if hw.cluster else hw.num_gpus,  # the cluster's count is not a choice
        "sc_cluster": hw.cluster or "8x-a100-80gb",
        "sc_mem_gib": (hw.memory_bytes or 24 * GiB) / GiB,
        "sc_ram_gib": (hw.cpu_ram_bytes or 0) / GiB,
        "sc_nvme_gib": (hw.nvme_bytes or 0) / GiB,
        "sc_mode": sc.mode.value,
        "sc_mbs": t.micro_batch_size,
        "sc_seq": t.seq_len,
        "sc_ga": t.gradient_accumulation_steps,
        "sc_gbt": t.global_batch_tokens,
        "sc_precision": t.precision.value,
        "sc_optimizer": t.optimizer.value,
        "sc_impl": t.optimizer_impl.value,
        "sc_ckpt": t.activation_checkpointing.value,
        "sc_every": t.checkpoint_every,
        "sc_attention": t.attention.value,
        "sc_zero": t.zero_stage,
        # the box is drawn at ZeRO 2/3 only, where plain PyTorch ("torch", ZeRO-0 only) cannot be the value
        "sc_sharding": t.sharding if t.sharding in SHARDING_LABELS else "deepspeed",
        "sc_runner0": "torch" if t.sharding == "torch" else "deepspeed",
        "sc_off_opt": t.offload_optimizer.value,
        "sc_off_par": t.offload_params.value,
        "sc_tp": t.tensor_parallel,
        "sc_pp": t.pipeline_parallel,
        "sc_sp": t.sequence_parallel,
        "sc_ep": t.expert_parallel,
        "sc_keep": t.keep_outputs,
        "sc_ce": t.cross_entropy,
        "sc_ce_chunks": t.cross_entropy_chunks or 0,
        "sc_framework": t.framework,
        "sc_opt_bwd": t.optimizer_in_backward,
        "sc_act_off": t.activation_offload,
        "sc_lora": lora is not None,
        "sc_lora_rank": lora.rank if lora else 16,
        "sc_lora_targets": (lora.targets if isinstance(lora.targets, str) else LIST_TARGETS) if lora else "all-linear",
        "sc_lora_names": list(lora.targets) if lora and isinstance(lora.targets, tuple) else [],
        "sc_lora_dropout": lora.dropout if lora else 0.0,
        "sc_lora_save": list(lora.modules_to_save) if lora else [],
        "sc_lora_base": lora.base_weights if lora else "bf16",
        "sc_lora_dq": lora.double_quant if lora else False,
        "sc_gen": sc.inference.new_tokens,
        "sc_kv": sc.inference.kv_cache,
        "sc_wq": sc.inference.weights or "",
        "sc_wdq": sc.inference.double_quant,
    }


def parse_config_text(text: str | bytes, where: str = "config.json") -> dict[str, Any]:
    """config.json text (or an upload's bytes) -> dict through calc.contract.boundary (size, UTF-8, nesting
    depth, finite numbers), or ValueError with a one-line message for the user."""
    size = len(text) if isinstance(text, bytes) else len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_CONFIG_BYTES:
        raise UserError(T_("{where} is {size} MiB; the limit is {limit} MiB (a Hugging Face config.json is a "
                           "few KiB)", where=where, size=f"{size / MiB:,.1f}", limit=f"{MAX_CONFIG_BYTES / MiB:.0f}"))
    if not text.strip():
        raise UserError(T_("{where}: paste a Hugging Face config.json or upload one", where=where))
    data = parse_json(text, where, MAX_CONFIG_BYTES)
    if not isinstance(data, dict):
        raise UserError(T_("{where} must be a JSON object ({{...}}), not a {kind}", where=where,
                           kind=type(data).__name__))
    return data


def _model_section(errors: dict[str, Any]) -> str | dict[str, Any] | None:
    src = radio(_("Model source"), MODEL_SOURCE_LABELS, "sc_model_source")
    if src == "preset":
        opts = compute.model_options()
        return st.selectbox(_("Model"), list(opts), format_func=opts.__getitem__, key="sc_model",
                            help=_("Type to search. Parameter counts are exact (transformers' own count)."))
    up = st.file_uploader(_("Upload config.json"), type=["json"], key="sc_config_file", max_upload_size=compute.UPLOAD_LIMIT_MIB,
                          help=_("The model's config.json from the Hugging Face Hub (shapes only, no weights)."))
    _take_config_upload(up)
    text = st.text_area(_("…or paste config.json"), key="sc_config_text", height=160,
                        placeholder='{"model_type": "llama", "hidden_size": 4096, ...}')
    if "model" in errors:
        return None
    try:
        return parse_config_text(text)
    except ValueError as exc:
        errors["model"] = state.error_text(exc)
        return None


def _take_config_upload(up: Any) -> None:
    """Copy a new upload into the config.json box only if it parses; a bad upload is reported under
    the uploader (while it stays there) and leaves the box, and so the scenario, as it was."""
    ss = st.session_state
    if up is None:
        ss.pop(state.CONFIG_UPLOAD_ERROR, None)
        return
    if ss.get(state.CONFIG_FILE_ID) != up.file_id:
        ss[state.CONFIG_FILE_ID] = up.file_id
        ss.pop(state.CONFIG_UPLOAD_ERROR, None)
        try:
            resolve_model(parse_config_text(up.getvalue(), where=up.name))  # bytes, JSON, then the model itself
        except ValueError as exc:
            ss[state.CONFIG_UPLOAD_ERROR] = (up.file_id, _("{problem} (the box below is unchanged)",
                                                              problem=state.error_text(exc)))
        else:
            ss["sc_config_text"] = decode(up.getvalue(), up.name)
    bad = ss.get(state.CONFIG_UPLOAD_ERROR)
    if bad and bad[0] == up.file_id:
        st.error(fmt.literal(bad[1]), icon=":material/error:")


def _hardware_section() -> dict[str, Any]:
    kind = radio(_("Hardware"), HW_KIND_LABELS, "sc_hw_kind", label_visibility="collapsed")
    if kind == "cluster":
        opts = compute.cluster_options(current())
        return {"cluster": st.selectbox(_("Cluster"), list(opts), format_func=opts.__getitem__, key="sc_cluster")}
    if kind == "custom":
        mem = st.number_input(_("GPU memory (GiB)"), min_value=0.5, max_value=4096.0, step=1.0, format="%.2f",
                              key="sc_mem_gib",
                              help=_("Total device memory as nvidia-smi reports it, in GiB (2^30 bytes)."))
        n = st.number_input(_("Number of GPUs"), min_value=1, max_value=65536, step=1, key="sc_num_gpus")
        return {"memory_bytes": round(mem * GiB), "num_gpus": int(n)}
    opts = compute.gpu_options()
    gpu = st.selectbox("GPU", list(opts), format_func=opts.__getitem__, key="sc_gpu",
                       help=_("Memory shown is what nvidia-smi reports, in GiB."))
    n = st.number_input(_("Number of GPUs"), min_value=1, max_value=65536, step=1, key="sc_num_gpus")
    return {"gpu": gpu, "num_gpus": int(n)}


def _propose_inference_precision() -> None:
    """Switching to inference proposes 16-bit weights (Precision.for_inference): AMP's fp32 weights would
    make a 4B model 'not fit' a 24 GB card for no reason."""
    from calc.contract.presets import gpu_presets

    ss = st.session_state
    if ss.get("sc_mode") != Mode.inference.value:
        return
    gpu = gpu_presets().get(state.get_scenario().resolved_hardware().gpu or "")
    bf16 = gpu is None or (gpu.bf16 and gpu.bf16_tflops > 0)
    ss["sc_precision"] = Precision(ss["sc_precision"]).for_inference(bf16).value


def _is_moe(model: str | dict[str, Any] | None) -> bool:
    """Whether the chosen model is a mixture of experts (the expert-parallel control is shown only then)."""
    if model is None:
        return False
    try:
        return resolve_model(model).num_experts > 1
    except ValueError:
        return False


def scenario_sidebar() -> Scenario | None:
    """The scenario editor. Returns the validated Scenario (also stored as current), or None when
    the widgets describe an impossible scenario; the message is shown next to the widget."""
    current = state.get_scenario()
    _seed(_widget_values(current))
    errors: dict[str, str] = {}
    slots: dict[str, Any] = {}  # section -> the placeholder under it, for that section's error
    base = current.model_dump(mode="json")
    tc = dict(base["training"])

    with st.sidebar.expander(_("Model"), expanded=True, icon=":material/neurology:"):
        model = _model_section(errors)
        slots["model"] = st.empty()  # right under the model / config.json widgets
        mode = radio(_("Mode"), MODE_LABELS, "sc_mode", on_change=_propose_inference_precision)
    training = mode == Mode.train.value
    hardware = _hardware_expander(slots)
    if training:
        _framework_expander(tc, slots)
    _batch_expander(tc, training, slots, _sequence_for_model(current, model))
    _precision_expander(tc, training, slots)
    _savers_expander(tc, training, slots)
    _parallel_expander(tc, current, training, model, slots)
    _lora_expander(tc, base, current, model, slots)
    inference = _inference_expander(slots) if not training else base["inference"]
    return _validated(model, hardware, mode, tc, errors, slots, inference)


def _hardware_expander(slots: dict[str, Any]) -> dict[str, Any]:
    """The Hardware section: GPU or cluster, count, host RAM and NVMe per node (the hardware fields)."""
    with st.sidebar.expander(_("Hardware"), expanded=True, icon=":material/memory:"):
        hardware = _hardware_section()
        ram = st.number_input(_("Host RAM per node (GiB; 0 = the cluster preset's, or unknown)"), 0.0, 1e6,
                              step=64.0, format="%.0f", key="sc_ram_gib",
                              help=_("Checked against what CPU offload needs."))
        nvme = st.number_input(_("NVMe per node (GiB; 0 = the cluster preset's, or unknown)"), 0.0, 1e7,
                               step=512.0, format="%.0f", key="sc_nvme_gib",
                               help=_("Checked against what NVMe offload needs."))
        hardware["cpu_ram_bytes"] = round(ram * GiB) or None
        hardware["nvme_bytes"] = round(nvme * GiB) or None
        slots["hardware"] = st.empty()
    return hardware


# the widgets that show the fields a framework's recipes set (FRAMEWORK_DEFAULTS)
FRAMEWORK_WIDGET_KEYS = ("sc_precision", "sc_optimizer", "sc_impl", "sc_ckpt", "sc_every", "sc_ce", "sc_ce_chunks",
                         "sc_zero", "sc_sharding", "sc_runner0", "sc_opt_bwd")


def offered_frameworks() -> list[str]:
    """The frameworks whose model code and loop the calculator models (the others are refused by the scenario)."""
    refused = unmodelled_values().get("framework", ())
    return [f for f in FRAMEWORKS if f not in refused]


def framework_defaults_text(framework: str) -> str:
    """What choosing `framework` sets, in the scenario's own field names and values (FRAMEWORK_DEFAULTS)."""
    pairs = ", ".join(f"{k} = {v}" for k, v in FRAMEWORK_DEFAULTS[framework].items())
    if not pairs:
        return _("Its recipe defaults are the calculator's own.")
    return _("Choosing it sets its recipes' defaults: {pairs}. Change any of them below.").format(pairs=pairs)


def _apply_framework_defaults() -> None:
    """A newly chosen framework brings its recipes' defaults (FRAMEWORK_DEFAULTS) into the widgets; the fields another
    framework set go back to the scenario's defaults. Other choices (model, batch, LoRA) are kept."""
    ss = st.session_state
    framework = ss.get("sc_framework", "transformers")
    current = state.get_scenario()
    recipe_fields = {k for defaults in FRAMEWORK_DEFAULTS.values() for k in defaults}
    data = {k: v for k, v in current.training.model_dump(mode="json").items() if k not in recipe_fields}
    data["framework"] = framework
    for k in recipe_fields - set(FRAMEWORK_DEFAULTS[framework]):
        default = TrainingConfig.model_fields[k].default
        data[k] = getattr(default, "value", default)
    try:
        training = TrainingConfig.model_validate(data)
    except (ValidationError, ValueError):
        return  # the sidebar shows why under the section when the page runs
    try:  # the whole scenario, fields without a widget (sharding) included; the widgets are seeded from it
        state.set_scenario(current.variant(training=training))
        return
    except (ValidationError, ValueError):
        pass  # this model or hardware does not suit the framework: show its defaults, and the reason, anyway
    shown = _widget_values(Scenario.model_construct(model=current.model, hardware=current.hardware,
                                                    mode=current.mode, training=training,
                                                    inference=current.inference))
    for key in FRAMEWORK_WIDGET_KEYS:
        ss[key] = shown[key]


def _framework_expander(tc: dict[str, Any], slots: dict[str, Any]) -> None:
    """The Training framework section: whose model code and loop the tensors come from, first of the training
    setup, since it brings its recipes' defaults."""
    with st.sidebar.expander(_("Training framework"), expanded=True, icon=":material/deployed_code:"):
        labels = {f: FRAMEWORK_LABELS[f] for f in offered_frameworks()}
        tc["framework"] = select(_("Framework"), labels, "sc_framework", on_change=_apply_framework_defaults,
                                  help=_("Whose model code and training loop run: the memory of the same model "
                                         "differs between frameworks (their attention, loss and defaults)."))
        st.caption(framework_defaults_text(tc["framework"]))
        slots["framework"] = st.empty()


def _sequence_for_model(current: Scenario, model: str | dict[str, Any] | None) -> int | None:
    """The chosen model's longest sequence (GPT-2's position table; None: no bound, or the model is not valid).
    A sequence length that was the previous model's default becomes the new model's default (2048, or its
    table's length): the default follows the model, a length the user chose stays."""
    if model is None:
        return None
    try:
        spec = resolve_model(model)
    except ValueError:
        return None
    ss = st.session_state
    if model != current.model and int(ss.get("sc_seq", 0)) == default_seq_len(current.spec):
        ss["sc_seq"] = default_seq_len(spec)
    return longest_sequence(spec)


def _batch_expander(tc: dict[str, Any], training: bool, slots: dict[str, Any], seq_limit: int | None) -> None:
    """The Batch and sequence section, into the training fields `tc`. A model with a learned position table takes
    sequences up to its length (a longer one left from another model is brought down to it); at the limit the section
    says why it stops there."""
    ss = st.session_state
    at_limit = seq_limit is not None and int(ss.get("sc_seq", 0)) >= seq_limit
    if at_limit:
        ss["sc_seq"] = seq_limit
    with st.sidebar.expander(_("Batch and sequence"), expanded=True, icon=":material/view_week:"):
        tc["micro_batch_size"] = int(st.number_input(_("Micro-batch size (sequences per GPU)"), 1, 65536, step=1,
                                                     key="sc_mbs"))
        tc["seq_len"] = int(st.number_input(_("Sequence length (tokens)"), 1, seq_limit or 4_194_304, step=256,
                                            key="sc_seq"))
        if at_limit:
            st.caption(_("This model reads at most {limit} tokens per sequence (its learned position table).",
                         limit=f"{seq_limit:,}"))
        if training:
            tc["gradient_accumulation_steps"] = int(st.number_input(_("Gradient accumulation steps"), 1, 65536,
                                                                    step=1, key="sc_ga"))
            tc["global_batch_tokens"] = int(st.number_input(
                _("Global batch (tokens per optimizer step)"), 1, 2**40, step=2**16, key="sc_gbt",
                help=_("The batch Recommend reaches (micro-batch x accumulation x GPUs) and every speed is quoted at. "
                       "262,144 (128 x 2,048) is a common fine-tuning batch; pre-training uses 1-4 million.")))
            tc["keep_outputs"] = bool(st.checkbox(
                tr(KEEP_OUTPUTS_LABEL), key="sc_keep",
                help=_("Off: HF Trainer's `loss = model(...).loss` frees the logits before backward. On: "
                       "`outputs = model(**batch); loss = outputs.loss` (accelerate and most hand-written "
                       "loops) keeps the logits and the KV cache alive through backward, the optimizer step "
                       "and the next forward.")))
        slots["batch"] = st.empty()


def _precision_expander(tc: dict[str, Any], training: bool, slots: dict[str, Any]) -> None:
    """The Precision and optimizer section, into `tc`."""
    with st.sidebar.expander(_("Precision and optimizer"), expanded=True, icon=":material/tune:"):
        tc["precision"] = select(_("Precision"), PRECISION_LABELS, "sc_precision", help=_(
            "AMP: fp32 weights, gradients and states, 16-bit autocast compute (fp16 with a GradScaler). Mixed: "
            "16-bit weights and gradients plus fp32 master weights and states (DeepSpeed; fp16 with loss scaling). "
            "Pure bf16: everything bf16, optimizer states too."))
        if training:
            tc["optimizer"] = select(_("Optimizer"), OPTIMIZER_LABELS, "sc_optimizer", help=_(
                "Paged optimizers (bitsandbytes) keep their states in CUDA managed memory."))
            tc["optimizer_impl"] = select(_("Optimizer implementation"), IMPL_LABELS, "sc_impl")
            tc["optimizer_in_backward"] = bool(st.checkbox(
                _("Step the optimizer inside backward"), key="sc_opt_bwd",
                help=_("torchtune's optimizer_in_bwd: each parameter is updated as soon as its gradient is ready "
                       "and the gradient is freed at once, so the gradients never all exist together. One GPU, "
                       "no gradient accumulation.")))
        slots["precision"] = st.empty()


def _savers_expander(tc: dict[str, Any], training: bool, slots: dict[str, Any]) -> None:
    """The Memory savers section (attention, checkpointing, loss kernel, ZeRO, sharding, offload), into `tc`."""
    with st.sidebar.expander(_("Memory savers"), expanded=True, icon=":material/compress:"):
        tc["attention"] = select(_("Attention"), ATTENTION_LABELS, "sc_attention")
        if training:
            tc["activation_checkpointing"] = select(_("Activation checkpointing"), CKPT_LABELS, "sc_ckpt")
            if tc["activation_checkpointing"] == Checkpointing.full.value:
                tc["checkpoint_every"] = int(st.number_input(_("Checkpoint 1 of every k layers"), 1, 1024, step=1,
                                                             key="sc_every"))
                tc["activation_offload"] = bool(st.checkbox(
                    _("Offload activations to host memory"), key="sc_act_off",
                    help=_("torchtune's enable_activation_offloading (OffloadActivations): each checkpointed "
                           "layer's stored input is copied to pinned host memory in forward and back in "
                           "backward; the last 5 copies stay on the GPU while they are made. The host copies "
                           "count in host RAM. Needs full checkpointing on every layer and one GPU. Measured "
                           "on the CPU through an emulation (there the GPU and the host are one memory); the "
                           "CUDA streams' timing is modelled from torchtune's source.")))
            tc["cross_entropy"] = select(
                _("Loss kernel"), CROSS_ENTROPY_LABELS, "sc_ce",
                help=_("Liger Kernel's fused linear cross-entropy (use_liger_kernel=True in HF Trainer / TRL, "
                       "LLaMA-Factory, Axolotl) computes lm_head and the loss in token chunks, so the B x S x V "
                       "logits never exist whole. Modelled from Liger's source, not yet measured on a GPU. "
                       "Chunked: the framework's own chunked loss (torchtune's CEWithChunkedOutputLoss, LitGPT's "
                       "chunked_cross_entropy)."))
            tc["cross_entropy_chunks"] = None
            if tc["cross_entropy"] == "chunked":
                label = (_("Output chunks (0 = torchtune's 8)") if tc.get("framework") == "torchtune"
                         else _("Loss chunk size (tokens per chunk; 0 = LitGPT's 128)"))
                chunks = int(st.number_input(label, 0, 65536, step=1, key="sc_ce_chunks"))
                tc["cross_entropy_chunks"] = chunks or None
        tc["zero_stage"] = select(_("ZeRO stage"), ZERO_LABELS, "sc_zero")
        if tc["zero_stage"] in (2, 3):
            tc["sharding"] = select(_("Sharded by"), SHARDING_LABELS, "sc_sharding",
                                     help=_("DeepSpeed ZeRO, or PyTorch FSDP2 (fully_shard per layer: stage 3 = "
                                            "FULL_SHARD, stage 2 = reshard_after_forward=False)."))
        elif tc["zero_stage"] == 0 and training and Precision(tc["precision"]).is_mixed:
            tc["sharding"] = select(_("Runs under"), ZERO0_RUNNER_LABELS, "sc_runner0",
                                     help=_("At ZeRO 0 DeepSpeed's mixed-precision optimizer keeps the 16-bit "
                                            "gradients beside their fp32 copies through the step (2 B/param more "
                                            "than a plain PyTorch loop that frees them)."))
        tc["offload_optimizer"] = select(_("Offload optimizer states"), OFFLOAD_LABELS, "sc_off_opt")
        tc["offload_params"] = select(_("Offload parameters"), OFFLOAD_LABELS, "sc_off_par",
                                       help=_("Needs ZeRO stage 3."))
        slots["savers"] = st.empty()


def _parallel_expander(tc: dict[str, Any], current: Scenario, training: bool, model: Any,
                       slots: dict[str, Any]) -> None:
    """The Parallelism section (tensor, pipeline, sequence, expert), into `tc`; open when any is in use."""
    t0 = current.training
    par_open = t0.tensor_parallel > 1 or t0.pipeline_parallel > 1 or t0.expert_parallel > 1
    with st.sidebar.expander(_("Parallelism"), expanded=par_open, icon=":material/lan:"):
        tc["tensor_parallel"] = int(st.number_input(_("Tensor parallel"), 1, 1024, step=1, key="sc_tp"))
        tc["pipeline_parallel"] = int(st.number_input(_("Pipeline parallel"), 1, 1024, step=1, key="sc_pp"))
        tc["sequence_parallel"] = bool(st.checkbox(_("Sequence parallel (Megatron, with TP)"), key="sc_sp"))
        tc["expert_parallel"] = 1
        if training and _is_moe(model):
            tc["expert_parallel"] = int(st.number_input(
                tr(EXPERT_PARALLEL_LABEL), 1, 1024, step=1, key="sc_ep",
                help=_("Each GPU keeps only its share of the experts and exchanges tokens with the others "
                       "(transformers' expert parallelism, with FSDP2 sharding the rest: ZeRO stage 2 or 3).")))
        st.caption(_("Data parallel = GPUs / (tensor x pipeline)."))
        slots["parallel"] = st.empty()


LIST_TARGETS = "list"  # the Targets choice that opens the module multiselect


def _model_modules(model: Any) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The chosen model's linear module names (LoRA targets) and the modules peft can train in full beside the
    adapters (its lm_head and token embedding), in the model's own naming; empty for a model that does not resolve."""
    try:
        spec = resolve_model(model)
    except (ValueError, TypeError):
        return (), ()
    return spec.linear_module_names(), (spec.module_name("lm_head"), spec.module_name("embed_tokens"))


def _lora_expander(tc: dict[str, Any], base: dict[str, Any], current: Scenario, model: Any,
                   slots: dict[str, Any]) -> None:
    """The LoRA / QLoRA section, into `tc` (None when adapters are off)."""
    with st.sidebar.expander("LoRA / QLoRA", expanded=current.training.lora is not None, icon=":material/layers:"):
        if st.checkbox(_("Train LoRA adapters (frozen base model)"), key="sc_lora"):
            lora = dict(base["training"]["lora"] or {})
            lora["rank"] = int(st.number_input(_("Rank r"), 1, 4096, step=1, key="sc_lora_rank"))
            linears, savable = _model_modules(model)
            targets = select(_("Targets"), {**LORA_TARGET_LABELS, LIST_TARGETS: LORA_LIST_LABEL}, "sc_lora_targets")
            if targets == LIST_TARGETS:
                _keep_known("sc_lora_names", linears)
                names = st.multiselect(_("Modules with adapters"), linears, key="sc_lora_names",
                                       help=_("peft's target_modules, in this model's own names. PEFT's and "
                                              "torchtune's usual choice is q_proj and v_proj."))
                targets = names  # an empty list is refused by the scenario, with its reason
            lora["targets"] = targets
            lora["dropout"] = float(st.number_input(_("LoRA dropout"), 0.0, 0.99, step=0.05, key="sc_lora_dropout",
                                                    help=_("peft's lora_dropout: above 0 each adapted layer keeps "
                                                           "its dropped input and mask for backward.")))
            _keep_known("sc_lora_save", savable)
            lora["modules_to_save"] = st.multiselect(
                _("Also train in full (modules_to_save)"), savable, key="sc_lora_save",
                help=_("peft keeps the frozen original and trains a full copy: its weights, gradients and optimizer "
                       "states count."))
            lora["base_weights"] = select(_("Base weight precision"), LORA_BASE_LABELS, "sc_lora_base")
            lora["double_quant"] = False
            if lora["base_weights"] in ("nf4", "fp4"):
                lora["double_quant"] = bool(st.checkbox(_("Double quantization (bnb_4bit_use_double_quant)"),
                                                        key="sc_lora_dq"))
            tc["lora"] = lora
        else:
            tc["lora"] = None
        slots["lora"] = st.empty()


def _keep_known(key: str, options: tuple[str, ...]) -> None:
    """A multiselect's kept value must be among its options: a different model drops the names it lacks."""
    ss = st.session_state
    if key in ss:
        ss[key] = [v for v in ss[key] if v in options]


def _inference_expander(slots: dict[str, Any]) -> dict[str, Any]:
    """The Generation section (mode inference): new tokens, the KV cache, how the weights are stored."""
    with st.sidebar.expander(_("Generation"), expanded=True, icon=":material/chat:"):
        new_tokens = int(st.number_input(_("New tokens to generate (0 = one prefill forward)"), 0, 4_194_304,
                                         step=64, key="sc_gen"))
        kv_cache = radio(_("KV cache"), KV_CACHE_LABELS, "sc_kv")
        weights = select(_("Stored weights"), INFERENCE_WEIGHT_LABELS, "sc_wq",
                          help=_("Quantized weights (bitsandbytes, GPTQ, AWQ, FP8) are modelled from the libraries' "
                                 "source: their kernels need CUDA."))
        double = bool(st.checkbox(_("Double quantization (bnb_4bit_use_double_quant)"), key="sc_wdq")) \
            if weights in ("nf4", "fp4") else False
        slots["inference"] = st.empty()
    return {"new_tokens": new_tokens, "kv_cache": kv_cache, "weights": weights or None, "double_quant": double}


def _validated(model: Any, hardware: dict[str, Any], mode: str, tc: dict[str, Any], errors: dict[str, str],
               slots: dict[str, Any], inference: dict[str, Any]) -> Scenario | None:
    """The widgets' values as a Scenario (stored as current), or None with each problem shown under its section."""
    sc: Scenario | None = None
    if not errors:
        hw = {k: v for k, v in hardware.items() if v is not None}
        data = {"model": model, "hardware": hw, "mode": mode, "training": tc, "inference": inference}
        try:
            sc = Scenario.model_validate(data)
        except (ValidationError, ValueError) as exc:
            errors[section_for(state.error_text(exc, "en"))] = state.error_text(exc)  # keywords are English
    for name, msg in errors.items():
        slots[name].error(fmt.literal(msg), icon=":material/error:")
    if sc is None:
        st.session_state[state.SCENARIO_ERROR] = next(iter(errors.values()))
        return None
    state.set_scenario(sc, from_widgets=True)
    return sc


def scenario_or_stop(include_compare: bool = False) -> Scenario | None:
    """Sidebar + URL sync; on an invalid combination, show the message in the page body and
    return None (the page then draws nothing else)."""
    sc = scenario_sidebar()
    state.sync_url(include_compare)
    if sc is None:
        msg = st.session_state.get(state.SCENARIO_ERROR)
        st.error(_("The scenario is not valid: {problem}. Change the setting marked in the sidebar.",
                   problem=fmt.literal(msg)), icon=":material/error:")
    return sc


def hardware_name(sc: Scenario) -> str:
    """'8 x NVIDIA A100 SXM4 80GB' / '1 x custom 24.00 GiB GPU'."""
    from calc.contract.presets import gpu_presets

    hw = sc.resolved_hardware()
    if hw.gpu:
        name = gpu_presets()[hw.gpu].name
    else:
        name = _("custom {size} GiB GPU", size=f"{hw.memory_bytes / GiB:,.2f}") if hw.memory_bytes else _("no GPU")
    return f"{hw.num_gpus} x {name}"
