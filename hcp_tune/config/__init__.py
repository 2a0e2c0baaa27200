"""Configuration: this module is the one loader; its submodules are the typed groups
(``settings``, ``schema``), the cluster and model profiles and Bridge's recipes. Imports
``upstream`` (rules checked at load) and the contract; nothing above it.

Compose ``conf/`` with Hydra's compose API and turn it into a typed ``SweepConfig``.

Everything Hydra can throw at a user (unknown group option, unknown key, malformed
override) is translated here into one ``ConfigError`` line that names the override and
what is expected. Every group then becomes its typed dataclass through the one schema layer
(``schema.from_mapping``; the groups are in settings.py, cluster.py and model.py).
"""
from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Optional

from hcp_tune.config.cluster import ClusterProfile, cluster_from_mapping
from hcp_tune.config.model import ModelSpec, model_from_mapping
from hcp_tune.config.recipes import recipe_for, recipe_named
from hcp_tune.config.schema import from_mapping
from hcp_tune.config.settings import (
    DataConfig,
    ExecutorConfig,
    RunnerConfig,
    SearchConfig,
    TopLevel,
)
from hcp_tune.errors import ConfigError, InputFileError
from hcp_tune.packing import LengthMix, MixError, load_mix
from hcp_tune.redact import redact
from hcp_tune.upstream.pipeline import Recompute
from hcp_tune.upstream.rules import BY_ID, Facts, evaluate

PKG_DIR = Path(__file__).resolve().parents[1]  # hcp_tune/: the wheel keeps conf/ and sweeps/ there
REPO_ROOT = PKG_DIR.parent
# Where conf/ and sweeps/ are: an installed wheel carries them as hcp_tune/conf and
# hcp_tune/sweeps (pyproject's package-dir mapping; pip always unpacks wheels to files, so
# a path is enough and Hydra's pkg:// source, which needs __init__.py in every folder, is
# not); a source checkout or an editable install has them beside the package.
DATA_ROOT = PKG_DIR if (PKG_DIR / "conf" / "config.yaml").is_file() else REPO_ROOT
# An empty variable counts as unset (``HCP_TUNE_CONF_DIR= hcp-tune plan`` sets it to "").
CONF_DIR = Path(os.path.abspath(os.environ.get("HCP_TUNE_CONF_DIR") or DATA_ROOT / "conf"))
GROUPS = ("cluster", "model", "runner", "executor", "search", "sweeps")


def search_dirs() -> list[Path]:
    """Extra config roots: ``HCP_TUNE_CONFIG_PATH`` (os.pathsep-separated), then the folder
    holding ``sweeps/`` (the ``sweeps`` group). A user's profile in
    ``<dir>/cluster/NAME.yaml`` becomes ``cluster=NAME``."""
    extra = [Path(p) for p in os.environ.get("HCP_TUNE_CONFIG_PATH", "").split(os.pathsep) if p]
    return [*extra, DATA_ROOT]


def group_options(group: str) -> list[str]:
    roots = [CONF_DIR, *search_dirs()]
    names = {p.stem for r in roots for p in (r / group).glob("*.yaml")}
    return sorted(names)


def _translate(exc: Exception, overrides: list[str]) -> ConfigError:
    """One line for a Hydra exception, naming the user's override, or the file at fault."""
    broken = _broken_file(exc)
    if broken:
        return ConfigError(broken)
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
    bad, first = _bad_override(overrides)
    if bad is None:
        first = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
    return ConfigError(_malformed(bad, first))


def _malformed(bad: Optional[str], why: str) -> str:
    """The line for a malformed override: that override alone (redacted) and how to quote
    a value Hydra cannot read bare."""
    key, _, value = (bad or "").partition("=")
    if bad and value[:1] not in "[{'\"":
        fix = (f"a value holding '=', '&', ',', spaces or brackets is quoted: {key}='{value}' "
               f"(in a shell: \"{key}='{value}'\")")
    else:
        fix = "e.g. cp=8 seq=[65536,131072] cluster=dgx-h100"
    return redact(f"malformed override {bad or 'on the command line'!r}: {why}; expected "
                  f"KEY=VALUE in Hydra syntax; {fix}")


