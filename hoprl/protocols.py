"""Each paper's evaluation protocol, and the results it reports: one plain dict, recipe -> Protocol.

A :class:`Protocol` is what ``hoprl eval-answers --protocol <recipe>`` and ``hoprl pipeline
--protocol`` run: the paper's evaluation sets (dataset, split, how many questions), its step cap,
its decoding, its metrics, its judge and, for R2AG, the answer generation step after retrieval.
Every value carries the section, table or appendix of the paper (``docs/papers.md``) it comes
from; where the paper gives none, the field says so and the project's choice is named (decoding
not given = greedy, temperature 0).

:data:`HEADLINES` holds each paper's own result rows (model as a hub id, dataset, metric, value as
printed, table). The evaluation report prints them beside the project's figures: as a comparison
when the served model is the paper's backbone, else labelled with the paper's model only. It is the
one source of docs/papers.md's headline table, which ``python -m hoprl.protocols --markdown``
prints (:func:`markdown`; tests/hoprl/test_papers_table.py checks the two are the same).

    >>> p = PROTOCOLS["evo-rag"]
    >>> p.max_steps, [s.dataset for s in p.sets]
    (20, ['hotpotqa', '2wiki', 'musique', 'bamboogle'])
    >>> PROTOCOLS["r2ag"].temperature, PROTOCOLS["r2ag"].top_p
    (0.6, 0.9)
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from hoprl.domain import unknown

T = TypeVar("T")

#: files of ../shared/data (see its README) per (hub dataset name, split)
LOCAL_FILES = {
    ("hotpotqa", "dev"): "hotpotqa_dev.jsonl",
    ("2wiki", "dev"): "2wiki_dev.jsonl",
    ("musique", "dev"): "musique_dev.jsonl",
    # the open-domain sets, where a user puts them (their questions carry no paragraphs: --corpus)
    ("nq", "dev"): "nq_dev.jsonl",
    ("nq", "test"): "nq_test.jsonl",
    ("triviaqa", "dev"): "triviaqa_dev.jsonl",
    ("triviaqa", "test"): "triviaqa_test.jsonl",
    ("popqa", "test"): "popqa_test.jsonl",
    ("bamboogle", "test"): "bamboogle_test.jsonl",
}
#: the project's summary key of each protocol metric (hoprl.answer_eval.summarize, flows/evaluate)
METRIC_KEYS = {
    "em": "em",
    "f1": "f1",
    "judge": "judge_accuracy",
    "retrieval_count": "retrieval_count",
    "steps": "steps",
    "recall": "agent_recall",
    "full_recall": "agent_full_recall",
    "k": "agent_k",
    "map": "agent_map",
}


@dataclass(frozen=True)
class EvalSet:
    """One evaluation set: a dataset of :data:`hoprl.data.hub.HUB` (or one without a loader here),
    the paper's split, and how many of its questions (``None``: the whole split)."""

    dataset: str
    split: str
    questions: int | None
    sampled: bool  # the paper draws a random sample of ``questions`` from the split
    source: str
    note: str = ""
    #: recipe options for this set only, over the protocol's (R2AG's top-t from the set's hops)
    recipe_config: dict[str, Any] = field(default_factory=dict)
    #: the paper retrieves this set's evidence from its Wikipedia dump (:attr:`Protocol.corpus`),
    #: not from the paragraphs that come with the questions
    open_domain: bool = False


