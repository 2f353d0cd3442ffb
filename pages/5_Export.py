"""Export: the current (or recommended) scenario as a DeepSpeed config, launch lines, a Hugging Face
Trainer script and an accelerate config (calc.export), or for a torchtune / LitGPT scenario its recipe config
and `tune run` line / its `litgpt finetune_*` command; and the reverse, "will my ds_config fit?"."""

from __future__ import annotations

import streamlit as st

from calc.contract.errors import UserError
from calc.contract.i18n import N_
from calc.contract.output import strict_json
from calc.contract.stacks import launch_problem, uses_fsdp2
from calc.export import (
    ExportOptions,
    accelerate_config,
    bundle_files,
    bundle_zip,
    export_deepspeed,
    framework_files,
    import_ds_config,
    launch_lines,
    launch_script,
    node_layout_problem,
    trainer_snippet,
)
from calc.recommend import per_step_words
from ui import compute, fmt, state
from ui import verdict_box as verdict_ui
from ui.language import _, current, say, tr
from ui.widgets import MAX_CONFIG_BYTES, hardware_name, page_setup, parse_config_text, scenario_or_stop

page_setup("Export", ":material/download:")
st.title(_("Export the configuration"))
st.caption(_("The same scenario the calculator estimates, written for DeepSpeed, the Hugging Face Trainer and "
             "accelerate, for PyTorch FSDP2 under torchrun, or for torchtune and LitGPT. The ZeRO bucket sizes in the "
             "config are the ones the estimate assumes."))
lang = current()

sc = scenario_or_stop()
if sc is None:
    st.stop()

SOURCES = {"current": N_("The current scenario (sidebar)"),
           "recommended": N_("The fastest configuration that fits (Recommend page)")}
st.session_state.setdefault("exp_source", "current")
source = st.radio(_("Export"), list(SOURCES), format_func=lambda k: tr(SOURCES[k]), key="exp_source",
                  horizontal=True)
target = sc
if source == "recommended":
    try:
        best = compute.fastest_fitting(sc.model_dump_json())
    except ValueError as exc:
        st.info(_("No recommendation for this hardware: {error}. Exporting the current scenario.",
                  error=fmt.literal(state.error_text(exc))), icon=":material/info:")
    else:
        if best is not None:
            target = best.scenario
            st.markdown(_("Recommended: **{label}** ({speed} tokens/s per GPU {batch}).", label=say(best.label),
                          speed=f"{best.tokens_per_s_per_gpu:,.0f}", batch=say(per_step_words(best.global_batch_tokens))))
        else:
            st.warning(_("Nothing fits this hardware, not even QLoRA; exporting the current scenario."),
                       icon=":material/warning:")
            st.page_link("pages/3_Recommend.py", label=_("Recommend: what to turn on next"), icon=":material/recommend:",
                         query_params=state.page_params())

with st.expander(_("Hyper-parameters the scenario does not carry")):
    d = ExportOptions()
    for k, v in (("exp_lr", d.learning_rate), ("exp_wd", d.weight_decay), ("exp_warmup", d.warmup_steps),
                 ("exp_steps", 0), ("exp_clip", d.gradient_clipping), ("exp_nvme", d.nvme_path)):
        st.session_state.setdefault(k, v)
    c1, c2, c3 = st.columns(3)
    lr = c1.number_input(_("Learning rate"), min_value=1e-9, max_value=10.0, format="%.2e", key="exp_lr")
    wd = c2.number_input(_("Weight decay"), min_value=0.0, max_value=10.0, key="exp_wd")
    clip = c3.number_input(_("Gradient clipping (max norm)"), min_value=0.0, max_value=1e6, key="exp_clip")
    warm = c1.number_input(_("Warm-up steps"), min_value=0, max_value=10**9, step=1, key="exp_warmup")
    total = c2.number_input(_("Total steps (0: constant after warm-up)"), min_value=0, max_value=10**9, step=1,
                            key="exp_steps")
    nvme = c3.text_input(_("NVMe path (for NVMe offload)"), key="exp_nvme", max_chars=400)
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
    total = fmt.gib(est.device_total_bytes.expected)
    detail = _("device total {total} expected per GPU", total=total) if speed is None else \
        _("device total {total} expected per GPU; about {speed} tokens/s per GPU {batch}, {step} s per step",
          total=total, speed=f"{speed.tokens_per_s_per_gpu:,.0f}", step=f"{speed.step_s:,.3g}",
          batch=say(per_step_words(speed.tokens_per_step)))
    verdict_ui.box(st, est.verdict, _("{model} on {hardware}", model=target.spec.name or target.spec.family,
                                      hardware=hardware_name(target)), detail)


