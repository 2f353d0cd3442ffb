"""Bounds on every number a user can hand the calculator, each with the reason for its value.

They are generous (the largest released models and machines times a margin), so no real job is
refused, and they bound the cost of a run by construction: the engine's timeline and the
recommender's search grow with the layer count and the parallel layouts, and nothing else in a
scenario is iterated over. `benchmarks/bounds.py` prints the estimate and recommend times of a
scenario at these bounds.
"""

from __future__ import annotations

# ---- input size (calc.contract.boundary) ---------------------------------------------------------------
MAX_JSON_BYTES = 2**20  # a scenario, config.json or ds_config.json is a few KiB; 1 MiB is 100x that
MAX_RECORDS_FILE_BYTES = 4 * 2**20  # ~2,000 records of ~2 KiB; the committed data/*.jsonl hold 0.3 MiB
MAX_JSON_DEPTH = 32  # a config.json nests 3 levels (rope_scaling, quantization_config); a record 4
MAX_JSON_INT = 2**63 - 1  # no input field exceeds int64 (bytes, params, tokens); longer literals are junk
MAX_JSON_INT_DIGITS = 19  # digits of MAX_JSON_INT: checked before int() builds a 4,000-digit number
MAX_EXCERPT_CHARS = 60  # how much of a bad value an error message quotes
MAX_MESSAGE_CHARS = 300  # one line on a terminal or beside a widget
MAX_URL_PARAM_CHARS = 200  # a preset id or a number; config= has its own (compressed) limit
MAX_PRESET_ID_CHARS = 100  # the longest preset id is ~30 characters; a file name may have 255 bytes

# ---- model shapes (calc.contract.architectures.ModelSpec) ------------------------------------------------
MAX_LAYERS = 1024  # deepest released decoders: Llama-3.1-405B 126, PaLM-540B 118, GPT-3 96; 8x that.
#   At every bound at once, estimate takes < 10 ms and recommend at most ~2.3 s on one core
#   (65,536 GPUs, 1,024 layers, 2^32 sequences per step: benchmarks/bounds.py).
MAX_HIDDEN = 2**17  # widest: PaLM-540B 18,432, Llama-3.1-405B 16,384, GPT-3 12,288; 7x that
MAX_INTERMEDIATE = 2**20  # widest MLP: PaLM-540B 73,728, Llama-3.1-405B 53,248; 14x that
MAX_HEADS = 1024  # most attention heads: Llama-3.1-405B and DeepSeek-V3 128; 8x that
MAX_HEAD_DIM = 2048  # largest head: Gemma-2 256 (DeepSeek MLA 192); 8x that
MAX_VOCAB = 2**22  # largest vocabulary: Gemma-2/3 256,000 / 262,144; 16x that
MAX_POSITIONS = 2**27  # longest context: Llama-4 Scout 10M positions; 13x that
MAX_EXPERTS = 2048  # most routed experts: Kimi-K2 384, DeepSeek-V3 256; 5x that
MAX_VISION_PARAMS = 2**40  # a multimodal wrapper's vision side: the largest, InternViT-6B, 5.9e9; 180x that
MAX_SOFTCAP = 1e6  # Gemma-2 caps logits at 30 and attention scores at 50

# ---- workload and hardware (calc.contract.scenario) ------------------------------------------------------
# micro_batch_size (65,536), seq_len (4,194,304 = 2^22), gradient_accumulation_steps (65,536),
# num_gpus (65,536), tensor/pipeline parallel (1,024) and checkpoint_every (1,024) keep the bounds
# TrainingConfig / HardwareConfig already state. Their magnitudes only scale integers in the engine
# (bytes are exact Python ints); recommend enumerates the divisors of num_gpus, at most 17 powers of 2.
MAX_GPU_MEMORY_BYTES = 2**44  # 16 TiB per GPU: the largest today hold 288 GB (MI355X, B300); 60x that
MAX_HOST_BYTES = 2**50  # 1 PiB of RAM or NVMe per node: the largest nodes hold 32 TiB of RAM; 32x that
MAX_LORA_ALPHA = 1e6  # peft's alpha is a scale numerator, typically 8-128; finite is what matters

# ---- measurement records (calc.contract.record) ------------------------------------------------------------
MAX_RECORD_BYTES = 2**60  # 1 EiB: any byte count in a record (a GPU holds at most 288 GB today)
MAX_RECORD_PARAMS = 2**50  # 10^15 parameters: 2,000x the largest released model (Kimi-K2, 1T)
MAX_RECORD_STEPS = 10**6  # the measurement scripts run 3 steps
MAX_RECORD_SECONDS = 1e9  # 30 years of wall time
