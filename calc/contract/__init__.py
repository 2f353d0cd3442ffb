"""The contract: everything a user can say, and the rules for saying it.

Owns the scenario (`scenario`: the JSON contract, strict pydantic models), a model's shape (`model_spec`:
`ModelSpec`, every linear layer of a family in one list, parameter counts), reading a Hugging Face config.json into
it (`architectures`), the presets (`presets`: one YAML file per model,
GPU and cluster), bytes per element by precision and optimizer (`precision`), how ZeRO, tensor, pipeline and
expert parallelism split tensors (`parallel`: ZeRO-1/2's flattened partitions and buckets), the input boundary
(`boundary`: bounded reads, strict JSON, one-line errors; `limits`: every bound), errors (`errors`), units and
their formatting (`units`), the two languages (`i18n`), the measurement record (`record`) and the one way to make
a variant of a scenario (`variant`).

May import nothing else of calc/ but calc.memo: every other wing builds on this one.
"""
