"""Exports of a scenario to the tools that run it: DeepSpeed (ds_config.json), the Hugging Face Trainer
(TrainingArguments kwargs + train.py) and accelerate (config YAML), bundled with launch.sh; and the import of a ds_config
back into a Scenario ("will my config fit?")."""

from calc.export.bundle import export_bundle, launch_lines, launch_script
from calc.export.deepspeed import DeepSpeedExport, ExportOptions, deepspeed_config, export_deepspeed
from calc.export.ds_import import scenario_from_ds_config
from calc.export.hf import accelerate_config, trainer_arguments, trainer_snippet

__all__ = ["DeepSpeedExport", "ExportOptions", "accelerate_config", "deepspeed_config", "export_bundle",
           "export_deepspeed", "launch_lines", "launch_script", "scenario_from_ds_config", "trainer_arguments",
           "trainer_snippet"]
