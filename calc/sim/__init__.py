"""The op-level simulator: what each layer's autograd graph keeps alive, op by op, as transformers' modeling
code runs it.

`layers` builds a decoder layer's graph for a family (attention kinds, MLP, MoE, norms, LoRA adapters, dropout
masks) from a context (`Ctx`: the shape and the bytes per element of weights, activations and reductions);
`graph` replays a graph forward and backward and profiles a block (`BlockProfile`: what is saved for backward, the
forward and backward peaks); `symbolic` lets a profile recorded at one shape be evaluated at another (sizes as
polynomials in batch and sequence); `profiles` records each block once per shape-free context and answers every
shape from the recording.

May import calc.contract and calc.memo.
"""