@dataclass(frozen=True)
class Protocol:
    recipe: str
    paper: str
    sets: tuple[EvalSet, ...]
    max_steps: int | None  # None: not given by the paper -> the service's POLICY_DEFAULT_MAX_STEPS
    steps_source: str
    temperature: float
    top_p: float
    decoding_source: str
    metrics: tuple[str, ...]  # keys of METRIC_KEYS
    metrics_source: str
    judge: str | None  # the paper's judge model, when a reported metric uses one
    top_k: str
    references: bool = False  # the model answers over the question's own paragraphs (sent with it)
    generator: str | None = None  # a recipe whose prompt generates the answer from the retrieved documents
    generator_source: str = ""
    max_tokens: int | None = None  # the paper's generation limit at evaluation, when it gives one
    seeds: int = 1
    notes: tuple[str, ...] = ()
    #: the judge service's prompt (JUDGE_ANSWER_PROMPT) that has the paper's wording, when it has one
    judge_prompt: str | None = None
    #: recipe options every answer is asked with (``/v1/answer``'s ``recipe_config``)
    recipe_config: dict[str, Any] = field(default_factory=dict)
    recipe_config_source: str = ""
    #: the Wikipedia dump the paper retrieves from for its ``open_domain`` sets (None: every set
    #: retrieves from its questions' own paragraphs); ``hoprl eval-answers --corpus`` names the
    #: collection that stands in for it
    corpus: str | None = None
    corpus_source: str = ""

    def setting(self, evalset: EvalSet) -> str:
        """Where the paper retrieves ``evalset``'s evidence from, in words."""
        if evalset.open_domain and self.corpus:
            return f"open-domain: {self.corpus} ({self.corpus_source})"
        return "the questions' own paragraphs"

    def config_for(self, dataset: str | None) -> dict[str, Any]:
        """The recipe options of an answer on ``dataset``: the protocol's, then its set's."""
        evalset = next((s for s in self.sets if s.dataset == dataset), None)
        return {**self.recipe_config, **(evalset.recipe_config if evalset else {})}


@dataclass(frozen=True)
class Headline:
    """One result the paper reports for its own method; ``scale`` turns the project's 0-1 figure
    into the paper's unit (100 for a table in percent, 1 for fractions and counts)."""

    recipe: str
    model: str
    dataset: str
    metric: str
    value: float
    source: str
    scale: float = 1.0
    decimals: int | None = None  # the digits the paper prints after the point (None: as Python prints it)

    @property
    def printed(self) -> str:
        """The value as the paper prints it (``0.780``, ``64.0``, ``1.20``)."""
        return repr(self.value) if self.decimals is None else f"{self.value:.{self.decimals}f}"


