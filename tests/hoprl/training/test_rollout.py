"""The per-step episode statistics the trainer logs beside reward and loss."""

from __future__ import annotations

import pytest

from hoprl.domain import Episode, Step
from hoprl.generation.decoding import Counters
from hoprl.training.rollout import counter_stats, engine_counters, episode_stats


def episode(searches: int, retrieval_s: float, generation_s: float) -> Episode:
    search = {"action": "search", "text": "<search>q</search>", "queries": ["q"]}
    steps = [Step(t=t, **search) for t in range(1, searches + 1)]
    steps.append(Step(t=searches + 1, action="answer", text="<answer>a</answer>", answer="a"))
    return Episode(recipe="when-to-search", question_id="q", question="?", steps=steps,
                   timings={"retrieval": retrieval_s, "generation": generation_s})  # fmt: skip


def test_episode_stats_are_means_over_the_episodes() -> None:
    episodes = [episode(2, 0.5, 3.0), episode(1, 0.25, 2.0), episode(0, 0.0, 1.0), episode(0, 0.0, 2.0)]
    episodes[-1].outcome = "token_budget"  # 1 of 4 episodes cut by the budget: 0.25; 3 answered
    got = episode_stats(episodes)
    # (0.5 + 0.25) / 4, (3 + 2 + 1 + 2) / 4, (2 + 1) / 4
    assert got == pytest.approx(
        {
            "retrieval_s": 0.1875,
            "generation_s": 2.0,
            "searches": 0.75,
            "ended/answer": 0.75,
            "ended/token_budget": 0.25,
            "ended/format_error": 0.0,
            "ended/step_cap": 0.0,
        }
    )


def test_no_episodes_give_zeros_not_an_error() -> None:
    assert episode_stats([]) == {
        "retrieval_s": 0.0,
        "generation_s": 0.0,
        "searches": 0.0,
        "ended/answer": 0.0,
        "ended/token_budget": 0.0,
        "ended/format_error": 0.0,
        "ended/step_cap": 0.0,
    }


def test_a_rollouts_engine_time_is_the_difference_of_two_counter_readings() -> None:
    """4.5 s of prefill for 1,800 tokens and 12 s for 40 steps of 260 rows between two readings:
    6.5 rows a step."""
    before = Counters(prefill_s=1.5, prefill_tokens=200, decode_s=3.0, decode_steps=10, decode_rows=40)
    after = Counters(prefill_s=6.0, prefill_tokens=2000, decode_s=15.0, decode_steps=50, decode_rows=300)
    assert counter_stats(after.since(before)) == {
        "rollout/prefill_s": 4.5, "rollout/prefill_tokens": 1800.0, "rollout/decode_s": 12.0,
        "rollout/decode_steps": 40.0, "rollout/rows_per_step": 6.5,
    }  # fmt: skip
    assert counter_stats(Counters())["rollout/rows_per_step"] == 0.0  # no step: no division by zero


def test_only_the_transformers_engine_has_counters() -> None:
    class Batcher:
        counters = Counters(decode_steps=3)

    class Engine:
        batcher = Batcher()

    copy = engine_counters(Engine())
    assert copy == Counters(decode_steps=3) and copy is not Batcher.counters  # a reading, not the live one
    assert engine_counters(object()) is None  # vLLM's engine: no counters, no rollout/* stats


def test_the_trainer_and_hoprl_reward_score_through_one_reward_loop() -> None:
    """GRPO's rollouts, the off-policy loops and ``hoprl reward`` call the same loop, not copies."""
    from hoprl.recipes import scoring
    from hoprl.training import offpolicy, rollout

    assert rollout.score is scoring.score and offpolicy.score is scoring.score


def test_a_rollout_reuses_earlier_turns_and_never_a_stale_policys(tiny_model: str) -> None:
    """The training engine's prefix cache: an episode's next turn (its chat so far plus new text)
    prefills only the new tokens; a rollout after an optimizer step starts with an empty cache, so
    it decodes exactly what an engine built on the new weights decodes. Kept keys and values of the
    old weights would not (shown: the same turn from the stale cache decodes differently)."""
    from types import SimpleNamespace

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from hoprl.generation.engines import SamplingParams
    from hoprl.training.rollout import AgentRollout, TrainingEngine

    torch.manual_seed(0)
    model, tokenizer = (
        AutoModelForCausalLM.from_pretrained(tiny_model),
        AutoTokenizer.from_pretrained(tiny_model),
    )
    greedy = SamplingParams(max_tokens=12, temperature=0)
    turn = [{"role": "user", "content": "Who founded Acme Records, and where was its founder born? " * 3}]
    engine = TrainingEngine(model, tokenizer)
    rollout = SimpleNamespace(
        opts=SimpleNamespace(torch_threads=1), merge_adapters=True
    )  # what generating() reads

    def decode(chat: list[dict[str, str]], on: TrainingEngine = engine) -> str:
        return on.generate([chat], greedy)[0][0].text

    with AgentRollout.generating(rollout, engine, model):  # type: ignore[arg-type]
        first = decode(turn)
        second = [*turn, {"role": "assistant", "content": first}, {"role": "user", "content": "Go on."}]
        decode(second)
        cache = engine.batcher.prefixes
        assert cache.hits >= 1 and cache.reused > len(tokenizer.apply_chat_template(turn)) // 2
    with torch.no_grad():  # an optimizer step
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    stale = decode(second)  # the cache still holds the old weights' keys and values
    with AgentRollout.generating(rollout, engine, model):  # type: ignore[arg-type]
        assert engine.batcher.prefixes.tokens == 0  # emptied as the rollout began
        fresh = decode(second)
    rebuilt = TrainingEngine(model, tokenizer)
    with AgentRollout.generating(rollout, rebuilt, model):  # type: ignore[arg-type]
        assert fresh == decode(second, rebuilt)
    assert stale != fresh


@pytest.mark.parametrize(("rollouts", "autocast"), [("0", False), ("1", True)])
def test_the_training_engine_decodes_at_the_rollout_precision(
    rollouts: str, autocast: bool, tiny_model: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Training in bf16 (``HOPRL_BF16=1``), the engine around the training model autocasts only
    when ``HOPRL_ROLLOUT_BF16`` lets it."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from hoprl.training.rollout import TrainingEngine

    monkeypatch.setenv("HOPRL_BF16", "1")
    monkeypatch.setenv("HOPRL_ROLLOUT_BF16", rollouts)
    engine = TrainingEngine(
        AutoModelForCausalLM.from_pretrained(tiny_model), AutoTokenizer.from_pretrained(tiny_model)
    )
    assert engine.autocast is autocast and engine.batcher is not None
    assert engine.batcher.autocast is autocast
    assert engine.batcher.prefill_autocast is True  # prefill autocasts as training, whatever decoding does
