"""Docs a newcomer can follow (issue 31, item 5): every relative link of docs/ and the
README resolves when read in the repository; the generated pages' stubs are current (the
site replaces them, `mkdocs build --strict` checks the built links); numbers in scripts'
comments agree with the presets they run."""
import importlib.util
import re
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _docs_pages():
    spec = importlib.util.spec_from_file_location("docs_pages", REPO / "scripts" / "docs_pages.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_relative_link_resolves_in_the_repository():
    broken = []
    for page in [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]:
        for target in LINK.findall(page.read_text()):
            path = target.split("#")[0]
            if path and not target.startswith(("http://", "https://", "mailto:")) \
                    and not (page.parent / path).exists():
                broken.append(f"{page.relative_to(REPO)} -> {target}")
    assert not broken, broken


def test_generated_pages_have_current_stubs():
    pages = _docs_pages()
    assert pages.stale_stubs(REPO / "docs") == [], "run `python scripts/docs_pages.py --stubs`"


def test_te_regression_script_states_the_presets_numbers():
    script = (REPO / "scripts" / "te_regression.sh").read_text()
    preset = (REPO / "sweeps" / "te_regression.yaml").read_text()
    repeats = yaml.safe_load(preset)["search"]["repeats"]
    assert re.search(r"every layout (\d+) times", script).group(1) == str(repeats)
    models = re.search(r"MODELS=\(([^)]*)\)", script).group(1).split()
    cps = re.search(r"CPS=\(([^)]*)\)", script).group(1).split()
    matrix = re.search(r"#\s+model: (.*)\n#\s+cp:\s+(.*)", preset)
    assert all(m in matrix.group(1) for m in models)
    assert re.findall(r"(\d+) \(", matrix.group(2)) == cps
