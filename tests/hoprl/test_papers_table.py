"""configs/<recipe>.yaml against docs/papers.md: every value a config sets has a row in its paper's
settings table with the same value, every keyed row is a value of the config, the headline-results
table parses, and a job sent without the config resolves to the settings `hoprl train --config`
sends (the trainer's paper preset reads the file)."""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from cli.train import add_arguments, job_request
from hoprl.configs import MACHINE, SMALL, paper_defaults, read_config
from hoprl.jobspec import resolve
from hoprl.protocols import HEADLINES, markdown
from hoprl.schemas.trainer import Hyperparameters, JobRequest

ROOT = Path(__file__).resolve().parents[2]
PAPERS_MD = ROOT / "docs" / "papers.md"
#: the section heading of docs/papers.md that holds each recipe's settings table
SECTIONS = {
    "EVO-RAG": "evo-rag",
    "R2AG": "r2ag",
    "Eval-RAR": "eval-rar",
    "ARENA": "arena",
    "When to search": "when-to-search",
    "Search-R1 (the `search-r1` and `naive-rag` baselines)": "search-r1",
}
RECIPES = sorted(SECTIONS.values())
SETTINGS_HEADER = "| setting | value | source | key |"
HEADLINE_HEADER = "| recipe | model | dataset | metric | value | source |"


def cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def tables() -> tuple[dict[str, dict[str, tuple[Any, str]]], list[dict[str, str]]]:
    """Each recipe's settings table as {key: (value, source)}, and the headline rows."""
    settings: dict[str, dict[str, tuple[Any, str]]] = {}
    headline: list[dict[str, str]] = []
    section, header = None, None
    for line in PAPERS_MD.read_text().splitlines():
        if line.startswith("## "):
            section, header = line[3:].strip(), None
        elif line.startswith("|"):
            if header is None:
                header = line.strip()
            elif not set(line) <= set("|- "):
                row = cells(line)
                if header == SETTINGS_HEADER and section in SECTIONS:
                    _, value, source, key = row
                    if key != "—":
                        assert key.startswith("`") and value.startswith("`"), f"{section}: {line}"
                        table = settings.setdefault(SECTIONS[section], {})
                        assert key.strip("`") not in table, f"{section}: {key} twice"
                        table[key.strip("`")] = (yaml.safe_load(value.strip("`")), source)
                elif header == HEADLINE_HEADER:
                    headline.append(dict(zip(cells(HEADLINE_HEADER), row, strict=True)))
        else:
            header = None
    return settings, headline


def flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}, "c": [2]}`` -> ``{"a.b": 1, "c": [2]}`` (lists are values)."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict) and value:
            out |= flatten(value, f"{prefix}{key}.")
        else:
            out[f"{prefix}{key}"] = value
    return out


def config_values(recipe: str) -> dict[str, Any]:
    """Every value the config sets above its ``small:`` section, the recipe name aside."""
    data = read_config(ROOT / "configs" / f"{recipe}.yaml")
    data.pop(SMALL, None)
    data.pop("recipe")
    return flatten(data)


def test_every_recipe_config_has_a_settings_table() -> None:
    settings, _ = tables()
    assert sorted(settings) == RECIPES
    assert sorted(p.stem for p in (ROOT / "configs").glob("*.yaml")) == RECIPES


@pytest.mark.parametrize("recipe", RECIPES)
def test_the_config_and_the_papers_table_hold_the_same_values(recipe: str) -> None:
    table = tables()[0][recipe]
    config = config_values(recipe)
    assert sorted(set(config) - set(table)) == [], f"{recipe}: config values without a row in docs/papers.md"
    assert sorted(set(table) - set(config)) == [], f"{recipe}: docs/papers.md rows the config does not set"
    for key, (value, source) in table.items():
        assert config[key] == value, f"{recipe} {key}: config {config[key]!r}, docs/papers.md {value!r}"
        assert source, f"{recipe} {key}: no source"


@pytest.mark.parametrize("recipe", [r for r in RECIPES if r != "search-r1"])
def test_the_five_papers_name_their_training_set_and_backbones(recipe: str) -> None:
    config = config_values(recipe)
    assert config["dataset"] == f"paper:{recipe}"
    assert isinstance(config["paper.models"], list)
    assert config["paper.training_data.train"], f"{recipe}: no training parts"
    assert isinstance(config["paper.training_data.seed"], int)


