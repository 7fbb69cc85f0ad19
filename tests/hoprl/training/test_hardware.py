"""The mixed-precision switch shared by every TRL config and the rollout engine."""

from __future__ import annotations

import pytest
import torch

from hoprl.training.hardware import accelerator_args, bf16_mixed_precision, rollout_bf16, rollout_prefill_bf16


@pytest.mark.parametrize(("value", "expected"), [("1", True), ("on", True), ("0", False), ("false", False)])
def test_the_environment_overrides_the_choice(
    value: str, expected: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOPRL_BF16", value)
    assert bf16_mixed_precision() is expected
    assert accelerator_args() == {"use_cpu": not torch.cuda.is_available(), "bf16": expected}


def test_the_default_follows_the_hardware(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HOPRL_BF16", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: True, raising=False)
    assert bf16_mixed_precision() is True
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False, raising=False)
    assert bf16_mixed_precision() is False


@pytest.mark.parametrize(
    ("cuda", "training", "rollouts", "expected"),
    [
        (True, "1", None, True),  # with CUDA, as training
        (True, "0", None, False),
        (False, "1", None, False),  # on a CPU, fp32 whatever training does
        (False, "0", None, False),
        (True, "1", "0", False),  # the setting decides wherever it is set
        (False, "0", "1", True),
    ],
)
def test_rollouts_decode_as_training_with_cuda_in_fp32_on_a_cpu_unless_told_otherwise(
    cuda: bool, training: str, rollouts: str | None, expected: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    monkeypatch.setenv("HOPRL_BF16", training)
    if rollouts is None:
        monkeypatch.delenv("HOPRL_ROLLOUT_BF16", raising=False)
    else:
        monkeypatch.setenv("HOPRL_ROLLOUT_BF16", rollouts)
    assert rollout_bf16() is expected
    assert accelerator_args()["bf16"] is (training == "1")  # training's own precision is untouched


@pytest.mark.parametrize(
    ("training", "decode", "prefill", "expected"),
    [("1", "0", None, True), ("0", None, None, False), ("1", "0", "0", False), ("0", "0", "1", True)],
)
def test_rollouts_prefill_as_training_whatever_they_decode_in(
    training: str, decode: str | None, prefill: str | None, expected: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Prefill is matmul-bound like training: bf16 where training is (the first case: training in
    bf16, decoding in fp32), unless ``HOPRL_ROLLOUT_PREFILL_BF16`` says otherwise."""
    monkeypatch.setenv("HOPRL_BF16", training)
    for name, value in (("HOPRL_ROLLOUT_BF16", decode), ("HOPRL_ROLLOUT_PREFILL_BF16", prefill)):
        monkeypatch.setenv(name, "x")  # so that delenv restores an outer value after the test
        if value is None:
            monkeypatch.delenv(name)
        else:
            monkeypatch.setenv(name, value)
    assert rollout_prefill_bf16() is expected


def test_rollouts_in_fp32_decode_past_accelerates_autocast(tiny_model: str) -> None:
    """accelerate wraps a bf16 job's forward in autocast; ``decoding_precision(model, False)``
    decodes through the original forward (fp32 logits as the bare model's), and the wrapper is
    back after it. Without it the prepared model's logits are bf16-rounded ones."""
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState
    from transformers import AutoModelForCausalLM

    from hoprl.training.hardware import decoding_precision

    ids = torch.tensor([list(range(3, 40))])
    bare = AutoModelForCausalLM.from_pretrained(tiny_model).eval()
    with torch.no_grad():
        fp32 = bare(input_ids=ids).logits
    AcceleratorState._reset_state(reset_partial_state=True)  # an earlier test's fp32 trainer set it
    try:
        model = Accelerator(cpu=True, mixed_precision="bf16").prepare(
            AutoModelForCausalLM.from_pretrained(tiny_model)
        )
        model.eval()
        with torch.no_grad():
            autocast = model(input_ids=ids).logits
            with decoding_precision(model, autocast=False):
                inside = model(input_ids=ids).logits
            with decoding_precision(model, autocast=True):
                kept = model(input_ids=ids).logits
            after = model(input_ids=ids).logits
    finally:
        AcceleratorState._reset_state(reset_partial_state=True)
    assert not torch.equal(autocast, fp32)  # the wrapper autocasts: the check below can fail
    assert torch.equal(inside, fp32)
    assert torch.equal(kept, autocast) and torch.equal(after, autocast)
