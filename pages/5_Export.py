"""Export: the current (or recommended) scenario as a DeepSpeed config, launch lines, a Hugging Face
Trainer script and an accelerate config (calc.export); and the reverse, "will my ds_config fit?"."""

from __future__ import annotations

import json

import streamlit as st

from calc.export import (
    ExportOptions,
    accelerate_config,
    export_deepspeed,
    launch_script,
    scenario_from_ds_config,
    trainer_snippet,
)
from ui import compute, fmt, state
from ui import verdict as verdict_ui
from ui.widgets import MAX_CONFIG_BYTES, hardware_name, page_setup, parse_config_text, scenario_or_stop

page_setup("Export", ":material/download:")
st.title("Export the configuration")
st.caption("The same scenario the calculator estimates, written for DeepSpeed, the Hugging Face Trainer and "
           "accelerate. The ZeRO bucket sizes in the config are the ones the estimate assumes.")

sc = scenario_or_stop()
if sc is None:
    st.stop()

SOURCES = {"current": "The current scenario (sidebar)", "recommended": "The fastest configuration that fits "
           "(Recommend page)"}
st.session_state.setdefault("exp_source", "current")
source = st.radio("Export", list(SOURCES), format_func=SOURCES.__getitem__, key="exp_source", horizontal=True)
target = sc
if source == "recommended":
    try:
        best = compute.fastest_fitting(sc.model_dump_json())
    except ValueError as exc:
        st.info(f"No recommendation for this hardware: {fmt.literal(state.error_text(exc))}. Exporting the current scenario.",
                icon=":material/info:")
    else:
        if best is not None:
            target = best.scenario
            st.markdown(f"Recommended: **{best.label}** ({best.tokens_per_s_per_gpu:,.0f} tokens/s per GPU).")
        else:
            st.warning("Nothing fits this hardware, not even QLoRA (see the Recommend page); exporting the current "
                       "scenario.", icon=":material/warning:")

with st.expander("Hyper-parameters the scenario does not carry"):
    d = ExportOptions()
    for k, v in (("exp_lr", d.learning_rate), ("exp_wd", d.weight_decay), ("exp_warmup", d.warmup_steps),
                 ("exp_steps", 0), ("exp_clip", d.gradient_clipping), ("exp_nvme", d.nvme_path)):
        st.session_state.setdefault(k, v)
    c1, c2, c3 = st.columns(3)
    lr = c1.number_input("Learning rate", min_value=1e-9, max_value=10.0, format="%.2e", key="exp_lr")
    wd = c2.number_input("Weight decay", min_value=0.0, max_value=10.0, key="exp_wd")
    clip = c3.number_input("Gradient clipping (max norm)", min_value=0.0, max_value=1e6, key="exp_clip")
    warm = c1.number_input("Warm-up steps", min_value=0, max_value=10**9, step=1, key="exp_warmup")
    total = c2.number_input("Total steps (0: constant after warm-up)", min_value=0, max_value=10**9, step=1,
                            key="exp_steps")
    nvme = c3.text_input("NVMe path (for NVMe offload)", key="exp_nvme", max_chars=400)
try:
    opts = ExportOptions(learning_rate=lr, weight_decay=wd, gradient_clipping=clip, warmup_steps=int(warm),
                         total_num_steps=int(total) or None, nvme_path=nvme or d.nvme_path)
except ValueError as exc:
    st.error(fmt.literal(state.error_text(exc)), icon=":material/error:")
    st.stop()

est = compute.run(target)


def _verdict_and_speed() -> None:
    """What the exported files will do: the engine's verdict and calc.speed's estimate, beside the files."""
    speed = compute.speed(target)
    detail = f"device total {fmt.gib(est.device_total_bytes.expected)} expected per GPU"
    if speed is not None:
        detail += f"; about {speed.tokens_per_s_per_gpu:,.0f} tokens/s per GPU, {speed.step_s:,.3g} s per step"
    verdict_ui.box(st, est.verdict, f"{target.spec.name or target.spec.family} on {hardware_name(target)}", detail)


