"""How far the estimates are to be trusted.

`validate` compares the engine with every committed measurement (data/*.jsonl) and reports the error per engine,
device, framework and held-out set; `published` compares it with the peak memory that torchtune, LitGPT,
torchtitan and Qwen publish for real CUDA runs (data/published_gpu.yaml); `calibrate` applies a user's own
measured run to the device total; `claims` checks the figures that the source articles and peers publish against
the engine.

May import calc.contract, calc.sim, calc.memory, calc.speed, calc.recommend and calc.memo.
"""
