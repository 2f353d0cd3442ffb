"""The scenario contract's old import path, kept for scripts and notebooks: it lives in calc.contract.scenario."""

from calc.contract.scenario import (
    Attention,
    Checkpointing,
    HardwareConfig,
    LoraConfig,
    Mode,
    Offload,
    Optimizer,
    OptimizerImpl,
    Precision,
    Scenario,
    TrainingConfig,
)

__all__ = ["Attention", "Checkpointing", "HardwareConfig", "LoraConfig", "Mode", "Offload", "Optimizer",
           "OptimizerImpl", "Precision", "Scenario", "TrainingConfig"]