PROTOCOLS: dict[str, Protocol] = {
    "evo-rag": Protocol(
        recipe="evo-rag",
        paper="EVO-RAG",
        sets=(
            EvalSet("hotpotqa", "dev", 7404, False, "App. A.1"),
            EvalSet("2wiki", "dev", 12575, False, "App. A.1"),
            EvalSet("musique", "dev", 2417, False, "App. A.1"),
            EvalSet("bamboogle", "test", 125, False, "App. A.1; §4.3 (125 items)", "its only split"),
        ),
        max_steps=20,
        steps_source="App. A.2: episode cap T_max = 20 steps",
        temperature=0.0,
        top_p=1.0,
        decoding_source="not given: greedy",
        metrics=("em", "f1", "steps", "retrieval_count"),
        metrics_source="App. A.7: official EM/F1 scripts, Avg. Steps; §4.2",
        judge=None,
        top_k="not given (App. A.2: 'constant k across runs'); the recipe's",
        seeds=3,
        notes=(
            "App. A.6: the mean over 3 seeds, the best-dev-EM checkpoint; App. A.7: paired "
            "bootstrap, 10,000 resamples",
            "retriever RRF of BM25 and BGE (App. A.2); the project's hybrid RRF stands in",
        ),
    ),
    "r2ag": Protocol(
        recipe="r2ag",
        paper="R2AG",
        sets=(
            EvalSet("hotpotqa", "dev", 1000, True, "App. C.2", "top-t 1 (M = 2 hops)", {"top_t": 1}),
            EvalSet("2wiki", "dev", 1000, True, "App. C.2", "top-t 2 (M = 4 hops)", {"top_t": 2}),
            EvalSet("musique", "dev", 1000, True, "App. C.2", "top-t 2 (M = 4 hops)", {"top_t": 2}),
            EvalSet(
                "nq",
                "dev",
                1000,
                True,
                "App. C.2",
                "open-domain: the 2021 Wikipedia dump as corpus; top-t 1 (one hop)",
                {"top_t": 1},
                open_domain=True,
            ),
            EvalSet("multihoprag", "test", None, False, "App. C.2", "hard 3-4 hop samples; no loader here"),
            EvalSet("longbench-v2", "test", 503, False, "App. C.2", "multiple choice (Acc); no loader here"),
        ),
        max_steps=6,
        steps_source="§3.2, App. B.2: L_MAX-I = 5 retrieval iterations, then the stop turn",
        temperature=0.6,
        top_p=0.9,
        decoding_source="App. C.2 (vLLM, temperature 0.6, top-p 0.9)",
        metrics=("recall", "full_recall", "k", "map", "em", "f1"),
        metrics_source="§3.1: Recall@K, Full-Recall@K, mAP; EM and F1 (LLM accuracy on MultiHopRAG)",
        judge="GPT-4o (§3.2, App. G.2; MultiHopRAG only)",
        top_k="§3.2: k = 1 and k = 2 per sub-query are both evaluated; k = 2 here, Table 5's rows "
        "that Table 3's QA figures repeat (Table 1's retrieval rows are k = 1)",
        generator="naive-rag",
        generator_source="§3.2, App. E: Qwen3-8B generates the answer from the retrieved documents, "
        "as in naive RAG; its prompt is not given (the project's naive-rag prompt)",
        max_tokens=4096,
        notes=(
            "Table 3's R2AG rows equal Table 5's top-k = 2 figures (MuSiQue 42.7 / 54.12)",
            "App. C.2: top-t/x with t = M and M/2 (M the dataset's maximum hops); t = M/2 caps the "
            "sub-queries an expansion retrieves (Table A.6's t = M/2 top-1 row is Table 1's 2Wiki row)",
            "training does not stop early: the trainer runs the configured 80 steps and no dev "
            "evaluation picks a checkpoint (App. B.2 stops early on 300 validation RR-Forests)",
        ),
        recipe_config={"top_k": 2},
        recipe_config_source="§3.2, Table 5: top-k = 2 per sub-query; App. C.2: top-t = M/2 per set",
        corpus="the 2021 Wikipedia dump of Izacard et al. (2022)",
        corpus_source="App. C.2: NQ only; the other sets retrieve from their own document collections",
    ),
    "eval-rar": Protocol(
        recipe="eval-rar",
        paper="Eval-RAR",
        sets=(
            EvalSet(
                "nq",
                "test",
                3610,
                False,
                "App. A.4, Table 4",
                "open-domain: Wikipedia 2018 corpus",
                open_domain=True,
            ),
            EvalSet("triviaqa", "test", 11313, False, "App. A.4, Table 4", "open-domain", open_domain=True),
            EvalSet("popqa", "test", 14267, False, "App. A.4, Table 4", "open-domain", open_domain=True),
            EvalSet("hotpotqa", "dev", 7405, False, "App. A.4, Table 4", open_domain=True),
            EvalSet("2wiki", "dev", 12576, False, "App. A.4, Table 4", open_domain=True),
            EvalSet("musique", "dev", 2417, False, "App. A.4, Table 4", open_domain=True),
            EvalSet("bamboogle", "test", 125, False, "App. A.4, Table 4", "open-domain", open_domain=True),
        ),
        max_steps=None,
        steps_source="Algorithm 1 names a step limit N; its value is not given",
        temperature=0.0,
        top_p=1.0,
        decoding_source="not given: greedy",
        metrics=("em", "retrieval_count"),
        metrics_source="§5.1: Exact Match",
        judge=None,
        top_k="§5.1: top-3 documents per query",
        corpus="the December 2018 Wikipedia dump (DPR's, Karpukhin et al. 2020), searched with E5-base-v2",
        corpus_source="§5.1: every set, as in Search-R1",
    ),
    "arena": Protocol(
        recipe="arena",
        paper="ARENA",
        sets=(
            EvalSet("hotpotqa", "dev", 500, True, "§4.1 Table 2, App. B", "10 paragraphs per question"),
            EvalSet("2wiki", "dev", 500, True, "§4.1 Table 2, App. B", "10 paragraphs per question"),
            EvalSet("musique", "dev", 500, True, "§4.1 Table 2, App. B", "20 paragraphs per question"),
        ),
        max_steps=1,
        steps_source="§4.4: one answer over the dataset's own paragraphs, concatenated in their order",
        temperature=0.0,
        top_p=1.0,
        decoding_source="not given for inference (App. E: rollouts at 0.9): greedy",
        metrics=("em", "f1", "judge"),
        metrics_source="§4.2, App. C: normalised EM, F1, LLM-as-a-Judge",
        judge="GPT-4o 2024-11-20 at temperature 0 (App. C.3)",
        judge_prompt="arena_lj@1",
        top_k="none: the question's own paragraphs are the references (§4.4)",
        references=True,
    ),
    "when-to-search": Protocol(
        recipe="when-to-search",
        paper="Learning When to Search",
        sets=(
            EvalSet(
                "nq", "dev", None, False, "§4.1, App. B.1", "split not given; open-domain", open_domain=True
            ),
            EvalSet(
                "popqa",
                "test",
                None,
                False,
                "§4.1, App. B.1",
                "split not given; open-domain",
                open_domain=True,
            ),
            EvalSet(
                "triviaqa",
                "dev",
                None,
                False,
                "§4.1, App. B.1",
                "split not given; open-domain",
                open_domain=True,
            ),
            EvalSet(
                "hotpotqa", "dev", None, False, "§4.1, App. B.1", "split and size not given", open_domain=True
            ),
            EvalSet(
                "musique", "dev", None, False, "§4.1, App. B.1", "split and size not given", open_domain=True
            ),
            EvalSet(
                "2wiki", "dev", None, False, "§4.1, App. B.1", "split and size not given", open_domain=True
            ),
            EvalSet("bamboogle", "test", None, False, "§4.1, App. B.1", "open-domain", open_domain=True),
        ),
        max_steps=5,
        steps_source="App. B.3 Table 5: max_turns 5 (a training setting; evaluation's is not given)",
        temperature=0.0,
        top_p=1.0,
        decoding_source="not given for evaluation (Table 5: rollouts at 1.0 / 1.0): greedy",
        metrics=("f1", "judge", "retrieval_count"),
        metrics_source="§4.1: F1, LLM as a Judge (ACC / LasJ), Retrieval Count",
        judge="Qwen3-235B-A22B-Instruct (App. B.2, prompt App. B.4)",
        judge_prompt="when_to_search_judge@1",
        top_k="§4.2: top-k 5",
        corpus="Wikipedia of September 2025 through FlashRAG, searched with E5",
        corpus_source="§4.2: every set",
    ),
}


