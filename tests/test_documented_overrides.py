"""Every `section.key=value` override the docs and the configs' comments name is a key of the run config (a
comment told users to override `pool.base_url=...`, a key that does not exist; `env.pool_url` is the one)."""
import re
from pathlib import Path

from omegaconf import OmegaConf

from verl.trainer.main_ppo import load_config

ROOT = Path(__file__).resolve().parents[1]
OVERRIDE = re.compile(r"(?<![\w./-])([a-z_][a-z0-9_]*(?:\.[a-z0-9_]+)+)=(?!=)")  # a.b=..., not --flag= or x==y
MISTYPED_ON_PURPOSE = {"actor.lrr", "env.alhpa"}  # docs/usage.md's examples of a key the schema refuses
ENVS = ("router", "gramma", "single_turn")  # env.* keys are the chosen environment's (configs/env/*.yaml)


def documented_overrides() -> dict[str, set[str]]:
    """Override key -> the files naming it: config comments, README.md, docs/*.md, experiments' READMEs (records
    under docs/results/ describe past runs and are left as they were)."""
    found: dict[str, set[str]] = {}
    files = [*sorted(ROOT.glob("configs/**/*.yaml")), ROOT / "README.md", *sorted(ROOT.glob("docs/*.md")),
             *sorted(ROOT.glob("experiments/**/*.md"))]
    for path in files:
        text = path.read_text()
        if path.suffix == ".yaml":
            text = "\n".join(line.split("#", 1)[1] for line in text.splitlines() if "#" in line)
        for m in OVERRIDE.finditer(text):
            found.setdefault(m.group(1), set()).add(str(path.relative_to(ROOT)))
    return found


def test_the_scan_sees_overrides_and_only_them():
    text = "override `pool.base_url=...` or `trainer.total_steps=10`; not --pool-url=x, a==b, OUT=dir, f(x=1)"
    assert [m.group(1) for m in OVERRIDE.finditer(text)] == ["pool.base_url", "trainer.total_steps"]


def test_every_documented_override_is_a_config_key():
    configs = [load_config("ppo_trainer", [f"env={env}"]) for env in ENVS]
    missing = object()
    found = documented_overrides()
    assert len(found) > 30 and "env.pool_url" in found
    unknown = {key: sorted(files) for key, files in found.items() if key not in MISTYPED_ON_PURPOSE
               and all(OmegaConf.select(cfg, key, default=missing) is missing for cfg in configs)}
    assert unknown == {}
