"""The docs site's generated pages: a mkdocs hook (``hooks:`` in mkdocs.yml).

What belongs here: turning the code's own tables into Markdown pages at build time, so the
reference cannot drift from the code. Three kinds:

- ``reference/config-keys.md``: every config key of the typed groups
  (``hcp_tune/config/settings.py``, ``cluster.py``, ``model.py``), what it allows (the
  schema's own wording) and its default (read from ``conf/``);
- ``reference/rules-table.md``: the HCP rules table of ``hcp_tune/upstream/rules.py``;
- ``performance/*.md``: one page per ``benchmarks/RESULTS-*.md`` (copied as it is) and an
  index that says, for each, whether the script stamped it (date, commit, load).

Each of them is committed in ``docs/`` as a short stub that links to its source, so that a
link to it works when the docs are read in the repository too; the hook puts the generated
page in its place on the site. A stub that is missing or out of date fails the strict build
(and ``tests/test_docs_links.py``); ``python scripts/docs_pages.py --stubs`` writes them.
``python scripts/docs_pages.py OUT_DIR`` writes the generated pages into a folder (to look
at them without mkdocs). Imports only the standard library, PyYAML and hcp_tune.
"""
from __future__ import annotations

import dataclasses
import re
import sys
import typing
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

STAMP_FIELDS = ("command", "date", "commit", "load")


# ------------------------------------------------------------------ config keys
def _allowed(tp, meta) -> str:
    from hcp_tune.config.schema import _expected

    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Union and type(None) in args:
        rest = [a for a in args if a is not type(None)]
        inner = rest[0] if len(rest) == 1 else typing.Union[tuple(rest)]
        return "null or " + _allowed(inner, meta)
    if origin is tuple:
        return _allowed(args[0], meta) + ", or a list of them"
    if origin is typing.Union and "choices" in meta:
        return "one of " + ", ".join(meta["choices"]) + ", or a list of them"
    if origin is typing.Union:
        words = [w for a in args if typing.get_origin(a) is typing.Literal
                 for w in typing.get_args(a)]
        return " or ".join(words) + ", or " + _expected(int, meta)
    return _expected(tp, meta)


def _defaults(path: Path) -> dict:
    import yaml

    data = yaml.safe_load(path.read_text()) or {}
    return {k: v for k, v in data.items() if k != "defaults"}


