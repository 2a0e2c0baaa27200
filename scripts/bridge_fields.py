"""Write the ConfigContainer field names of a pinned Megatron-Bridge as JSON test data.

Reads the sources (not an installed Bridge: it cannot be imported without Transformer
Engine) from two git checkouts with ``git show REV:PATH``, parses each dataclass with
``ast`` and follows the base classes named in ``CLASSES``. The output lists, per
ConfigContainer section, every field a dotted path may name, Bridge's callback event names
and ``pretrain``'s parameters; tests/job/bridge/test_bridge_config.py checks every path and callback
hcp-tune uses against them. Usage::

    python scripts/bridge_fields.py BRIDGE_GIT MEGATRON_LM_GIT > tests/data/bridge_fields.json
"""
from __future__ import annotations

import ast
import json
import subprocess
import sys

BRIDGE_REV = "51885cf132b2814188b6855c25a8588254274c2a"  # Megatron-Bridge tag v0.6.0
MLM_REV = "cd4afffa648426a959dc7cb1e24b5ce7d0c3ff54"  # its 3rdparty/Megatron-LM submodule
BT = "src/megatron/bridge/training/config.py"
MTC = "megatron/training/config/training_config.py"
MCC = "megatron/training/config/common_config.py"
# key -> (which repository, path, class name, parent keys)
CLASSES = {
    "ConfigContainer": ("bridge", BT, "ConfigContainer", []),
    "GPTModelProvider": ("bridge", "src/megatron/bridge/models/gpt_provider.py",
                         "GPTModelProvider", ["TransformerConfig"]),
    "TransformerConfig": ("mlm", "megatron/core/transformer/transformer_config.py",
                          "TransformerConfig", ["ModelParallelConfig"]),
    "ModelParallelConfig": ("mlm", "megatron/core/model_parallel_config.py",
                            "ModelParallelConfig", []),
    "TrainingConfig": ("bridge", BT, "TrainingConfig", ["mlm.TrainingConfig"]),
    "mlm.TrainingConfig": ("mlm", MTC, "TrainingConfig", []),
    "ValidationConfig": ("mlm", MTC, "ValidationConfig", []),
    "SchedulerConfig": ("bridge", BT, "SchedulerConfig", ["mlm.SchedulerConfig"]),
    "mlm.SchedulerConfig": ("mlm", MTC, "SchedulerConfig", []),
    "LoggerConfig": ("bridge", BT, "LoggerConfig", ["mlm.LoggerConfig"]),
    "mlm.LoggerConfig": ("mlm", MTC, "LoggerConfig", []),
    "CheckpointConfig": ("bridge", BT, "CheckpointConfig", ["mlm.CheckpointConfig"]),
    "mlm.CheckpointConfig": ("mlm", MTC, "CheckpointConfig", []),
    "DistributedInitConfig": ("bridge", BT, "DistributedInitConfig",
                              ["mlm.DistributedInitConfig"]),
    "mlm.DistributedInitConfig": ("mlm", MCC, "DistributedInitConfig", []),
    "RNGConfig": ("mlm", MCC, "RNGConfig", []),
    "OptimizerConfig": ("bridge", BT, "OptimizerConfig", ["mcore.OptimizerConfig"]),
    "mcore.OptimizerConfig": ("mlm", "megatron/core/optimizer/optimizer_config.py",
                              "OptimizerConfig", []),
    "DistributedDataParallelConfig": ("bridge", BT, "DistributedDataParallelConfig",
                                      ["mcore.DDPConfig"]),
    "mcore.DDPConfig": ("mlm", "megatron/core/distributed/distributed_data_parallel_config.py",
                        "DistributedDataParallelConfig", []),
    "MockGPTDatasetConfig": ("bridge", BT, "MockGPTDatasetConfig", ["GPTDatasetConfig"]),
    "GPTDatasetConfig": ("bridge", BT, "GPTDatasetConfig",
                         ["mcore.GPTDatasetConfig", "DataloaderConfig"]),
    "mcore.GPTDatasetConfig": ("mlm", "megatron/core/datasets/gpt_dataset.py",
                               "GPTDatasetConfig", ["BlendedMegatronDatasetConfig"]),
    "BlendedMegatronDatasetConfig": ("mlm",
                                     "megatron/core/datasets/blended_megatron_dataset_config.py",
                                     "BlendedMegatronDatasetConfig", []),
    "DataloaderConfig": ("bridge", "src/megatron/bridge/data/base.py", "DataloaderConfig", []),
    "TokenizerConfig": ("bridge", "src/megatron/bridge/training/tokenizers/config.py",
                        "TokenizerConfig", ["mlm.TokenizerConfig"]),
    "mlm.TokenizerConfig": ("mlm", MTC, "TokenizerConfig", []),
}
SECTIONS = {  # ConfigContainer section -> the class hcp-tune puts there
    "model": "GPTModelProvider", "train": "TrainingConfig", "validation": "ValidationConfig",
    "optimizer": "OptimizerConfig", "scheduler": "SchedulerConfig",
    "dataset": "MockGPTDatasetConfig", "logger": "LoggerConfig", "tokenizer": "TokenizerConfig",
    "checkpoint": "CheckpointConfig", "dist": "DistributedInitConfig", "rng": "RNGConfig",
    "ddp": "DistributedDataParallelConfig",
}


