"""The memory model: the peak of one training or inference step, where every byte goes, and whether it fits.

Where each concern lives, reading from the entry point down:

- `estimate`: `estimate` (memoized, keyed by value), `reference_estimate` (every moment listed), `clear_memo`; the
  memo key of a scenario without its batch shape (`shape_free_values`, `shape_free_key`); the peak over the
  pipeline stages and the Estimate's fields.
- `train_timeline`: a training step's rows (`train_timeline`, `TrainStage`: one method per section: forward, loss,
  backward, the embedding's backward, the gradient epilogue); DeepSpeed ZeRO-1/2's gradient partition appearing at
  the first bucket reduction (`first_reduction`); the optimizer step and DeepSpeed's flattened gradients before it
  (`optimizer_rows`).
- `timeline`: a row (`TimelineRow`), the step's timeline and its peak asked only at the pieces' ends
  (`StepTimeline`), the layers' event names, an inference step's rows (`inference_timeline`).
- `repeats`: the algorithmic speed-ups: a value per kind of layer (`Layers`, `per_layer`), where the layers repeat
  (`repeats`, `layers_repeat`), running sums composed from one period (`prefix_sums`), the pieces of a run of
  layer rows (`pieces`, `split_pieces`, `split_at_switch`).
- `activations`: the blocks' context (`block_context`), each layer's context (`layer_ctxs`), the block profiles
  (`block_profiles`, `layer_profile`), what a layer keeps under checkpointing (`layer_saved_bytes`), selective
  checkpointing's drop (`attention_saved_bytes`), RoPE tables and masks (`model_level_bytes`), autocast's weight
  copies (`amp_cached_weight_bytes`), the output a loop keeps (`HeldOutputs`), the recommender's bound
  (`forward_activations_floor`).
- `states`: weights, gradients, optimizer states, master weights and their ZeRO partitions (`model_states`, built
  from `trainable_weights`, `optimizer_bytes`, `zero_buffers`, `optimizer_offload`); ZeRO-3's prefetch bucket
  (`zero_buffers`, `States.zero3_gathered`); ZeRO-1/2's reduce buckets (`States.reduce_buckets`); rank 0's
  gradient partition (`zero12_rank0_partition`, `partition_bytes`); the step's gradients (`step_gradient_bytes`);
  LoRA's adapters (`lora_shapes`, `adapter_bytes`); parameter counts per model (`param_count`, `local_params`).
- `fsdp2`: PyTorch FSDP2's states (`fsdp2_states`), its per-layer terms (`fsdp2_layer_terms`: gathered groups,
  all-gather outputs, reduce-scatter buffers) and expert parallelism's experts group.
- `breakdown`: the peak as named components with formulas and sources (`peak_components`), the ZeRO note.
- `result`: the Estimate, its Breakdown, Timeline, DeviceTotal and Components, and the event names.
- `overhead`: the device total above the allocator's peak (CUDA context, NCCL, cuBLAS workspace, the reserve).
- `verdict`: does it fit, and what limits it. `per_param`: bytes per parameter. `fit`: the largest micro-batch.
- `engine`: the old single module's import path, re-exporting the names above.

May import calc.contract, calc.sim and calc.memo.
"""