def _table(
    recipe: str, source: str, metrics: tuple[str, ...], rows: dict[str, dict[str, tuple[float, ...]]],
    scale: float = 1.0, decimals: int | None = None,
) -> list[Headline]:  # fmt: skip
    """Rows of a printed table: ``{model: {dataset: (value per metric)}}``."""
    return [
        Headline(
            recipe,
            model,
            dataset,
            metric,
            value,
            source,
            1.0 if metric in ("k", "retrieval_count", "steps") else scale,
            decimals,
        )
        for model, cells in rows.items()
        for dataset, values in cells.items()
        for metric, value in zip(metrics, values, strict=True)
    ]


# The papers' own rows, values as printed. Column order of each table is the paper's.
HEADLINES: list[Headline] = [
    *_table("evo-rag", "Table 3", ("em", "f1"), {
        "deepseek-ai/DeepSeek-R1-Distill-Llama-8B": {
            "hotpotqa": (57.8, 71.4), "2wiki": (52.6, 66.4), "musique": (51.8, 63.7),
            "bamboogle": (45.3, 58.2)},
        "meta-llama/Llama-3.1-8B-Instruct": {
            "hotpotqa": (57.4, 71.2), "2wiki": (53.0, 66.9), "musique": (52.5, 64.4),
            "bamboogle": (45.7, 58.6)},
        "Qwen/Qwen2.5-7B-Instruct": {
            "hotpotqa": (57.6, 71.5), "2wiki": (53.2, 67.1), "musique": (52.2, 64.0),
            "bamboogle": (46.0, 59.0)},
    }, scale=100, decimals=1),
    *_table("evo-rag", "Table 7 (GRPO)", ("steps",),
            {"meta-llama/Llama-3.1-8B-Instruct": {"hotpotqa": (10.2,)}}, decimals=1),
    *_table("evo-rag", "Table 6 (Full)", ("steps",),
            {"Qwen/Qwen2.5-7B-Instruct": {"hotpotqa": (10.4,)}}, decimals=1),
    *_table("r2ag", "Table 1 (R2AG-0.56B@8B@top-1)", ("recall", "full_recall", "k", "map"), {
        "Qwen/Qwen3-8B": {
            "hotpotqa": (92.4, 87.1, 3.873, 79.39), "2wiki": (97.32, 94.1, 5.779, 84.78),
            "musique": (71.91, 51.3, 6.108, 57.3), "multihoprag": (46.44, 8.9, 10.01, 26.61)},
    }, scale=100),
    *_table("r2ag", "Table 3 (R2AG-Qwen3-8B)", ("em", "f1"), {"Qwen/Qwen3-8B": {
        "nq": (49.6, 59.39), "hotpotqa": (64.1, 77.52), "2wiki": (92.5, 93.01), "musique": (42.7, 54.12),
        "multihoprag": (57.9, 60.33)}}, scale=100),
    *_table("r2ag", "Table 3 (R2AG-Qwen3-8B, GPT-4o judge)", ("judge",),
            {"Qwen/Qwen3-8B": {"multihoprag": (80.9,)}}, scale=100),
    *_table("eval-rar", "Table 1", ("em",), {
        "Qwen/Qwen2.5-3B-Instruct": {
            "nq": (0.462,), "triviaqa": (0.611,), "popqa": (0.448,), "hotpotqa": (0.403,),
            "2wiki": (0.383,), "musique": (0.171,), "bamboogle": (0.352,)},
        "Qwen/Qwen2.5-3B": {
            "nq": (0.471,), "triviaqa": (0.629,), "popqa": (0.453,), "hotpotqa": (0.412,),
            "2wiki": (0.394,), "musique": (0.161,), "bamboogle": (0.368,)},
    }, decimals=3),
    *_table("arena", "Table 3", ("em", "f1", "judge"), {
        "meta-llama/Llama-3.1-8B-Instruct": {
            "hotpotqa": (0.552, 0.703, 0.780), "2wiki": (0.622, 0.710, 0.735),
            "musique": (0.358, 0.445, 0.466)},
        "Qwen/Qwen2.5-7B-Instruct": {
            "hotpotqa": (0.628, 0.762, 0.812), "2wiki": (0.660, 0.752, 0.786),
            "musique": (0.400, 0.520, 0.508)},
    }, decimals=3),
    *_table("when-to-search", "Table 3", ("f1", "judge", "retrieval_count"), {
        "Qwen/Qwen2.5-3B-Instruct": {
            "nq": (0.27, 0.39, 0.59), "popqa": (0.37, 0.33, 0.85), "triviaqa": (0.40, 0.57, 0.39),
            "hotpotqa": (0.39, 0.38, 0.75), "musique": (0.21, 0.14, 1.10), "2wiki": (0.49, 0.28, 0.68),
            "bamboogle": (0.45, 0.29, 0.87)},
        "Qwen/Qwen2.5-7B-Instruct": {
            "nq": (0.46, 0.48, 0.82), "popqa": (0.57, 0.59, 1.04), "triviaqa": (0.60, 0.73, 0.66),
            "hotpotqa": (0.52, 0.53, 1.09), "musique": (0.34, 0.37, 1.65), "2wiki": (0.55, 0.53, 1.20),
            "bamboogle": (0.49, 0.49, 1.03)},
    }, decimals=2),
    # Table 1's last training stage (Stage two) of the Qwen3 reasoning models; Table 4's "Ours" row
    # repeats Qwen3-4B's figures except Bamboogle's RC (1.14 there, 1.44 here)
    *_table("when-to-search", "Table 1 (Stage two)", ("judge", "retrieval_count"), {
        "Qwen/Qwen3-4B": {
            "nq": (0.57, 1.07), "popqa": (0.54, 1.06), "triviaqa": (0.83, 1.03), "hotpotqa": (0.55, 1.11),
            "musique": (0.24, 1.25), "2wiki": (0.61, 1.33), "bamboogle": (0.61, 1.44)},
        "Qwen/Qwen3-8B": {
            "nq": (0.64, 1.13), "popqa": (0.53, 1.01), "triviaqa": (0.81, 1.01), "hotpotqa": (0.55, 1.15),
            "musique": (0.27, 2.15), "2wiki": (0.51, 1.41), "bamboogle": (0.56, 1.22)},
    }, decimals=2),
]  # fmt: skip


