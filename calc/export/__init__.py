"""The files that run a configuration: a scenario exported to the tools that train it, and a DeepSpeed config
read back into a scenario ("will my config fit?").

`deepspeed` writes ds_config.json with the buffer sizes the memory estimate assumes (and overlap_comm as the
speed model does), so the estimate, the speed and the config describe the same run; `hf` writes the Hugging Face
Trainer's TrainingArguments and train.py, and accelerate's config YAML; `bundle` puts them together with
launch.sh (the launch lines the Export page shows); `ds_import` turns a ds_config.json back into a Scenario; `torchtune` writes
the recipe config (torchtune.yaml) of a framework-torchtune scenario, `litgpt` the `litgpt finetune_*` command
line of a framework-litgpt one (bundle.framework_files). The
words in the generated files and notes speak the asked language; the JSON is the same in every language. The
command line that writes these files to disk is calc.cli.export.

May import calc.contract, calc.sim, calc.memory and calc.speed; never calc.recommend, calc.evidence or calc.cli.
"""

from calc.export.bundle import bundle_files, bundle_zip, export_bundle, framework_files, launch_lines, launch_script
from calc.export.deepspeed import DeepSpeedExport, ExportOptions, deepspeed_config, export_deepspeed
from calc.export.ds_import import DsImport, import_ds_config, scenario_from_ds_config
from calc.export.hf import accelerate_config, node_layout_problem, trainer_arguments, trainer_snippet

__all__ = ["DeepSpeedExport", "DsImport", "ExportOptions", "accelerate_config", "bundle_files", "bundle_zip",
           "deepspeed_config", "export_bundle", "export_deepspeed", "framework_files", "import_ds_config",
           "launch_lines", "launch_script", "node_layout_problem", "scenario_from_ds_config", "trainer_arguments",
           "trainer_snippet"]
