"""Answer metrics against the official SQuAD/HotpotQA script's behaviour, case by case."""

import pytest

from hoprl.metrics.answer import METRICS, containment, exact_match, f1, get_metric, normalize_answer


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("The Cat!", "cat"),
        ("  The  Quick, Brown fox. ", "quick brown fox"),
        ("An apple a day", "apple day"),
        ("the-cat", "thecat"),  # punctuation is removed before articles, as in the official order
        ("Theatre", "theatre"),  # articles only as whole words
        ("U.S.A.", "usa"),
        ("", ""),
    ],
)
def test_normalize_answer(text: str, expected: str) -> None:
    assert normalize_answer(text) == expected


@pytest.mark.parametrize(
    ("prediction", "answers", "expected"),
    [
        ("The Cat!", ["cat"], 1.0),
        ("cat", ["dog", "a cat"], 1.0),  # max over aliases
        ("black cat", ["cat"], 0.0),
        ("anything", [], 0.0),  # unanswerable: nothing to match
        ("", [""], 1.0),  # both normalise to the empty string
    ],
)
def test_exact_match(prediction: str, answers: list[str], expected: float) -> None:
    assert exact_match(prediction, answers) == expected


@pytest.mark.parametrize(
    ("prediction", "answers", "expected"),
    [
        # "black cat" vs "cat": 1 shared token, precision 1/2, recall 1 -> 2*(1/2)/(3/2) = 2/3
        ("the black cat", ["a cat"], 2 / 3),
        # 2 shared of 3 predicted, 2 of 2 gold: p=2/3 r=1 -> 0.8
        ("new york city", ["York, New"], 0.8),
        # multiset overlap: "cat" occurs once in gold, so it matches once: p=1/2 r=1 -> 2/3
        ("cat cat", ["cat"], 2 / 3),
        ("cat cat dog", ["cat cat"], 0.8),
        ("Lyon", ["Paris"], 0.0),
        ("JFK airport", ["John F. Kennedy International Airport", "JFK Airport"], 1.0),
        # max over aliases picks the partial one: "kennedy airport" vs "jfk airport" p=r=1/2
        ("Kennedy airport", ["Orly", "JFK Airport"], 0.5),
        ("yes", ["yes"], 1.0),
        ("yes it is", ["yes"], 0.0),  # gold yes/no/noanswer: only equality scores
        ("no", ["no way out"], 0.0),  # predicted yes/no/noanswer: only equality scores
        ("noanswer", ["noanswer"], 1.0),
        ("", ["cat"], 0.0),
        ("cat", [], 0.0),
    ],
)
def test_f1(prediction: str, answers: list[str], expected: float) -> None:
    assert f1(prediction, answers) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("prediction", "answers", "expected"),
    [
        ("He was born in Paris, France.", ["Paris"], 1.0),
        ("It opened in 19901.", ["1990"], 0.0),  # whole words only
        ("The New York Times", ["new york"], 1.0),
        ("Lyon", ["Paris", "City of Light"], 0.0),
        ("the", ["The"], 0.0),  # an answer that normalises to nothing never matches
        ("Paris", [], 0.0),
    ],
)
def test_containment(prediction: str, answers: list[str], expected: float) -> None:
    assert containment(prediction, answers) == expected


def test_registry_names_are_versioned_and_resolve() -> None:
    assert all("@" in name for name in METRICS)
    assert get_metric("em@1") is exact_match
    assert get_metric("f1@1")("the black cat", ["cat"]) == pytest.approx(2 / 3)


def test_unknown_metric_lists_valid_names() -> None:
    with pytest.raises(KeyError, match=r"unknown metric 'em'.*em@1.*f1@1"):
        get_metric("em")
