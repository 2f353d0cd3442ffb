"""The breakdown at the peak: the row of the peak's moment as named terms (Components), each with its formula and
its source, summing to the peak allocated bytes: the weights (and FSDP2's gathered weights), the gradients as the
moment holds them, the optimizer states, master weights, activations, and the other bytes named one by one
(input ids, cuBLAS workspaces, ZeRO's buffers, the optimizer's temporaries, the transients left).
"""

from __future__ import annotations

from calc.contract import precision
from calc.contract.i18n import N_
from calc.contract.scenario import Mode, Scenario
from calc.memory.activations import block_context
from calc.memory.result import Component, words
from calc.memory.states import States, adapter_bytes
from calc.memory.timeline import TimelineRow
from calc.sim.frameworks.litgpt import (
    litgpt_batch_bytes,
    litgpt_logits_bytes,
    litgpt_lora_index_bytes,
    litgpt_rope_cache_bytes,
    litgpt_stable_embedding_grad_bytes,
)


def peak_components(sc: Scenario, st: States, row: TimelineRow, workspace_bytes: int) -> list[Component]:
    """The breakdown at the peak (`row`) as named terms, each with its formula and source; they sum to
    the peak allocated bytes. `workspace_bytes`: the cuBLAS workspace bytes."""
    event, phase, grads = row.event, row.phase, row.gradients
    t = sc.training
    p = t.precision
    out = list(st.components)  # weights
    held = stable_embedding_component(sc)
    if held is not None:  # gradients every moment of the step keeps, beside the .grad the step frees
        out.append(held)
        grads -= held.bytes
    gathered = row.parameters - sum(c.bytes for c in out if c.category == "parameters")
    if gathered > 0:  # FSDP2: the root module's and the running layers' all-gathered full 16-bit weights
        out.append(Component(key="gathered_weights", category="parameters", label=N_("Gathered full weights (FSDP2)"),
                             bytes=gathered, formula=N_("root weights (embedding, final norm, lm_head) gathered "
                             "through forward and backward + the running (and prefetched) decoder layers' full weights"),
                             source=N_("torch.distributed.fsdp.fully_shard: unsharded parameters between all-gather "
                                       "and reshard (modelled from FSDP2's source, calc.memory.fsdp2.fsdp2_states)")))
    if event in FLATTEN_EVENTS:
        out.append(Component(key="gradients", category="gradients", label=FLATTEN_EVENTS[event][0], bytes=grads,
                             formula=FLATTEN_EVENTS[event][1],
                             source=N_("DeepSpeed's source (calc.memory.train_timeline.optimizer_rows)")))
        return out + states_and_rest_components(sc, st, row, workspace_bytes)
    gb = precision.grad_bytes_per_param(p) if t.lora is None else adapter_bytes(p, t.lora.base_weights)
    fp32_copies = phase == "optimizer" and st.grad_fp32_step > 0
    both = fp32_copies and st.keeps_16bit_step_grads  # DeepSpeed ZeRO-0: the 16-bit grads stay beside them
    label = N_("Parameter gradients (.grad)")
    if fp32_copies:
        label = N_("16-bit gradients and their fp32 copies for the optimizer step") if both else \
            N_("fp32 gradient copies for the optimizer step")
        gb = f"({gb} + {precision.FP32})" if both else precision.FP32  # *-mixed: the step works on fp32 copies
    full = st.grad_fp32_step + (st.grads if both else 0) if fp32_copies else st.grads
    grad_fields = dict(params=f"{st.trainable:,}", bytes=gb, zero=zero_note(t.zero_stage, 1 if fp32_copies else 2, sc))
    out.append(Component(
        key="gradients", category="gradients", label=label, bytes=grads,
        **(words("formula", N_("{params} trainable params x {bytes} B{zero} ({share} created so far)"),
                 share=f"{grads / full:.0%}", **grad_fields) if full and grads < full else
           words("formula", N_("{params} trainable params x {bytes} B{zero}"), **grad_fields)),
        source=precision.step_gradients_why(st.keeps_16bit_step_grads) if fp32_copies else
        N_("AccumulateGrad creates .grad in the parameter dtype; zero_grad(set_to_none=True) frees them after the "
           "step")))
    return out + states_and_rest_components(sc, st, row, workspace_bytes)


