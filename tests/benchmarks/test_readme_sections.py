"""README.md's benchmark sections start with the text benchmarks/update_readme.py writes, so that
regenerating a table keeps what the README says around it (the torchtitan section's text had
drifted from it for a day: a regeneration would have dropped a paragraph's findings)."""

import importlib.util
import os

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")


def test_every_sections_text_is_the_readmes():
    spec = importlib.util.spec_from_file_location(
        "update_readme", os.path.join(ROOT, "benchmarks", "update_readme.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        readme = f.read()
    apart = [name for name, _, intro, *_ in module.SECTIONS if intro not in readme]
    assert module.SECTIONS and apart == [], f"README text differs from update_readme's: {apart}"