FRAMEWORK_NAMES = {"torchtune": "torchtune", "litgpt": "LitGPT", "fsdp2": "PyTorch FSDP2"}
FRAMEWORK_TITLES = {"torchtune": N_("torchtune recipe config (torchtune.yaml)"),
                    "litgpt": N_("LitGPT fine-tuning command (launch.sh)"),
                    "fsdp2": N_("PyTorch FSDP2 training script (train.py) and torchrun (launch.sh)")}
FRAMEWORK_CAPTIONS = {
    "torchtune": N_("Fill in the checkpoint and tokenizer paths at the top of the file, then run launch.sh. "
                    "torchtune's recipe runs configs like this one end to end: two steps of a small model on the "
                    "CPU with the versions in requirements.txt."),
    "litgpt": N_("Put the model's LitGPT checkpoint where the command says; extra arguments to launch.sh (e.g. "
                 "`--data ...`) are passed on. LitGPT runs command lines like this one end to end (two steps of a "
                 "small model on the CPU); QLoRA's --quantize needs a CUDA GPU and is checked with LitGPT's parser "
                 "only."),
    "fsdp2": N_("train.py shards the model with FSDP2 as the estimate assumes (fully_shard on every decoder layer, "
                "then the root) and trains it under torchrun; extra arguments to launch.sh (e.g. `--steps "
                "100 --dataset tokens.jsonl`) are passed on. It was run as written on two CPU ranks.")}


def _framework_section(framework: str) -> None:
    """torchtune / LitGPT: the framework's own files (calc.export.bundle.framework_files), no DeepSpeed."""
    problem = launch_problem(target)
    try:
        if problem is not None:
            raise UserError(problem)
        files = framework_files(target, opts, lang)
    except ValueError as exc:
        st.error(_("{framework} cannot express this scenario: {error}", framework=FRAMEWORK_NAMES[framework],
                   error=fmt.literal(state.error_text(exc))), icon=":material/error:")
        _verdict_and_speed()
        return
    st.subheader(tr(FRAMEWORK_TITLES[framework]))
    _verdict_and_speed()
    st.caption(tr(FRAMEWORK_CAPTIONS[framework]))
    for name, text in (files or {}).items():
        language = {".yaml": "yaml", ".py": "python"}.get(name[name.rfind("."):], "bash")
        st.download_button(_("Download {file}", file=name), text, file_name=name,
                           mime={"yaml": "text/yaml", "python": "text/x-python"}.get(language, "text/x-shellscript"),
                           key=f"exp_download_{name}", on_click="ignore")
        st.code(text, language=language)


framework = "fsdp2" if uses_fsdp2(target) else target.training.framework
if framework in FRAMEWORK_TITLES:
    _framework_section(framework)
    ds = None
elif (stack_problem := launch_problem(target)) is not None:
    st.error(_("These files would not train: {error}", error=fmt.literal(say(stack_problem))), icon=":material/error:")
    _verdict_and_speed()
    ds = None
else:
    try:
        ds = export_deepspeed(target, opts)
    except ValueError as exc:
        st.error(_("DeepSpeed cannot express this scenario: {error}", error=fmt.literal(state.error_text(exc))),
                 icon=":material/error:")
        _verdict_and_speed()
        ds = None

if ds is not None:
    text = strict_json(ds.config)
    st.subheader(_("DeepSpeed config (ds_config.json)"))
    _verdict_and_speed()
    st.download_button(_("Download ds_config.json"), text, file_name="ds_config.json", mime="application/json",
                       key="exp_download", icon=":material/download:", on_click="ignore")
    st.code(text, language="json")
    for note in ds.note_texts:
        st.caption(_("Note: {note}", note=say(note)))

    st.subheader(_("Launch"))
    layout_problem = node_layout_problem(target)
    if layout_problem is not None:
        st.error(_("No launch line can start these GPUs: {error}", error=fmt.literal(say(layout_problem))),
                 icon=":material/error:")
    else:
        st.download_button(_("Download launch.sh"), launch_script(target, lang), file_name="launch.sh",
                           mime="text/x-shellscript", key="exp_download_sh", on_click="ignore")
        st.code(launch_lines(target, lang), language="bash")

    st.subheader(_("Hugging Face Trainer (train.py)"))
    _verdict_and_speed()
    snippet = trainer_snippet(target, opts, lang=lang)
    st.download_button(_("Download train.py"), snippet, file_name="train.py", mime="text/x-python",
                       key="exp_download_py", on_click="ignore")
    st.caption(_("Runs as written under `python`, `deepspeed` and `accelerate launch` (see its docstring); "
                 "accepts every Trainer flag, e.g. `--max_steps 10`."))
    with st.expander(_("Show train.py")):
        st.code(snippet, language="python", wrap_lines=True)

    if layout_problem is None:
        st.subheader(_("accelerate config (accelerate.yaml)"))
        acc = accelerate_config(target, lang=lang)
        st.download_button(_("Download accelerate.yaml"), acc, file_name="accelerate.yaml", mime="text/yaml",
                           key="exp_download_yaml", on_click="ignore")
        st.code(acc, language="yaml")

