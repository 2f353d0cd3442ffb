"""The op-level simulator: what each layer's autograd graph keeps alive, op by op, as transformers' modeling
code runs it.

- `context`: `Ctx`, the context a block is built in (the model, the batch shape on this GPU, the bytes per
  element of weights, activations and residual stream, the parallel layout, LoRA, the kind of layer).
- `ops`: the generic ops (dropout, nn.Linear with autocast and LoRA adapters, the norms, the activations).
- `attention`, `mlp`, `moe`: each family's attention (eager, SDPA, sliding windows, MLA), MLPs and experts.
- `blocks`: whole blocks: a decoder layer of each family, the embedding, the final norm, the LM head with its
  loss (PyTorch's cross-entropy, Liger's fused one) and the inference head. `layers` re-exports them all.
- `graph`: replays a block's graph forward and backward and profiles it (`BlockProfile`: what is saved for
  backward, the forward and backward peaks).
- `symbolic`: sizes as polynomials in batch and sequence, so that a block recorded at one shape is evaluated at
  another (`Trace`, with the guards under which the recording holds).
- `profiles`: records each block once per shape-free context and answers every shape from the recording.

May import calc.contract and calc.memo.
"""
