"""Compose ``conf/`` with Hydra's compose API and turn it into a typed ``SweepConfig``.

Everything Hydra can throw at a user (unknown group option, unknown key, malformed
override) is translated here into one ``ConfigError`` line that names the override and
what is expected. Value checks that need several keys live in ``SweepConfig.__post_init__``.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from hcp_tune.cluster import ClusterProfile, cluster_from_mapping
from hcp_tune.errors import ConfigError
from hcp_tune.model import ModelSpec, model_from_mapping
from hcp_tune.schema import as_int, as_int_list

REPO_ROOT = Path(__file__).resolve().parent.parent
CONF_DIR = Path(os.environ.get("HCP_TUNE_CONF_DIR", REPO_ROOT / "conf"))
GROUPS = ("cluster", "model", "runner", "executor", "search", "sweeps")
DTYPES = ("bf16", "fp16", "fp32")
FORMATS = ("table", "json")


def search_dirs() -> list[Path]:
    """Extra config roots: ``HCP_TUNE_CONFIG_PATH`` (os.pathsep-separated), then the repo
    root so that ``sweeps/`` is the ``sweeps`` group. A user's profile in
    ``<dir>/cluster/NAME.yaml`` becomes ``cluster=NAME``."""
    extra = [Path(p) for p in os.environ.get("HCP_TUNE_CONFIG_PATH", "").split(os.pathsep) if p]
    return [*extra, REPO_ROOT]


def group_options(group: str) -> list[str]:
    roots = [CONF_DIR, *search_dirs()]
    names = {p.stem for r in roots for p in (r / group).glob("*.yaml")}
    return sorted(names)


def _translate(exc: Exception, overrides: list[str]) -> ConfigError:
    """One line for a Hydra exception, naming the user's override."""
    text = str(exc)
    m = re.search(r"Could not find '([\w.-]+)/([^']+)'", text)
    if m:
        group, name = m.groups()
        options = ", ".join(group_options(group)) or "none"
        where = "sweeps/" if group == "sweeps" else f"conf/{group}/"
        return ConfigError(
            f"{group}={name}: unknown {group} option; expected one of: {options} "
            f"(or add {where}{name}.yaml)"
        )
    m = re.search(r"Could not override '([^']+)'", text) or re.search(
        r"Key '([^']+)' is not in struct", text
    )
    if m:
        key = m.group(1)
        return ConfigError(
            f"{key}: unknown key; expected one of: {', '.join(top_level_keys())} "
            f"or a group ({', '.join(GROUPS)})"
        )
    bad = next((o for o in overrides if o.split("=", 1)[0].strip() and o in text), None)
    first = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
    return ConfigError(
        f"malformed override {bad or ' '.join(overrides)!r}: {first}; "
        "expected KEY=VALUE in Hydra syntax, e.g. cp=8 seq=[65536,131072] cluster=dgx-h100"
    )


def top_level_keys() -> list[str]:
    import yaml

    data = yaml.safe_load((CONF_DIR / "config.yaml").read_text())
    return [k for k in data if k != "defaults"]


def compose(overrides: list[str]) -> Any:
    """The composed DictConfig for ``overrides`` (Hydra syntax), or a ``ConfigError``."""
    for o in overrides:
        if "=" not in o or not o.split("=", 1)[0].strip():
            raise ConfigError(
                f"malformed override {o!r}: expected KEY=VALUE, e.g. cp=8 or seq=[65536,131072]"
            )
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    searchpath = ",".join(f"file://{d}" for d in search_dirs())
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
            return hydra_compose(
                "config",
                overrides=[f"hydra.searchpath=[{searchpath}]", *overrides],
                return_hydra_config=True,
            )
    except ConfigError:
        raise
    except Exception as exc:  # Hydra's exception types vary by version: translate all
        raise _translate(exc, overrides) from None
    finally:
        GlobalHydra.instance().clear()