def _yaml_text(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    return str(value).replace("|", "\\|")


def config_keys_page() -> str:
    from hcp_tune.config import cluster, model, settings

    groups = [
        ("top level", "", settings.TopLevel, _defaults(REPO / "conf" / "config.yaml")),
        ("runner", "runner.", settings.RunnerConfig, _defaults(REPO / "conf/runner/attention.yaml")),
        ("search", "search.", settings.SearchConfig, _defaults(REPO / "conf/search/default.yaml")),
        ("executor", "executor.", settings.ExecutorConfig, _defaults(REPO / "conf/executor/slurm.yaml")),
        ("cluster profile (a file `cluster/NAME.yaml`)", "", cluster.ClusterProfile, {}),
        ("model profile (a file `model/NAME.yaml`)", "", model.ModelSpec, {}),
    ]
    hints = {}
    out = ["# Config keys", "",
           "Generated from the typed config (`hcp_tune/config/settings.py`, `cluster.py`, "
           "`model.py`) when the site is built; defaults are read from `conf/` (the runner's "
           "from `conf/runner/attention.yaml`, the executor's from `conf/executor/slurm.yaml`, "
           "which `local` and `auto` start from). A value outside what a key allows stops "
           "every command with one line naming the key, exit 2.", ""]
    for title, prefix, cls, defaults in groups:
        hints = typing.get_type_hints(cls)
        out += [f"## {title}", "", "| key | allowed | default | what it is |", "|---|---|---|---|"]
        for f in dataclasses.fields(cls):
            if f.name == "name" and prefix:
                continue
            meta = dict(f.metadata)
            if f.name in defaults:
                default = f"`{_yaml_text(defaults[f.name])}`"
            elif f.default is not dataclasses.MISSING:
                default = f"`{_yaml_text(f.default)}`"
            else:
                default = "required" if not prefix and not defaults else "-"
            doc = meta.get("doc", "").replace("|", "\\|")
            allowed = _allowed(hints[f.name], meta).replace("|", "\\|")
            out.append(f"| `{prefix}{f.name}` | {allowed} | {default} | {doc} |")
        out.append("")
    return "\n".join(out)


# ------------------------------------------------------------------ rules
def rules_table_page() -> str:
    from hcp_tune.upstream.rules import RULES

    out = ["# Rules table", "",
           "Generated from `hcp_tune/upstream/rules.py` when the site is built: each rule's "
           "id, severity, where it is checked (L: `plan` on every candidate layout and "
           "`validate`; otherwise `validate` on a Bridge config), the Bridge fields it "
           "reads, what it means and where upstream enforces it. The guide to the rules is "
           "[The HCP rules](rules.md).", "",
           "| id | severity | checked by | reads | what it means | upstream source |",
           "|---|---|---|---|---|---|"]
    for r in RULES:
        reads = ", ".join(f"`{k}`" for k in r.reads)
        cells = [f"`{r.id}`", r.severity, "L" if r.layout else "validate", reads, r.means,
                 r.source]
        out.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(out) + "\n"


# ------------------------------------------------------------------ performance
def stamp_of(text: str) -> dict:
    """The stamp block a benchmark script writes (``benchmarks/stamp.py``), or {}."""
    m = re.search(r"<!-- stamp\n(.*?)\n-->", text, flags=re.S)
    if not m:
        return {}
    return dict(line.split(": ", 1) for line in m.group(1).splitlines() if ": " in line)


def performance_pages() -> dict[str, str]:
    pages, rows = {}, []
    for path in sorted((REPO / "benchmarks").glob("RESULTS-*.md")):
        name = path.stem.removeprefix("RESULTS-")
        text = path.read_text()
        title = next((l.lstrip("# ").strip() for l in text.splitlines() if l.startswith("#")),
                     name)
        stamp = stamp_of(text)
        if stamp:
            when = f"{stamp.get('date', '?')}, commit `{stamp.get('commit', '?')}`, load {stamp.get('load', '?')}"
        else:
            when = "**not stamped** (no date, commit or load recorded by its script)"
        rows.append(f"| [{title}]({name}.md) | `benchmarks/{path.name}` | {when} |")
        body = re.sub(r"<!-- stamp\n.*?\n-->\n?", "", text, flags=re.S)
        # links written relative to benchmarks/: to the docs pages and to other results files
        body = body.replace("](../docs/", "](../").replace("](RESULTS-", "](")
        head = (f"*Copied from `benchmarks/{path.name}` when the site was built. "
                + (f"Stamp: `{stamp.get('command', '?')}` on {when}.*" if stamp else
                   "This file carries no stamp: treat its figures as unverified.*"))
        if not body.lstrip().startswith("#"):
            body = f"# {title}\n\n{body}"
        first, _, rest = body.lstrip().partition("\n")
        pages[f"performance/{name}.md"] = f"{first}\n\n{head}\n{rest}"
    index = ["# Performance", "",
             "Every figure of these pages is in a results file under `benchmarks/`, written "
             "by the script named in it; this page is generated from those files when the site "
             "is built. All were measured on this project's 2-core, no-GPU development "
             "machine, shared with other work: compare rows of one run, not runs. A script "
             "that uses `benchmarks/stamp.py` writes a stamp (command, date, commit, load "
             "average); a file without one says so below.", "",
             "| results | file | stamp |", "|---|---|---|", *rows, ""]
    pages["performance/index.md"] = "\n".join(index)
    return pages


def all_pages() -> dict[str, str]:
    return {"reference/config-keys.md": config_keys_page(),
            "reference/rules-table.md": rules_table_page(), **performance_pages()}


# ------------------------------------------------------------------ stubs in docs/
STUB_MARK = "<!-- a stub: scripts/docs_pages.py puts the generated page here on the site -->"


def _sources(path: str) -> list[str]:
    """The repository files a generated page is made from (relative to the repo root)."""
    if path == "reference/config-keys.md":
        return ["hcp_tune/config/settings.py", "hcp_tune/config/cluster.py",
                "hcp_tune/config/model.py", "conf/config.yaml"]
    if path == "reference/rules-table.md":
        return ["hcp_tune/upstream/rules.py"]
    if path == "performance/index.md":
        return [f"benchmarks/{p.name}" for p in sorted((REPO / "benchmarks").glob("RESULTS-*.md"))]
    return [f"benchmarks/RESULTS-{Path(path).stem}.md"]


def stub_pages(pages: dict[str, str] | None = None) -> dict[str, str]:
    """What ``docs/`` holds for each generated page: its title and links to its sources
    (which exist in the repository; the site shows the generated page instead)."""
    stubs = {}
    for path, content in (pages or all_pages()).items():
        title = next((ln.lstrip("# ").strip() for ln in content.splitlines()
                      if ln.startswith("# ")), Path(path).stem)
        up = "../" * (path.count("/") + 1)  # from docs/<path> to the repository root
        links = "\n".join(f"- [`{src}`]({up}{src})" for src in _sources(path))
        stubs[path] = (f"{STUB_MARK}\n# {title}\n\nThis page is generated from the code when "
                       "the docs site is built (`mkdocs build`; `python scripts/docs_pages.py "
                       f"OUT_DIR` writes it without mkdocs). Read in the repository, its source "
                       f"is:\n\n{links}\n")
    return stubs


def stale_stubs(docs: Path, pages: dict[str, str] | None = None) -> list[str]:
    """The stubs of ``docs`` that are missing or differ from ``stub_pages``."""
    return [path for path, text in stub_pages(pages).items()
            if not (docs / path).is_file() or (docs / path).read_text() != text]


# ------------------------------------------------------------------ mkdocs hook
def on_files(files, config):
    import logging

    from mkdocs.structure.files import File

    pages = all_pages()
    stale = stale_stubs(Path(config["docs_dir"]), pages)
    if stale:  # a warning fails `mkdocs build --strict` (CI)
        logging.getLogger("mkdocs.hooks.docs_pages").warning(
            "docs stubs missing or out of date: %s; run `python scripts/docs_pages.py --stubs`",
            ", ".join(stale))
    for path, content in pages.items():
        committed = files.get_file_from_path(path)
        if committed is not None:
            files.remove(committed)
        files.append(File.generated(config, path, content=content))
    return files


if __name__ == "__main__":
    if sys.argv[1:] == ["--stubs"]:
        for path, text in stub_pages().items():
            target = REPO / "docs" / path
            target.parent.mkdir(parents=True, exist_ok=True)
            if not target.is_file() or target.read_text() != text:
                target.write_text(text)
                print(target)
        sys.exit(0)
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "site-pages")
    for path, content in all_pages().items():
        (out / path).parent.mkdir(parents=True, exist_ok=True)
        (out / path).write_text(content)
        print(out / path)