try:
    bundle, _bundle_notes = bundle_files(target, opts, lang)
except ValueError:  # the stack cannot express the scenario: the section above says why
    bundle = None
if bundle is not None:
    st.download_button(_("Download all files (.zip)"), bundle_zip(bundle), file_name="vramcalc-export.zip",
                       mime="application/zip", key="exp_download_zip", icon=":material/folder_zip:", on_click="ignore",
                       type="primary")
    st.caption(_("The same files as `python -m calc export SCENARIO -o DIR`: {files}.",
                 files=", ".join(f"`{name}`" for name in bundle)))

# ---- import ------------------------------------------------------------------------------
st.header(_("Will my DeepSpeed config fit?"))
st.markdown(_("Upload or paste an existing ds_config.json: it is read into a scenario for the sidebar's model "
              "(**{model}**, sequence length {seq}) on **{hardware}** and estimated.",
              model=sc.spec.name or sc.spec.family, seq=f"{sc.training.seq_len:,}", hardware=hardware_name(sc)))
up = st.file_uploader("ds_config.json", type=["json"], key="exp_import_file", max_upload_size=compute.UPLOAD_LIMIT_MIB)
pasted = st.text_area(_("…or paste it"), key="exp_import_text", height=140, placeholder='{"zero_optimization": {...}}')
raw, where = None, None
if up is not None:
    if up.size > MAX_CONFIG_BYTES:
        st.error(_("{name} is {size} MiB; the limit is {limit} MiB.", name=fmt.literal(up.name),
                   size=f"{up.size / fmt.MiB:,.1f}", limit=f"{MAX_CONFIG_BYTES / fmt.MiB:.0f}"),
                 icon=":material/error:")
    else:
        raw, where = up.getvalue(), up.name
elif pasted.strip():
    raw, where = pasted, _("pasted config")
if raw is not None:
    try:
        cfg = parse_config_text(raw, where)
        result = import_ds_config(cfg, sc, opts, attention=sc.training.attention.value)
        imported = result.scenario
        iest = compute.run(imported)
    except ValueError as exc:
        msg = state.error_text(exc).replace("config.json", "ds_config.json")
        st.error(fmt.literal(msg if msg.startswith(where) else f"{where}: {msg}"),
                 icon=":material/error:")
    else:
        t = imported.training
        st.markdown(_("Read from {where}: {precision}, ZeRO-{stage}, micro-batch {micro} x {accum} accumulation, "
                      "optimizer offload {opt_offload}, parameter offload {param_offload}, checkpointing "
                      "{checkpointing}.", where=fmt.literal(where), precision=t.precision.value, stage=t.zero_stage,
                      micro=t.micro_batch_size, accum=t.gradient_accumulation_steps,
                      opt_offload=t.offload_optimizer.value, param_offload=t.offload_params.value,
                      checkpointing=t.activation_checkpointing.value))
        if result.filled:
            st.markdown(_("Filled in for \"auto\", as the Hugging Face Trainer fills it from this scenario:"))
            st.markdown("\n".join(f"- `{f.key}` = `{strict_json(f.value, indent=None)}` ({say(f.source)})"
                                   for f in result.filled))
        for note in result.notes:
            st.caption(_("Note: {note}", note=fmt.literal(say(note))))
        verdict_ui.box(st, iest.verdict, _("This config"),
                       _("device total {total} expected per GPU", total=fmt.gib(iest.device_total_bytes.expected)))
        st.button(_("Use it as the scenario"), key="exp_import_use", on_click=state.set_scenario, args=(imported,))
