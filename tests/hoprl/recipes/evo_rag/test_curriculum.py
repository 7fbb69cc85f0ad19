"""EVO-RAG's curriculum: the stage switch on a plateau of the EMA of dev returns."""

from __future__ import annotations

import json

import pytest

from hoprl.recipes.evo_rag import Curriculum, EvoRagConfig


def test_stage_switches_after_exactly_patience_flat_checks():
    c = Curriculum(alpha=0.5, eps=0.01, patience=3)
    # check 1 seeds the EMA; checks 2, 3, 4 are flat; the third flat one switches
    assert [c.update(1.0) for _ in range(4)] == [False, False, False, True]
    assert c.stage == "refinement" and c.switched_at == 4
    assert c.update(1.0) is False  # switches once


def test_improvement_resets_the_flat_count():
    c = Curriculum(alpha=0.5, eps=0.01, patience=2)
    # EMA: 0 -> 0 (flat) -> 0.5 (gain 0.5, reset) -> 0.25 (flat) -> 0.125 (flat: switch)
    assert [c.update(x) for x in (0.0, 0.0, 1.0, 0.0, 0.0)] == [False, False, False, False, True]
    assert c.ema == pytest.approx(0.125)


def test_rising_returns_never_switch():
    c = Curriculum(alpha=0.3, eps=0.01, patience=2)
    assert not any(c.update(float(i)) for i in range(20))
    assert c.stage == "discovery"


def test_stage_switch_compares_with_the_best_ema_as_the_paper():
    """The paper: switch when the EMA fails to improve on the BEST EMA so far by eps for P checks.

    Defaults alpha = 0.3, eps = 0.01, P = 3; dev returns [1, 0, 1, 1, 1, 1]; EMA seeded by check 1:
      check 1: EMA = 1                                  best 1
      check 2: EMA = 0.3*0 + 0.7*1     = 0.7            0.7 - 1 < eps: flat 1
      check 3: EMA = 0.3*1 + 0.7*0.7   = 0.79           0.79 - 1 < eps: flat 2
      check 4: EMA = 0.3*1 + 0.7*0.79  = 0.853          0.853 - 1 < eps: flat 3 -> switch at check 4
      check 5: EMA = 0.3*1 + 0.7*0.853 = 0.8971
      check 6: EMA = 0.3*1 + 0.7*0.8971 = 0.92797
    Against the PREVIOUS EMA (the option) checks 3-6 gain 0.09, 0.063, 0.0441, 0.03087 >= eps, so
    the count resets at check 3 and never reaches 3: no switch.
    """
    returns = [1.0, 0.0, 1.0, 1.0, 1.0, 1.0]
    c = Curriculum.from_config(EvoRagConfig())
    assert (c.alpha, c.eps, c.patience, c.rule) == (0.3, 0.01, 3, "best")
    switched = []
    emas = []
    for x in returns:
        switched.append(c.update(x))
        emas.append(c.ema)
    assert switched == [False, False, False, True, False, False]
    assert c.switched_at == 4 and c.stage == "refinement"
    assert emas == pytest.approx([1.0, 0.7, 0.79, 0.853, 0.8971, 0.92797])
    assert c.best == pytest.approx(1.0)
    previous = Curriculum.from_config(EvoRagConfig(switch_rule="previous"))
    assert not any(previous.update(x) for x in returns) and previous.stage == "discovery"


def test_a_slow_rise_below_eps_per_check_is_a_plateau():
    """best = max EMA so far: gains smaller than eps each check never reset the count."""
    c = Curriculum(alpha=1.0, eps=0.01, patience=2)  # alpha 1: EMA = the newest return
    assert [c.update(x) for x in (0.5, 0.505, 0.509, 0.6)] == [False, False, True, False]


def test_curriculum_state_round_trips_through_json():
    c = Curriculum.from_config(EvoRagConfig(switch_patience=3))
    for x in (1.0, 1.0, 1.0):
        c.update(x)
    resumed = Curriculum.from_dict(json.loads(json.dumps(c.to_dict())))
    assert resumed == c
    assert resumed.update(1.0) is True and c.update(1.0) is True  # both switch on the same check
    with pytest.raises(ValueError):
        Curriculum.from_dict({**c.to_dict(), "stage": "mystery"})
    with pytest.raises(ValueError, match="finite"):
        c.update(float("nan"))
