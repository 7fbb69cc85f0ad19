"""bench/rl_step.py's variant names: hyperparameters, and the precision its process runs at."""

from __future__ import annotations

import pytest

from tests.conftest import load_script

bench = load_script("bench/rl_step.py", "bench_rl_step")


def test_a_precision_suffix_sets_autocast_in_the_variants_process_only() -> None:
    assert bench.split_variant("full") == ({}, {})
    assert bench.split_variant("full-bf16") == ({}, {"HOPRL_BF16": "1"})
    assert bench.split_variant("lora16-micro1-fp32") == (
        {"lora_rank": 16, "micro_batch": 1},
        {"HOPRL_BF16": "0"},
    )


def test_suffixes_combine() -> None:
    assert bench.split_variant("full-bf16-trlhead") == ({}, {"HOPRL_BF16": "1", bench.TRL_HEAD: "1"})


def test_an_unknown_variant_names_the_known_ones() -> None:
    with pytest.raises(SystemExit, match="unknown variant 'lora8'; one of full, micro2"):
        bench.split_variant("lora8-bf16")
