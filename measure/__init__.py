"""Measure the GPU memory of the reference workload that the calculator predicts.

`python -m measure SCENARIO.json --device cuda|cpu|fake` builds the scenario's model with random
weights, runs `--steps` training (or inference) steps and prints one MeasurementRecord as JSON.

The reference workload (measure/workload.py) in short:
  model      AutoModelForCausalLM.from_config(AutoConfig.for_model(...), attn_implementation=eager|sdpa),
             torch.manual_seed(0), built in the run's dtype (set_default_dtype), then moved to the device
  precision  fp32 | amp-bf16/amp-fp16 (fp32 weights, forward+loss under autocast, GradScaler for fp16) |
             bf16 (everything bf16) | bf16-mixed/fp16-mixed (16-bit model, fp32 master copies that the
             optimizer updates; fp16-mixed with a static loss scale of 1024)
  step       loss = model(input_ids=x, labels=x).loss; loss.backward(); opt.step();
             opt.zero_grad(set_to_none=True); del loss  (x: randint(vocab, (batch, seq)), made once)
  optimizer  torch.optim AdamW/Adam/SGD/Adafactor, lr 1e-4, foreach / fused / for-loop set explicitly
  inference  model.eval(); with no_grad: out = model(input_ids=x) (KV cache + logits alive); del out;
             inference.new_tokens N > 0: out = model.generate(x, max_new_tokens=N, eos_token_id=None,
             do_sample=False) (greedy, exactly N tokens; the static cache with kv_cache static)
The cpu and fake devices count live tensor bytes with torch's MemTracker; cuda reads the allocator.

Importing this package does not import torch (the records in calc.contract.record need only pydantic).
"""