def test_the_headline_table_parses() -> None:
    _, headline = tables()
    assert {row["recipe"] for row in headline} == {"evo-rag", "r2ag", "eval-rar", "arena", "when-to-search"}
    for row in headline:
        float(row["value"])
        assert re.search(r"Table \d", row["source"]), row
        assert "/" in row["model"], row  # a hub id, as the configs name models
    # a few rows checked by eye against the papers' tables, as printed there
    rows = {(r["recipe"], r["model"], r["dataset"], r["metric"]): r["value"] for r in headline}
    assert rows["evo-rag", "Qwen/Qwen2.5-7B-Instruct", "hotpotqa", "em"] == "57.6"  # Table 3
    assert rows["evo-rag", "Qwen/Qwen2.5-7B-Instruct", "musique", "f1"] == "64.0"  # Table 3
    assert rows["evo-rag", "deepseek-ai/DeepSeek-R1-Distill-Llama-8B", "bamboogle", "f1"] == "58.2"  # Table 3
    assert rows["evo-rag", "Qwen/Qwen2.5-7B-Instruct", "hotpotqa", "steps"] == "10.4"  # Table 6, Full
    assert rows["r2ag", "Qwen/Qwen3-8B", "2wiki", "f1"] == "93.01"  # Table 3
    assert rows["r2ag", "Qwen/Qwen3-8B", "multihoprag", "k"] == "10.01"  # Table 1, top-1
    assert rows["eval-rar", "Qwen/Qwen2.5-3B", "bamboogle", "em"] == "0.368"  # Table 1
    assert rows["arena", "meta-llama/Llama-3.1-8B-Instruct", "hotpotqa", "judge"] == "0.780"  # Table 3, LJ
    assert (
        rows["when-to-search", "Qwen/Qwen2.5-7B-Instruct", "musique", "retrieval_count"] == "1.65"
    )  # Table 3
    assert rows["when-to-search", "Qwen/Qwen2.5-7B-Instruct", "2wiki", "retrieval_count"] == "1.20"  # Table 3
    assert (
        rows["when-to-search", "Qwen/Qwen3-4B", "bamboogle", "retrieval_count"] == "1.44"
    )  # Table 1, Stage two


def test_the_headline_table_is_hoprl_protocols_headlines() -> None:
    """One source: docs/papers.md's headline table is HEADLINES row for row, in order (regenerate it
    with ``python -m hoprl.protocols --markdown``)."""
    _, headline = tables()
    doc = [tuple(row.values()) for row in headline]
    code = [(h.recipe, h.model, h.dataset, h.metric, h.printed, h.source) for h in HEADLINES]
    assert [r for r in doc if r not in code] == [], "docs/papers.md rows not in HEADLINES"
    assert [r for r in code if r not in doc] == [], "HEADLINES rows not in docs/papers.md"
    assert doc == code
    assert markdown() in PAPERS_MD.read_text()
    for row in headline:  # the printed value is the figure the report compares with
        (h,) = [h for h in HEADLINES if (h.recipe, h.model, h.dataset, h.metric) == tuple(row.values())[:4]]
        assert float(row["value"]) == h.value, row


def cli_request(recipe: str) -> dict[str, Any]:
    """The body `hoprl train --config configs/<recipe>.yaml` sends (hoprl.clients.trainer)."""
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--config", str(ROOT / "configs" / f"{recipe}.yaml")])
    return job_request(args).model_dump(mode="json", exclude_unset=True, exclude_none=True)


def training_settings(body: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The objective and resolved training settings the trainer derives from a request body."""
    request = JobRequest.model_validate(body)
    hp = resolve(request.hyperparameters, request.recipe, request.objective)
    return request.objective, {k: v for k, v in hp.model_dump().items() if k not in MACHINE}


@pytest.mark.parametrize("recipe", RECIPES)
def test_hoprl_train_config_and_a_bare_api_job_resolve_to_the_same_settings(recipe: str) -> None:
    assert training_settings(cli_request(recipe)) == training_settings({"recipe": recipe})


def test_a_bare_job_trains_at_the_papers_rate_group_and_lengths_not_the_generic_ones() -> None:
    """R2AG App. B.2 (lr 1e-6, 12 responses a tree, 4,096 output tokens); ARENA App. E (lr 3e-6,
    7 rollouts, temperature 0.9); when-to-search Table 5 (32 rollouts, 16,384-token responses)."""
    generic = Hyperparameters()
    r2ag = resolve(JobRequest(recipe="r2ag").hyperparameters, "r2ag")
    assert (r2ag.learning_rate, r2ag.num_generations, r2ag.max_new_tokens_per_step) == (1e-6, 12, 4096)
    arena = resolve(JobRequest(recipe="arena").hyperparameters, "arena")
    assert (arena.learning_rate, arena.num_generations, arena.temperature) == (3e-6, 7, 0.9)
    wts = resolve(JobRequest(recipe="when-to-search").hyperparameters, "when-to-search")
    assert (wts.num_generations, wts.token_budget) == (32, 16384)
    assert generic.num_generations == 4 and generic.learning_rate is None  # what they were before


def test_the_paper_preset_reads_the_config_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One home: a changed config file changes what a bare job resolves to (HOPRL_CONFIGS_DIR)."""
    text = (
        (ROOT / "configs" / "r2ag.yaml").read_text().replace("learning_rate: 1.0e-6", "learning_rate: 2.0e-6")
    )
    (tmp_path / "r2ag.yaml").write_text(text)
    monkeypatch.setenv("HOPRL_CONFIGS_DIR", str(tmp_path))
    assert paper_defaults("r2ag")["learning_rate"] == 2e-6
    assert resolve(JobRequest(recipe="r2ag").hyperparameters, "r2ag").learning_rate == 2e-6
    assert paper_defaults("evo-rag") == {}  # the folder has no evo-rag.yaml: the generic values