@dataclass(frozen=True, kw_only=True)
class SweepConfig:
    """The composed, validated configuration every subcommand works from."""

    cluster: ClusterProfile
    model: ModelSpec
    cp: int
    seqs: tuple[int, ...]
    tps: tuple[int, ...]
    dp: int = 1
    mbs: int = 1
    dtype: Literal["bf16", "fp16", "fp32"] = "bf16"
    drop_cross_node_a2a: bool = False
    format: Literal["table", "json"] = "table"
    results_dir: Path = Path("results")
    env_tag: str = "default"
    runner: dict = field(default_factory=dict)
    executor: dict = field(default_factory=dict)
    search: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        problems = []
        for tp in self.tps:
            if self.model.heads % tp or self.model.kv_heads % tp:
                problems.append(
                    f"tp={tp}: must divide the model's heads ({self.model.heads}) and "
                    f"kv_heads ({self.model.kv_heads}) of model={self.model.name}; "
                    f"valid tp values: {_divisors_of_both(self.model.heads, self.model.kv_heads)}"
                )
        if problems:
            raise ConfigError("\n".join(problems))


def _divisors_of_both(a: int, b: int) -> str:
    return ", ".join(str(d) for d in range(1, min(a, b) + 1) if a % d == 0 and b % d == 0)


def _choice(value: Any, key: str, choices: tuple[str, ...]) -> Any:
    if value not in choices:
        raise ConfigError(f"{key}={value!r}: expected one of {', '.join(choices)}")
    return value


def _bool(value: Any, key: str) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{key}={value!r}: expected true or false")
    return value


def _plain(node: Any) -> Any:
    from omegaconf import DictConfig, ListConfig, OmegaConf

    if isinstance(node, (DictConfig, ListConfig)):
        return OmegaConf.to_container(node, resolve=True)
    return node


def absolute_path(value: Any) -> Path:
    """``value`` as an absolute path, against the current directory *now* (``~`` expanded).

    Paths are resolved once, when the config is loaded: trials run in their own folders
    (local ranks) or on other nodes (SLURM), where a relative path means something else.
    """
    return Path(os.path.abspath(os.path.expanduser(str(value))))


def _resolve_paths(search: dict, executor: dict) -> tuple[dict, dict]:
    """``search.storage`` (when a file path, not an RDB URL) and ``executor.folder``,
    made absolute like ``results_dir``."""
    storage = search.get("storage")
    if isinstance(storage, str) and storage and "://" not in storage:
        search = {**search, "storage": str(absolute_path(storage))}
    folder = executor.get("folder")
    if isinstance(folder, str) and folder.strip():
        executor = {**executor, "folder": str(absolute_path(folder))}
    return search, executor


def load(overrides: list[str]) -> SweepConfig:
    """Compose and validate; every problem found is reported (one line each)."""
    cfg = compose(overrides)
    choices = dict(cfg.hydra.runtime.choices)  # group -> selected option name
    problems: list[str] = []
    values: dict[str, Any] = {}

    def check(name: str, fn, *args) -> None:
        try:
            values[name] = fn(*args)
        except ConfigError as exc:
            problems.append(str(exc))

    check("cluster", cluster_from_mapping, _plain(cfg.cluster), choices["cluster"])
    check("model", model_from_mapping, _plain(cfg.model), choices["model"])
    check("cp", as_int, _plain(cfg.cp), "cp")
    check("seqs", as_int_list, _plain(cfg.seq), "seq")
    check("tps", as_int_list, _plain(cfg.tp), "tp")
    check("dp", as_int, _plain(cfg.dp), "dp")
    check("mbs", as_int, _plain(cfg.mbs), "mbs")
    check("dtype", _choice, cfg.dtype, "dtype", DTYPES)
    check("format", _choice, cfg.format, "format", FORMATS)
    check("drop_cross_node_a2a", _bool, cfg.drop_cross_node_a2a, "drop_cross_node_a2a")
    if problems:
        raise ConfigError("\n".join(problems))
    search, executor = _resolve_paths(_plain(cfg.search), _plain(cfg.executor))
    return SweepConfig(
        **values,
        results_dir=absolute_path(cfg.results_dir),
        env_tag=str(cfg.env_tag),
        runner=_plain(cfg.runner),
        executor=executor,
        search=search,
    )