# The moments before DeepSpeed's optimizer step where gradients are copied (calc.memory.train_timeline.optimizer_rows):
# label, formula
_FLATTENED = N_("Gradients flattened and cast to fp32 for the optimizer step")
FLATTEN_EVENTS = {
    "gradient norm (fp64 copy)": (N_("Gradients and an fp64 copy for the gradient norm"),
                                  N_("the rank's gradient partition + an fp64 copy of its largest gradient")),
    "gradient partition flattened": (_FLATTENED, N_("the rank's gradient partition + its flat copy (+ that copy "
                                                    "cast to fp32 for a 16-bit model)")),
    "gradients cast to fp32 and flattened": (_FLATTENED, N_("the 16-bit gradients + an fp32 copy of each + the flat "
                                                            "fp32 tensor they are joined into")),
}


# A paged optimizer's large states are in CUDA managed memory: shown in the device total, not in the peak.
PAGED_STATES_SOURCE = N_(
    "bitsandbytes' state buffers (calc.contract.precision.bnb_state_bytes); a paged optimizer keeps the states of "
    "tensors of 100,000 elements or more in CUDA managed memory, outside peak allocated and inside the device total "
    "(Paged optimizer states) until the driver pages them to host RAM: modelled from bitsandbytes' source, CUDA only")


def states_and_rest_components(sc: Scenario, st: States, row: TimelineRow, workspace_bytes: int) -> list[Component]:
    """The peak's optimizer states, master weights, activations and other terms (peak_components)."""
    event, phase, opt, other = row.event, row.phase, row.optimizer_states, row.other
    t = sc.training
    out: list[Component] = []
    master = st.master if opt else 0
    states = opt - master
    out.append(Component(key="optimizer_states", category="optimizer_states", label=N_("Optimizer states"),
                         bytes=states, **words("formula", N_("{optimizer} states for {params} params{zero}; created "
                                                            "lazily in step 1"), optimizer=t.optimizer.value,
                                               params=f"{st.trainable:,}", zero=zero_note(t.zero_stage, 1, sc)),
                         source=PAGED_STATES_SOURCE if t.optimizer.paged else
                         N_("torch.optim state dicts (calc.contract.precision.optimizer_state_bytes)")))
    if master:
        out.append(Component(key="master_weights", category="optimizer_states", label=N_("fp32 master weights"),
                             bytes=master, **words("formula", N_("{params} params x {bytes} B{zero}"),
                                                   params=f"{st.trainable:,}", bytes=4,
                                                   zero=zero_note(t.zero_stage, 1, sc)),
                             source=N_("ZeRO paper section 3.1 (mixed-precision training keeps fp32 copies)")))
    if sc.mode == Mode.inference:  # an inference step saves nothing for backward: its activations are the KV cache
        out.append(Component(key="activations", category="activations", label=N_("KV cache"), bytes=row.activations,
                             **words("formula", N_("the layers' cached keys and values at '{event}'"), event=event),
                             source=N_("transformers cache_utils.py (DynamicLayer, DynamicSlidingWindowLayer, "
                                       "StaticLayer) and generation/utils.py; measured on CPU, forward and generate")))
    else:
        out.append(Component(key="activations", category="activations", label=N_("Activations saved for backward"),
                             bytes=row.activations,
                             **words("formula", N_("tensors autograd keeps at '{event}' (per-layer ops in "
                                                   "calc.sim.layers)"), event=event),
                             source=N_("replay of the transformers ops in the autograd simulator (calc.sim.graph)")))
    inputs = 8 * t.micro_batch_size * t.seq_len
    named = litgpt_named_terms(sc) if t.framework == "litgpt" else \
        [("inputs", N_("input_ids (int64)"), inputs, f"{t.micro_batch_size} x {t.seq_len} x 8 B",
          N_("the token batch on the device"))]
    named += [
        ("cublas_workspace", N_("cuBLAS workspaces"), workspace_bytes,
         N_("one per matmul thread (forward + autograd)"),
         N_("CUBLAS_WORKSPACE_CONFIG defaults (calc.memory.overhead)")),
        ("zero_buffers", N_("ZeRO buckets / gathered weights"),
         st.zero_buffers + (st.zero3_gathered if phase != "optimizer" else 0),
         N_("reduce bucket (stage 1-2) or gathered layer weights + prefetch (stage 3; none on a single "
            "data-parallel rank, where DeepSpeed uses the local partition without an all-gather)"),
         N_("DeepSpeed defaults in calc.contract.parallel; partition_parameters._no_gather_coalesced for one rank"))]
    step_temp = st.opt_temp if event == "optimizer step" else \
        st.in_backward.hook_temp_bytes(event) if st.in_backward else 0
    if step_temp:
        named += [("optimizer_temporaries", N_("optimizer.step() temporaries"), step_temp,
                   f"{t.optimizer_impl.value} {t.optimizer.value}", "calc.contract.precision.optimizer_temp_bytes"),
                  ]
    for key, label, n, formula, source in named:
        n = min(n, other)
        if n:
            out.append(Component(key=key, category="other", label=label, bytes=n, formula=formula, source=source))
            other -= n
    if other:
        out.append(Component(key="transients", category="other", **words("label", N_("Transients at '{event}'"),
                                                                          event=event),
                             bytes=other, formula=N_("block-local temporaries alive at this moment (logits and loss "
                             "gradients, activation gradients, autocast copies, attention scores)"),
                             source=N_("autograd simulator (calc.sim.graph) over calc.sim.layers")))
    return out


