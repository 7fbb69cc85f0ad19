"""The synthetic world: the same seed builds the same world, and paragraphs state their facts."""

from hoprl.data.synthetic import build_world


def test_same_seed_same_world() -> None:
    assert build_world(5, 80).paragraphs() == build_world(5, 80).paragraphs()
    assert build_world(5, 80).paragraphs() != build_world(6, 80).paragraphs()


def test_world_paragraphs_state_their_entity() -> None:
    world = build_world(3, 60)
    for e, p in zip(world.entities, world.paragraphs(), strict=True):
        assert p.title == e.name and p.text.startswith(e.name)
        for key, target in e.rels.items():
            assert target in p.text, key
