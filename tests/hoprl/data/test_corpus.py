"""``hoprl.data.corpus``: a gold paragraph found among a corpus's passages by title, then text.

The overlaps are the official token F1 (lowercase, no punctuation, no articles a/an/the), computed
here by hand in the comments."""

from __future__ import annotations

import pytest

from hoprl.data.corpus import corpus_match, text_overlap
from hoprl.domain import Paragraph
from hoprl.schemas import Document

# normalised: "ansk is river of 412 km" -> 6 words
GOLD = Paragraph(title="Ansk", text="The Ansk is a river of 412 km.", is_gold=True)
# "ansk is river in ostland": 5 words, 3 shared (ansk is river): P 3/5, R 3/6, F1 = 0.6 / 1.1
RIVER = Document(id="11", title="Ansk", text="The Ansk is a river in Ostland.")
# "ansk flows through velmora and is 412 km long": 9 words, 4 shared (ansk is 412 km):
# P 4/9, R 4/6, F1 = 2 (4/9)(4/6) / (4/9 + 4/6) = (32/54) / (60/54) = 32/60
LENGTH = Document(id="12", title="ansk ", text="The Ansk flows through Velmora and is 412 km long.")
OTHER = Document(id="13", title="Ostland", text="The Ansk is a river of 412 km.")  # the text, not the title


def test_overlaps_by_hand() -> None:
    assert text_overlap(RIVER.text, GOLD.text) == pytest.approx(0.6 / 1.1)  # 0.5455
    assert text_overlap(LENGTH.text, GOLD.text) == pytest.approx(32 / 60)  # 0.5333
    assert text_overlap(GOLD.text, GOLD.text) == 1.0


@pytest.mark.parametrize(
    ("candidates", "expected"),
    [
        # valid: one passage with the title is the paragraph, whatever its text says
        ([OTHER, LENGTH], ("12", 32 / 60)),
        # several with the title: the higher overlap wins, 0.5455 over 0.5333, in either order
        ([LENGTH, RIVER, OTHER], ("11", 0.6 / 1.1)),
        ([RIVER, LENGTH], ("11", 0.6 / 1.1)),
        # edge: equal overlaps, the earlier candidate (the better-ranked hit)
        ([RIVER, RIVER.model_copy(update={"id": "14"})], ("11", 0.6 / 1.1)),
        # invalid: no passage has the title, even one with the very text: not in the corpus
        ([OTHER], None),
        ([], None),
    ],
)
def test_corpus_match(candidates: list[Document], expected: tuple[str, float] | None) -> None:
    found = corpus_match(GOLD, candidates)
    if expected is None:
        assert found is None
    else:
        assert found is not None and found[0] == expected[0] and found[1] == pytest.approx(expected[1])