try:
    ds = export_deepspeed(target, opts)
except ValueError as exc:
    st.error(f"DeepSpeed cannot express this scenario: {fmt.literal(state.error_text(exc))}", icon=":material/error:")
    _verdict_and_speed()
    ds = None

if ds is not None:
    text = json.dumps(ds.config, indent=2) + "\n"
    st.subheader("DeepSpeed config (ds_config.json)")
    _verdict_and_speed()
    st.download_button("Download ds_config.json", text, file_name="ds_config.json", mime="application/json",
                       key="exp_download", icon=":material/download:", on_click="ignore")
    st.code(text, language="json")
    for note in ds.notes:
        st.caption(f"Note: {note}")

    st.subheader("Launch")
    st.download_button("Download launch.sh", launch_script(target), file_name="launch.sh", mime="text/x-shellscript",
                       key="exp_download_sh", on_click="ignore")
    st.code(compute.launch_lines(target), language="bash")

    st.subheader("Hugging Face Trainer (train.py)")
    _verdict_and_speed()
    snippet = trainer_snippet(target, opts)
    st.download_button("Download train.py", snippet, file_name="train.py", mime="text/x-python",
                       key="exp_download_py", on_click="ignore")
    st.caption("Runs as written under `python`, `deepspeed` and `accelerate launch` (see its docstring); "
               "accepts every Trainer flag, e.g. `--max_steps 10`.")
    with st.expander("Show train.py"):
        st.code(snippet, language="python", wrap_lines=True)

    st.subheader("accelerate config (accelerate.yaml)")
    acc = accelerate_config(target)
    st.download_button("Download accelerate.yaml", acc, file_name="accelerate.yaml", mime="text/yaml",
                       key="exp_download_yaml", on_click="ignore")
    st.code(acc, language="yaml")

# ---- import ------------------------------------------------------------------------------
st.header("Will my DeepSpeed config fit?")
st.markdown(f"Upload or paste an existing ds_config.json: it is read into a scenario for the sidebar's model "
            f"(**{sc.spec.name or sc.spec.family}**, sequence length {sc.training.seq_len:,}) on "
            f"**{hardware_name(sc)}** and estimated.")
up = st.file_uploader("ds_config.json", type=["json"], key="exp_import_file", max_upload_size=2)
pasted = st.text_area("…or paste it", key="exp_import_text", height=140, placeholder='{"zero_optimization": {...}}')
raw, where = None, None
if up is not None:
    if up.size > MAX_CONFIG_BYTES:
        st.error(f"{fmt.literal(up.name)} is {up.size / fmt.MiB:,.1f} MiB; the limit is "
                 f"{MAX_CONFIG_BYTES / fmt.MiB:.0f} MiB.", icon=":material/error:")
    else:
        raw, where = up.getvalue(), up.name
elif pasted.strip():
    raw, where = pasted, "pasted config"
if raw is not None:
    try:
        cfg = parse_config_text(raw, where)
        imported = scenario_from_ds_config(cfg, sc.model, sc.hardware, seq_len=sc.training.seq_len,
                                           attention=sc.training.attention.value)
        iest = compute.run(imported)
    except ValueError as exc:
        msg = state.error_text(exc).replace("config.json", "ds_config.json")
        st.error(fmt.literal(msg if msg.startswith(where) else f"{where}: {msg}"),
                 icon=":material/error:")
    else:
        t = imported.training
        st.markdown(f"Read from {fmt.literal(where)}: {t.precision.value}, ZeRO-{t.zero_stage}, micro-batch "
                    f"{t.micro_batch_size} x {t.gradient_accumulation_steps} accumulation, optimizer offload "
                    f"{t.offload_optimizer.value}, parameter offload {t.offload_params.value}, checkpointing "
                    f"{t.activation_checkpointing.value}.")
        verdict_ui.box(st, iest.verdict, "This config",
                       f"device total {fmt.gib(iest.device_total_bytes.expected)} expected per GPU")
        st.button("Use it as the scenario", key="exp_import_use", on_click=state.set_scenario, args=(imported,))