def activations_source(framework: str) -> str:
    """Whose ops the simulator replayed for the activations."""
    if framework == "litgpt":
        return N_("replay of LitGPT's model code and its fine-tuning scripts' chunked loss in the autograd "
                  "simulator (calc.sim.frameworks.litgpt), measured with LitGPT on the CPU; its CUDA kernels are the "
                  "shared ops' (modelled from source)")
    return N_("replay of the transformers ops in the autograd simulator (calc.sim.graph)")


def stable_embedding_component(sc: Scenario) -> Component | None:
    """LitGPT QLoRA: the StableEmbedding's gradients, which no optimizer frees (the timeline's held gradients)."""
    if sc.training.framework != "litgpt":
        return None
    stable = litgpt_stable_embedding_grad_bytes(block_context(sc, "cuda"))
    h = sc.spec.hidden_size
    return Component(key="stable_embedding_grads", category="gradients",
                     label=N_("StableEmbedding gradients (in no optimizer)"), bytes=stable,
                     formula=f"2 x ({sc.spec.vocab_size} x {h} + 2 x {h}) B",
                     source=N_("litgpt finetune/lora.py with --quantize: the StableEmbedding put in place of wte "
                               "after the optimizer was made trains, but no optimizer.zero_grad reaches its "
                               "gradients, which stay from the first backward on")) if stable else None


def litgpt_named_terms(sc: Scenario) -> list[tuple[str, str, int, str, str]]:
    """LitGPT's loop keeps, beside the model states: its batch, GPT's RoPE cache buffers, the fp32 logits, with
    LoRA on some of q, k and v LoRAQKVLinear's index buffers (QLoRA's StableEmbedding gradients, also kept
    throughout, are gradients: stable_embedding_component)."""
    t = sc.training
    ctx = block_context(sc, "cuda")
    b, s = t.micro_batch_size, t.seq_len
    index = litgpt_lora_index_bytes(ctx)
    index_term = [("lora_index", N_("LoRA qkv column index buffers"), index,
                   f"{sc.spec.num_layers} layers x {index // 8 // sc.spec.num_layers} x 8 B",
                   N_("litgpt.lora.LoRAQKVLinear.lora_ind: int64 per adapted column, kept from the first forward"))
                  ] if index else []
    return index_term + [("inputs", N_("input_ids and labels (int64)"), litgpt_batch_bytes(b, s), f"2 x {b} x {s} x 8 B",
             N_("the batch LitGPT's fine-tuning scripts feed the step")),
            ("rope_cache", N_("RoPE cos / sin buffers"), litgpt_rope_cache_bytes(ctx),
             f"2 x {s} x {sc.spec.rotary_dim} x {4 if ctx.fp32_rope else ctx.weight_elem_bytes} B",
             N_("litgpt.model.GPT.rope_cache, sized to the longest sequence")),
            ("kept_logits", N_("fp32 logits the loop keeps"), litgpt_logits_bytes(ctx),
             f"{b} x {s} x {sc.spec.vocab_size} x 4 B",
             N_("LitGPT's fine-tuning scripts: `logits` stays bound until the next forward returns (Lightning's "
                "convert_output casts it to fp32)"))]


def zero_note(stage: int, from_stage: int, sc: Scenario) -> str:
    """" / N (ZeRO-k)" where stage k shards the term (from `from_stage` on) over several data-parallel ranks."""
    return f" / {sc.data_parallel} (ZeRO-{stage})" if stage >= from_stage and sc.data_parallel > 1 else ""
