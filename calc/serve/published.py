"""Published vLLM start-up logs (data/published_vllm.yaml) against calc.serve's prediction.

Each log states its model, GPU, version and flags; the figures it printed are compared with what calc.serve
predicts for the same settings: the weights ("Model loading took"), and, from the KV cache memory the log itself
reports, the KV cache tokens, the concurrency, the KV cache one request needs and whether it starts. The budget
before the KV cache (activations, non-torch memory) is not compared here: most logs do not state every flag it
depends on, and the V0 engine of the older logs profiled differently.
"""

from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field

from calc.contract.presets import model_presets
from calc.contract.scenario import InferenceWeights, Scenario
from calc.contract.units import GiB
from calc.serve import budget, kv_cache
from calc.serve.plan import layer_specs

DATA = Path(__file__).resolve().parents[2] / "data" / "published_vllm.yaml"
MAX_DATA_BYTES = 1 << 20  # the committed file is a few kB


class Logged(BaseModel):
    """The figures a log printed (GiB as printed; tokens; requests)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    weights_gib: float | None = None
    available_gib: float | None = None
    kv_tokens: int | None = None
    concurrency: float | None = None
    needed_gib: float | None = None
    starts: bool | None = None


class PublishedLog(BaseModel):
    """One published start-up log and the settings it states."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str
    source: str
    note: str
    vllm_version: str
    gpu: str
    gpu_preset: str | None = None  # the GPU preset the log's card is, where the weights depend on its architecture
    model: str
    weights: InferenceWeights
    quantization_config: dict[str, object] | None = None  # the checkpoint's, where it keeps modules 16-bit
    tensor_parallel: int = Field(ge=1)
    max_model_len: int = Field(ge=1)
    gpu_memory_utilization: float = Field(gt=0, le=1)
    logged: Logged

    def scenario(self) -> Scenario:
        """The log's settings as a serving scenario: the preset, or its config with the checkpoint's
        quantization_config; the named GPU preset, else a card large enough for any figure compared here."""
        tp = self.tensor_parallel
        model: str | dict[str, object] = self.model
        if self.quantization_config is not None:
            model = {**model_presets()[self.model].config, "quantization_config": self.quantization_config}
        hardware = ({"gpu": self.gpu_preset, "num_gpus": tp} if self.gpu_preset
                    else {"memory_bytes": 2**40, "num_gpus": tp})
        return Scenario.model_validate({
            "model": model, "mode": "serve", "inference": {"weights": self.weights},
            "hardware": hardware,
            "serving": {"tensor_parallel": tp, "max_model_len": self.max_model_len,
                        "gpu_memory_utilization": self.gpu_memory_utilization}})


class Comparison(BaseModel):
    """One logged figure beside its prediction."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    log: str
    figure: str
    logged: float
    predicted: float

    @property
    def error(self) -> float:
        """(predicted - logged) / logged; 0 for a yes/no figure that agrees, 1 for one that does not."""
        if self.figure == "starts":
            return float(self.logged != self.predicted)
        return (self.predicted - self.logged) / self.logged


def published_logs() -> list[PublishedLog]:
    text = DATA.read_bytes()[:MAX_DATA_BYTES].decode()
    return [PublishedLog.model_validate(item) for item in yaml.safe_load(text)["logs"]]


def compare(log: PublishedLog) -> list[Comparison]:
    """Every figure the log printed beside calc.serve's prediction for the same settings."""
    sc = log.scenario()
    serving = sc.serving
    assert serving is not None
    got, out = log.logged, []

    def add(figure: str, logged: float, predicted: float) -> None:
        out.append(Comparison(log=log.id, figure=figure, logged=logged, predicted=predicted))

    if got.weights_gib is not None:
        add("weights_gib", got.weights_gib, budget.weights_bytes(sc, log.tensor_parallel) / GiB)
    layers = layer_specs(sc, serving)
    groups = kv_cache.kv_groups(layers)
    bs, length = serving.block_size, log.max_model_len
    tokens = budget.batch_limits(serving, 0, "", length)[0]  # only the sliding-window specs read it
    if got.needed_gib is not None:
        add("needed_gib", got.needed_gib, kv_cache.needed_bytes(layers, bs, length, tokens) / GiB)
    available = None if got.available_gib is None else int(got.available_gib * GiB)
    blocks = (kv_cache.num_blocks(groups, bs, available) if available is not None
              else None if got.kv_tokens is None else got.kv_tokens // bs * len(groups.specs))
    if got.kv_tokens is not None and available is not None and blocks is not None:
        add("kv_tokens", got.kv_tokens, kv_cache.kv_cache_tokens(groups, bs, blocks))
    if got.concurrency is not None and blocks is not None:
        add("concurrency", got.concurrency, round(kv_cache.max_concurrency(groups, bs, blocks, length, tokens), 2))
    if got.starts is not None and available is not None:
        add("starts", float(got.starts), float(kv_cache.needed_bytes(layers, bs, length, tokens) <= available))
    return out