def get_protocol(recipe: str) -> Protocol:
    if recipe not in PROTOCOLS:
        raise unknown("protocol", recipe, PROTOCOLS)
    return PROTOCOLS[recipe]


def local_file(evalset: EvalSet, data_dir: str | Path) -> Path | None:
    """The set's file under ``data_dir`` (../shared/data), or None when it is not there."""
    name = LOCAL_FILES.get((evalset.dataset, evalset.split))
    path = Path(data_dir) / name if name else None
    return path if path is not None and path.exists() else None


def sample(questions: list[T], evalset: EvalSet, seed: int = 0) -> list[T]:
    """The paper's questions from a split: a seeded random sample of ``evalset.questions`` when the
    paper samples, else the split in file order. A file smaller than the paper's sample is used
    whole (``../shared/data`` holds random subsets of the dev sets)."""
    if evalset.sampled and evalset.questions is not None and len(questions) > evalset.questions:
        return random.Random(seed).sample(questions, evalset.questions)
    return list(questions)


def served_backbone(served_model: str, paper_model: str) -> bool:
    """Whether the served model is the paper's backbone: its name (a checkpoint folder or HF id)
    contains the paper model's name without its hub owner, case and ``-``/``.``/``_`` aside
    (``Qwen/Qwen2.5-7B-Instruct`` and ``qwen2.5-7b-instruct-grpo-step40`` serve
    ``Qwen/Qwen2.5-7B-Instruct``). A base model's name followed by ``instruct`` is its instruct
    variant, not it (``Qwen2.5-3B-Instruct`` does not serve Eval-RAR's ``Qwen/Qwen2.5-3B``)."""

    def norm(s: str) -> str:
        return "".join(c for c in s.lower() if c.isalnum())

    paper, served = norm(paper_model.rsplit("/", 1)[-1]), norm(served_model)
    at = served.find(paper)
    return at >= 0 and not served[at + len(paper) :].startswith("instruct")


#: the header of docs/papers.md's headline table
MARKDOWN_HEADER = ("recipe", "model", "dataset", "metric", "value", "source")


def markdown(rows: list[Headline] | None = None) -> str:
    """:data:`HEADLINES` as docs/papers.md's headline table (``python -m hoprl.protocols --markdown``)."""
    lines = ["| " + " | ".join(MARKDOWN_HEADER) + " |", "|" + "---|" * len(MARKDOWN_HEADER)]
    for h in HEADLINES if rows is None else rows:
        lines.append(f"| {h.recipe} | {h.model} | {h.dataset} | {h.metric} | {h.printed} | {h.source} |")
    return "\n".join(lines) + "\n"


def headlines(recipe: str, dataset: str) -> list[Headline]:
    """The paper's rows for ``dataset`` (a :class:`EvalSet` dataset name), in table order."""
    return [h for h in HEADLINES if h.recipe == recipe and h.dataset == dataset]


if __name__ == "__main__":
    import sys

    if sys.argv[1:] != ["--markdown"]:
        sys.exit("usage: python -m hoprl.protocols --markdown  (prints docs/papers.md's headline table)")
    print(markdown(), end="")