def _bad_override(overrides: list[str]) -> tuple[Optional[str], str]:
    """The first override Hydra's grammar refuses on its own, with the parser's first
    line; (None, '') when each parses alone."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    for o in overrides:
        try:
            parser.parse_override(o)
        except Exception as e:  # Hydra's exception types vary by version
            lines = str(e).strip().splitlines()
            return o, lines[0] if lines else type(e).__name__
    return None, ""


def quoted_urls(overrides: list[str]) -> list[str]:
    """Each override whose value is a URL (``search.storage=postgresql://u@h/db?
    sslmode=require``) with that value single-quoted for Hydra, as a user writes it: a
    query string's '?', '&' and '=' need no quoting by hand. A value already quoted, a
    list or one holding a quote or a backslash is left as it is."""
    out = []
    for o in overrides:
        key, sep, value = o.partition("=")
        if (sep and "://" in value and value[:1] not in "'\"[{"
                and not any(c in value for c in "'\"\\")):
            o = f"{key}='{value}'"
        out.append(o)
    return out


def option_file(group: str, name: str) -> Optional[Path]:
    """The file that option ``group=name`` comes from (conf/ first, then the search path)."""
    return next((p for r in (CONF_DIR, *search_dirs()) if (p := r / group / f"{name}.yaml")
                 .is_file()), None)


def _at_line(problem: str, group: str, option: str, path: Path, overrides: list[str]) -> str:
    """``problem`` ending ``(in group/option.yaml)`` with the path and the key's line, or
    with ``given on the command line`` when an override set that key."""
    m = re.match(rf"{group}\.(\w+)", problem)
    if m and any(o.lstrip("+").startswith(f"{group}.{m.group(1)}=") for o in overrides):
        return problem.replace(f"(in {group}/{option}.yaml)", "(given on the command line)")
    lines = path.read_text(errors="replace").splitlines()
    found = next((i for i, ln in enumerate(lines) if m and re.match(rf"{m.group(1)}\s*:", ln)),
                 None)
    where = f"{path}:{found + 1}" if found is not None else str(path)
    return problem.replace(f"(in {group}/{option}.yaml)", f"(in {where})")


def _broken_file(exc: BaseException) -> str:
    """A YAML file Hydra could not parse (a profile, a preset, conf/), as ``path:line:
    the problem``; '' when the exception is not about a file."""
    import yaml

    seen = 0
    while exc is not None and seen < 8:
        mark = getattr(exc, "problem_mark", None)
        if isinstance(exc, yaml.MarkedYAMLError) and mark is not None:
            where = mark.name if os.path.isfile(mark.name) else "a config file"
            problem = " ".join(str(exc.problem or exc.context or "not valid YAML").split())
            return (f"{where}:{mark.line + 1}:{mark.column + 1}: not valid YAML ({problem}); "
                    "fix that file (the command line's overrides are not at fault)")
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return ""


def top_level_keys() -> list[str]:
    import yaml

    data = yaml.safe_load((CONF_DIR / "config.yaml").read_text())
    return [k for k in data if k != "defaults"]


def compose(overrides: list[str]) -> Any:
    """The composed DictConfig for ``overrides`` (Hydra syntax), or a ``ConfigError``."""
    for o in overrides:
        if "=" not in o or not o.split("=", 1)[0].strip():
            raise ConfigError(redact(
                f"malformed override {o!r}: expected KEY=VALUE, e.g. cp=8 or seq=[65536,131072]"
            ))
    overrides = quoted_urls(overrides)
    if not (CONF_DIR / "config.yaml").is_file():  # the environment's fault, not the overrides'
        raise ConfigError(
            f"HCP_TUNE_CONF_DIR={os.environ.get('HCP_TUNE_CONF_DIR', '')!r}: no config.yaml in "
            f"{CONF_DIR}; expected a folder laid out like hcp-tune's conf/ (or unset it)")
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
    """The composed, validated configuration every subcommand works from. Every field is
    typed and checked at load (``schema.from_mapping``); defaults are in conf/ only."""

    cluster: ClusterProfile
    model: ModelSpec
    cp: int
    seqs: tuple[int, ...]
    tps: tuple[int, ...]
    dp: int
    mbs: int
    dtype: Literal["bf16", "fp16", "fp32"]
    drop_cross_node_a2a: bool
    format: Literal["table", "json"]
    results_dir: Path
    env_tag: str
    runner: RunnerConfig
    executor: ExecutorConfig
    search: SearchConfig
    pp: int = 1  # pipeline stages (the world is tp*cp*dp*pp)
    gbs: int = 0  # sequences per global batch; load() fills it (0 here: mbs*dp)
    recompute: Recompute = Recompute()
    recipe_note: str = ""  # which Bridge recipe chose tp/pp, or why none did ("" when given)
    data: DataConfig = DataConfig(packing="off", lengths=None)
    mixes: tuple[tuple[int, LengthMix], ...] = ()  # data.packing=thd: (seq, its mix) per seq

    def mix_at(self, seq: int) -> Optional[LengthMix]:
        """The length mix packed into ``seq`` tokens; None with one document a sequence."""
        return dict(self.mixes).get(seq)

    @property
    def micro_batches(self) -> int:
        """Pipeline micro-batches per step: gbs / (mbs*dp) (Megatron's calculator)."""
        return max(1, (self.gbs or self.mbs * self.dp) // (self.mbs * self.dp))

    def __post_init__(self) -> None:
        problems = []
        for tp in self.tps:
            facts = Facts(tp=tp, heads=self.model.heads, kv_heads=self.model.kv_heads)
            problems += [f"tp={tp}: {f.text} (model={self.model.name})"
                         for f in evaluate(facts, (BY_ID["heads-tp"],))]
        bad = [a for a in self.search.a2a_sizes or () if self.cp % a]
        if bad:
            divisors = [d for d in range(1, self.cp + 1) if self.cp % d == 0]
            problems.append(
                f"search.a2a_sizes={list(self.search.a2a_sizes)}: {', '.join(map(str, bad))} "
                f"does not divide cp={self.cp}; expected a list of divisors of cp: "
                f"{', '.join(map(str, divisors))}")
        if (self.runner.name == "bridge" and self.dtype == "fp32" and self.cp > 1
                and self.cluster.device == "cuda"):
            problems.append(
                f"dtype=fp32 with runner=bridge on cluster={self.cluster.name} (a GPU profile): "
                "Transformer Engine turns its flash and fused attention off in fp32 and its "
                "unfused attention has no context parallelism, so no backend can run cp="
                f"{self.cp}; use dtype=bf16 (Bridge's bf16_mixed) or dtype=fp16")
        if problems:
            raise ConfigError("\n".join(problems))


def _group(node: Any) -> Any:
    from omegaconf import DictConfig, ListConfig, OmegaConf

    if isinstance(node, (DictConfig, ListConfig)):
        return OmegaConf.to_container(node, resolve=True)
    return node


def no_such_folder(path: Path, key: str = "results_dir") -> str:
    """The one wording, in every command, for a results folder that does not exist."""
    return f"{key}={path}: no such folder; give the folder a sweep wrote ({key}=PATH)"


def existing_dir(path: Path, key: str = "results_dir") -> Path:
    """``path`` when it is a folder, else one InputFileError line (``no_such_folder``)."""
    if not Path(path).is_dir():
        raise InputFileError(no_such_folder(path, key))
    return Path(path)


def writable_dir(path: Path, key: str = "results_dir") -> Path:
    """``path`` created if needed and proven writable (a file made and removed), or one
    ConfigError line naming ``key``: before a command that writes there starts anything."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".hcp-tune-write-check-{os.getpid()}"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise ConfigError(
            f"{key}={str(path)!r}: cannot write there ({exc.strerror or exc}); expected a "
            "folder this user can create and write, e.g. results_dir=results") from None
    return path


def absolute_path(value: Any) -> Path:
    """``value`` as an absolute path, against the current directory *now* (``~`` expanded).

    Paths are resolved once, when the config is loaded: trials run in their own folders
    (local ranks) or on other nodes (SLURM), where a relative path means something else.
    """
    return Path(os.path.abspath(os.path.expanduser(str(value))))


def results_dir_override(cfg: Any) -> Optional[str]:
    """``cfg.results_dir`` as a command's override needs it: None when it is the default
    (``results`` under the current directory), else the absolute folder."""
    return None if cfg.results_dir == absolute_path("results") else str(cfg.results_dir)


def _parallel_sizes(t: TopLevel, model: str, recipe: Optional[str] = None
                    ) -> tuple[tuple[int, ...], int, int, str]:
    """(tps, pp, gbs, note): what the user gave, else the recipe ``runner.recipe`` names,
    else Bridge's recipe for the model at each seq (recipes.py), else tp=1 pp=1; gbs null
    is the recipe's, else mbs*dp. A ``pp=`` the user gives wins over the recipe's: the
    world and the planned groups are built from it, and the job sets it on the recipe."""
    named = recipe_named(recipe)
    found = [named] if named else [r for s in t.seq if (r := recipe_for(model, s))]
    tps = t.tp or tuple(dict.fromkeys(r.tp for r in found)) or (1,)
    pp = t.pp or max((r.pp for r in found), default=1)
    gbs = t.gbs or (found[0].gbs if found else t.mbs * t.dp)
    if gbs % (t.mbs * t.dp):
        gbs = t.mbs * t.dp * max(1, gbs // (t.mbs * t.dp))
    note = ""
    if named and t.pp is not None and t.pp != named.pp:
        note = (f"pp={t.pp} (given) wins over runner.recipe={recipe}'s pp={named.pp}: the "
                f"world and the planned groups are built from it and the job sets it on the "
                f"recipe ({named.cite})")
    elif t.tp is None or t.pp is None:
        chosen = " ".join(f"{k}={v}" for k, v, given in (
            ("tp", ",".join(map(str, tps)), t.tp), ("pp", pp, t.pp)) if given is None)
        if found:
            note = (f"{chosen} follow Bridge's recipe for model={model} seq="
                    f"{','.join(str(s) for s in t.seq)}: "
                    + "; ".join(dict.fromkeys(r.cite for r in found))
                    + " (give tp=/pp= to choose)")
        else:
            note = (f"{chosen}: Bridge has no long-context recipe for model={model} at seq="
                    f"{','.join(map(str, t.seq))} (give tp=/pp= to choose)")
    return tps, pp, gbs, note


def _mixes(data: DataConfig, seqs: tuple[int, ...]) -> tuple[tuple[int, LengthMix], ...]:
    """Each seq's length mix (a file read once, relative to the current folder), or one
    InputFileError line: an empty, negative or non-numeric file, a document longer than
    seq, an unknown preset."""
    if data.packing != "thd" or not data.lengths:
        return ()
    try:
        return tuple((s, load_mix(data.lengths, s, base=Path.cwd())) for s in seqs)
    except MixError as exc:
        raise InputFileError(str(exc)) from None


def load(overrides: list[str]) -> SweepConfig:
    """Compose, then build every group's typed dataclass; all problems reported together."""
    cfg = compose(overrides)
    choices = dict(cfg.hydra.runtime.choices)  # group -> selected option name
    problems: list[str] = []
    values: dict[str, Any] = {}

    def check(name: str, fn, *args) -> None:
        try:
            values[name] = fn(*args)
        except ConfigError as exc:
            text, option = str(exc), choices.get(name)
            path = option_file(name, option) if option else None
            if path:  # name the file as it is on disk, and the key's line in it
                text = "\n".join(_at_line(ln, name, option, path, overrides)
                                 for ln in text.splitlines())
            problems.append(text)

    top = {f.name: _group(cfg[f.name]) for f in dataclasses.fields(TopLevel)}
    check("top", from_mapping, TopLevel, top, "")
    check("cluster", cluster_from_mapping, _group(cfg.cluster), choices["cluster"])
    check("model", model_from_mapping, _group(cfg.model), choices["model"])
    for name, cls in (("runner", RunnerConfig), ("executor", ExecutorConfig),
                      ("search", SearchConfig)):
        check(name, from_mapping, cls, _group(cfg[name]), name)
    check("data", DataConfig.from_mapping, _group(cfg.get("data")))
    if problems:
        raise ConfigError("\n".join(problems))
    t: TopLevel = values.pop("top")
    values["mixes"] = _mixes(values["data"], t.seq)
    tps, pp, gbs, note = _parallel_sizes(t, values["model"].name, values["runner"].recipe)
    search, executor = values.pop("search"), values.pop("executor")
    if search.storage and "://" not in search.storage:  # a journal file, not an RDB URL
        search = dataclasses.replace(search, storage=str(absolute_path(search.storage)))
    if executor.folder:
        executor = dataclasses.replace(executor, folder=str(absolute_path(executor.folder)))
    return SweepConfig(
        **values, cp=t.cp, seqs=t.seq, tps=tps, pp=pp, gbs=gbs, dp=t.dp, mbs=t.mbs,
        dtype=t.dtype, recipe_note=note,
        recompute=Recompute(t.recompute, t.recompute_method, t.recompute_num_layers),
        drop_cross_node_a2a=t.drop_cross_node_a2a, format=t.format,
        results_dir=absolute_path(t.results_dir), env_tag=t.env_tag,
        search=search, executor=executor,
    )
