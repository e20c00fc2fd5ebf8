r"""Domain A of the Qwen2-vs-CausalQwen comparison: general English text without any number.

**Domain A** (`domain_a_texts`) is general English text *without any number*: short texts of two to four
sentences from a small grammar about animals, seasons and places. Every entity has fixed attributes that
recur consistently, so a language model has something to learn beyond spelling:

| topic | entities | fixed attributes (used consistently in every sentence) |
|---|---|---|
| animals | cow, cat, dog, bird, duck, horse, owl, frog, bee, goat | habitat, food, sound verb, colour |
| seasons | winter, summer, spring, autumn | temperature word, weather event, clothing |
| places | city, village, coast, mountain, island | adjective, feature, activity |

A text picks a topic and one entity, writes two or three different sentence templates about that same
entity, and with probability 1/2 adds one sentence about another entity of another topic. No character
of a domain-A text is a digit (so the number grammar finds nothing in it).

The corpus is part of the pretrained base's cache key (`validation.domains.pretrained_base`): changing it
calls for a bump of `validation.domains.DOMAINS_VERSION`.
"""

from __future__ import annotations

import random

import regex

from .argument_checks import check_count, check_seed

__all__ = ["ANIMALS", "SEASONS", "PLACES", "domain_a_texts"]

# animal: (habitat, food, sound verb, colour)
ANIMALS = {
    "cow": ("field", "grass", "moos", "brown"),
    "cat": ("house", "fish", "purrs", "black"),
    "dog": ("garden", "meat", "barks", "white"),
    "bird": ("tree", "seeds", "sings", "blue"),
    "duck": ("pond", "bread", "quacks", "yellow"),
    "horse": ("farm", "hay", "neighs", "grey"),
    "owl": ("forest", "mice", "hoots", "dark"),
    "frog": ("lake", "flies", "croaks", "green"),
    "bee": ("meadow", "nectar", "buzzes", "golden"),
    "goat": ("hill", "leaves", "bleats", "small"),
}
# season: (temperature word, weather event, clothing)
SEASONS = {
    "winter": ("cold", "snow falls", "coat"),
    "summer": ("hot", "the sun shines", "hat"),
    "spring": ("mild", "rain falls", "raincoat"),
    "autumn": ("cool", "the wind blows", "scarf"),
}
# place: (adjective, feature, activity)
PLACES = {
    "city": ("busy", "market", "shop"),
    "village": ("quiet", "church", "rest"),
    "coast": ("windy", "harbor", "sail"),
    "mountain": ("steep", "peak", "climb"),
    "island": ("sunny", "beach", "swim"),
}

_ANIMAL_SENTENCES = (
    "The {a} lives in the {habitat}.",
    "The {a} eats {food}.",
    "The {colour} {a} {sound} in the {habitat}.",
    "Every morning the {a} {sound}.",
    "A {a} likes to eat {food}.",
    "In the {habitat} you can hear the {a}, it {sound}.",
)
_SEASON_SENTENCES = (
    "In {s} it is {temp}.",
    "In {s} {event}.",
    "When it is {temp}, people wear a {clothing}.",
    "In {s} people wear a {clothing}.",
    "The {s} days are {temp} and {event}.",
)
_PLACE_SENTENCES = (
    "The {p} is {adj}.",
    "People go to the {p} to {act}.",
    "The {p} has a {feature}.",
    "In the {p} there is a {feature}.",
    "It is {adj} in the {p}, so we {act} there.",
)


def _animal_sentences(rng: random.Random, name: str, count: int) -> list[str]:
    habitat, food, sound, colour = ANIMALS[name]
    chosen = rng.sample(_ANIMAL_SENTENCES, count)
    return [t.format(a=name, habitat=habitat, food=food, sound=sound, colour=colour) for t in chosen]


def _season_sentences(rng: random.Random, name: str, count: int) -> list[str]:
    temp, event, clothing = SEASONS[name]
    chosen = rng.sample(_SEASON_SENTENCES, count)
    return [_capitalised(t.format(s=name, temp=temp, event=event, clothing=clothing)) for t in chosen]


def _place_sentences(rng: random.Random, name: str, count: int) -> list[str]:
    adj, feature, act = PLACES[name]
    chosen = rng.sample(_PLACE_SENTENCES, count)
    return [t.format(p=name, adj=adj, feature=feature, act=act) for t in chosen]


_ARTICLE = regex.compile(r"\b([Aa]) (?=[aeiou])")


def _articles(sentence: str) -> str:
    """ "a" before a vowel becomes "an" ("A owl" -> "An owl")."""
    return _ARTICLE.sub(r"\1n ", sentence)


def _capitalised(sentence: str) -> str:
    return sentence[:1].upper() + sentence[1:]


_TOPICS = {
    "animal": (ANIMALS, _animal_sentences),
    "season": (SEASONS, _season_sentences),
    "place": (PLACES, _place_sentences),
}


def domain_a_texts(n: int, seed: int) -> list[str]:
    """``n`` domain-A texts (the grammar of the module docstring), drawn with ``random.Random(("A", seed))``.

    Each text: a topic and an entity, two or three different sentences about it, then with probability 1/2 one
    sentence about an entity of another topic. No text holds a digit.
    """
    check_count(n)
    rng = random.Random(f"domain-A/{check_seed(seed)}")
    topics = sorted(_TOPICS)
    texts = []
    for _ in range(n):
        topic = rng.choice(topics)
        entities, sentences = _TOPICS[topic]
        name = rng.choice(sorted(entities))
        parts = sentences(rng, name, rng.choice((2, 3)))
        if rng.random() < 0.5:
            other = rng.choice([t for t in topics if t != topic])
            other_entities, other_sentences = _TOPICS[other]
            parts += other_sentences(rng, rng.choice(sorted(other_entities)), 1)
        texts.append(_articles(" ".join(parts)))
    return texts