def _fields(source: str, cls: str) -> list[str]:
    for node in ast.parse(source).body:
        if isinstance(node, ast.ClassDef) and node.name == cls:
            return [s.target.id for s in node.body
                    if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)
                    and "ClassVar" not in ast.unparse(s.annotation)]
    raise SystemExit(f"class {cls} not found")


def main(bridge_dir: str, mlm_dir: str) -> None:
    repos = {"bridge": (bridge_dir, BRIDGE_REV), "mlm": (mlm_dir, MLM_REV)}

    def all_fields(key: str) -> set[str]:
        repo, path, cls, parents = CLASSES[key]
        git_dir, rev = repos[repo]
        text = subprocess.run(["git", "-C", git_dir, "show", f"{rev}:{path}"],
                              capture_output=True, text=True, check=True).stdout
        out = set(_fields(text, cls))
        for p in parents:
            out |= all_fields(p)
        return out

    def bridge_source(path: str) -> str:
        return subprocess.run(["git", "-C", bridge_dir, "show", f"{BRIDGE_REV}:{path}"],
                              capture_output=True, text=True, check=True).stdout

    events: list[str] = []  # callbacks.py: VALID_EVENTS = frozenset({...})
    for node in ast.parse(bridge_source("src/megatron/bridge/training/callbacks.py")).body:
        target = getattr(node, "target", None) or (getattr(node, "targets", None) or [None])[0]
        if isinstance(target, ast.Name) and target.id == "VALID_EVENTS":
            events = sorted(c.value for c in ast.walk(node.value) if isinstance(c, ast.Constant))
    pretrain_args: list[str] = []  # pretrain.py: def pretrain(config, forward_step_func, ...)
    for node in ast.parse(bridge_source("src/megatron/bridge/training/pretrain.py")).body:
        if isinstance(node, ast.FunctionDef) and node.name == "pretrain":
            pretrain_args = [a.arg for a in node.args.args + node.args.kwonlyargs]
    data = {"bridge": f"Megatron-Bridge v0.6.0 {BRIDGE_REV}",
            "megatron_lm": f"Megatron-LM {MLM_REV} (Bridge v0.6.0's 3rdparty/Megatron-LM)",
            "container": sorted(all_fields("ConfigContainer")),
            "sections": {s: sorted(all_fields(c)) for s, c in SECTIONS.items()},
            "callback_events": events, "pretrain_args": pretrain_args}
    json.dump(data, sys.stdout, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main(*sys.argv[1:3])
