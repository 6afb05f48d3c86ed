"""The phrasing set (issue 45): the dev sets' questions asked as people ask them, in families of wording.

    python scripts/phrasings.py --out results/phrasings/sets

Every dev item keeps its id, answers, subject, relation and evidence; only the words of the question change.
Each family has two or three wordings per relation, picked by a seeded draw per item, so that no family is
one template either. Families:

- conversational: "Hey, do you know what the capital of Chad is?" (tuning: may be read while tuning)
- extra_words: the question inside a sentence of context and thanks (tuning)
- lowercase: lower case, no question mark, terse: "capital of chad" (HELD OUT: never read while tuning)
- indirect: the need behind the question: "My friend is moving to Chad. Which city is its capital?" (HELD OUT)

Paragraph prompts (longform) get the same families: the asked items in other words and other orders.
Files: factqa_<family>.jsonl and longform_<family>.jsonl, each row as the dev row with "question" replaced and
"family" and "template_question" added.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TUNING = ("conversational", "extra_words")
HELD_OUT = ("lowercase", "indirect")
FAMILIES = TUNING + HELD_OUT

# {s}: the subject as the dataset names it. Two or three wordings per family and relation.
FACT: dict[str, dict[str, list[str]]] = {
    "capital": {
        "conversational": ["Hey, do you know what the capital of {s} is?", "So which city is {s}'s capital?"],
        "extra_words": [
            "I'm putting together a geography quiz and need one answer: what is the capital city of {s}? Thanks!",
            "Quick question before my exam tomorrow, which city serves as the capital of {s}?",
        ],
        "lowercase": ["capital of {s}", "{s} capital city"],
        "indirect": [
            "My friend is moving to {s} next month and wants to live in the capital. Which city should she look at?",
            "I'm writing a letter to the government of {s}. In which city does it sit?",
        ],
    },
    "continent": {
        "conversational": ["Do you know which continent {s} is on?", "So, {s}: what continent is that in?"],
        "extra_words": [
            "For my kid's homework on world maps, could you tell me the continent where {s} lies? Thanks a lot.",
            "I always forget this one, sorry: which continent is {s} part of?",
        ],
        "lowercase": ["{s} continent", "continent of {s}"],
        "indirect": [
            "I'm planning a trip to {s} and need to know which continent to buy a travel guide for.",
            "My pen pal lives in {s}. On which continent would I find her on a globe?",
        ],
    },
    "currency": {
        "conversational": ["Hey, what money do they use in {s}?", "Do you know the currency of {s}?"],
        "extra_words": [
            "I'm heading abroad soon and want to be ready: what currency is used in {s}? Thank you!",
            "Before I exchange my cash at the airport, could you tell me the official currency of {s}?",
        ],
        "lowercase": ["currency of {s}", "{s} money"],
        "indirect": [
            "I'm visiting {s} next week and need to change some cash. What should I ask the bank for?",
            "My cousin sent me a few banknotes from {s}. Which currency would they be?",
        ],
    },
    "official_language": {
        "conversational": [
            "What language do people speak officially in {s}?",
            "Do you know an official language of {s}?",
        ],
        "extra_words": [
            "I'm learning languages for travel, so here's my question: what is one official language of {s}?",
            "Just curious, and sorry if this is basic: which language is official in {s}?",
        ],
        "lowercase": ["official language of {s}", "{s} language"],
        "indirect": [
            "I'm moving to {s} for work. Which official language should I start learning?",
            "A letter from the government of {s} arrived. In which official language is it likely written?",
        ],
    },
    "shares_border_with": {
        "conversational": ["Which country is right next door to {s}?", "Can you name a neighbour of {s}?"],
        "extra_words": [
            "I'm sketching a map for a school project and need one thing: a country that borders {s} on land.",
            "Quick one for a trivia night, please: name a country sharing a land border with {s}.",
        ],
        "lowercase": ["neighbouring country of {s}", "{s} borders"],
        "indirect": [
            "I'm driving out of {s} by road. Which country could I cross into?",
            "My family lives in {s} and wants to visit the next country over by land. Which one could that be?",
        ],
    },
    "calling_code": {
        "conversational": ["What's the phone code for calling {s}?", "Do you know the dialing code of {s}?"],
        "extra_words": [
            "I have to phone a hotel abroad tonight, so I need this: what is the international calling code of {s}?",
            "Sorry to bother you with this, but which country calling code does {s} use?",
        ],
        "lowercase": ["calling code {s}", "{s} phone prefix"],
        "indirect": [
            "I need to call my friend's number in {s} from abroad. What prefix do I dial first?",
            "A missed call came from {s}. Which country code would the number start with?",
        ],
    },
    "population": {
        "conversational": ["How many people live in {s}?", "Do you know roughly the population of {s}?"],
        "extra_words": [
            "For a report I'm writing on demographics, could you give me the population of {s}? Much appreciated.",
            "I'm comparing countries for a class, so: what is the number of inhabitants of {s}?",
        ],
        "lowercase": ["population of {s}", "{s} population"],
        "indirect": [
            "I'm sizing a market for our product in {s}. How many people would it reach in total?",
            "My teacher asked how big {s} is in people. What number should I give?",
        ],
    },
    "city_country": {
        "conversational": ["Where's {s}, which country?", "Do you know what country {s} is in?"],
        "extra_words": [
            "I saw {s} on a shipping label today and got curious: which country is that city in?",
            "Sorry, geography was never my thing. The city of {s}: which country does it belong to?",
        ],
        "lowercase": ["{s} country", "which country is {s} in"],
        "indirect": [
            "I've booked a flight to {s}. Which country's visa rules should I check?",
            "My colleague is at a conference in {s}. Which country is she in right now?",
        ],
    },
    "us_state_capital": {
        "conversational": ["What's the capital of {s}?", "Do you know which city is the capital of {s}?"],
        "extra_words": [
            "My daughter is learning the fifty states, so help us out: what is the capital of {s}?",
            "Quick civics question for a quiz I'm writing: which city is the state capital of {s}?",
        ],
        "lowercase": ["{s} state capital", "capital of {s}"],
        "indirect": [
            "I want to visit the state legislature of {s}. Which city do I travel to?",
            "My uncle works for the state government of {s}, in its capital. Which city is that?",
        ],
    },
    "us_statehood_year": {
        "conversational": ["When did {s} become a state?", "Do you know what year {s} joined the Union?"],
        "extra_words": [
            "I'm making a timeline for history class, so I need the year {s} was admitted to the Union. Thanks!",
            "Just settling a bet with a friend: in which year did {s} achieve statehood?",
        ],
        "lowercase": ["{s} statehood year", "year {s} became a state"],
        "indirect": [
            "We're planning a party for the anniversary of {s} joining the Union. Which year are we celebrating?",
            "My grandfather says {s} is older as a state than ours. Which year was it admitted?",
        ],
    },
    "us_state_abbreviation": {
        "conversational": ["What's the postal code for {s}, the two letters?", "How do you abbreviate {s} on mail?"],
        "extra_words": [
            "I'm addressing a stack of envelopes tonight and need this: the two-letter postal abbreviation of {s}.",
            "Sorry for the basic question, but which two letters stand for {s} in a US address?",
        ],
        "lowercase": ["{s} postal abbreviation", "{s} two letter code"],
        "indirect": [
            "I'm filling in a shipping form to {s} and the state box only takes two letters. What do I write?",
            "My friend's address in {s} needs the state code. Which two letters is it?",
        ],
    },
    "element_symbol": {
        "conversational": ["What's the symbol for {s}?", "Do you know the chemical symbol of {s}?"],
        "extra_words": [
            "Studying for my chemistry test, and I keep mixing this up: what is the symbol of {s}?",
            "For a periodic table poster I'm making, which letters stand for {s}?",
        ],
        "lowercase": ["symbol of {s}", "{s} chemical symbol"],
        "indirect": [
            "I'm labelling a jar of {s} for the lab shelf. Which symbol goes on the label?",
            "My formula needs {s} in it. How do I write that element?",
        ],
    },
    "element_from_symbol": {
        "conversational": ["What element is {s}?", "Do you know which element has the symbol {s}?"],
        "extra_words": [
            "I found {s} in a chemistry worksheet and can't place it. Which element does that symbol stand for?",
            "Quick help for my homework, please: the symbol {s} belongs to which chemical element?",
        ],
        "lowercase": ["element with symbol {s}", "{s} element name"],
        "indirect": [
            "A bottle in the lab is marked only {s}. Which element is inside?",
            "My formula sheet writes {s}. What element should I read there?",
        ],
    },
    "atomic_number": {
        "conversational": ["What's the atomic number of {s}?", "Do you know how many protons {s} has?"],
        "extra_words": [
            "I'm filling in a periodic table for class and need one number: the atomic number of {s}. Thanks!",
            "Sorry, my textbook is at school: what atomic number does {s} have?",
        ],
        "lowercase": ["atomic number of {s}", "{s} atomic number"],
        "indirect": [
            "I'm placing {s} on a blank periodic table. In which numbered square does it go?",
            "My physics problem needs the proton count of a {s} nucleus. What is it?",
        ],
    },
    "discovery_year": {
        "conversational": ["When was {s} discovered?", "Do you know what year {s} was first found?"],
        "extra_words": [
            "For a history-of-science timeline I'm drawing, I need the year {s} was discovered. Thank you!",
            "Curious after a documentary last night: in which year was the element {s} discovered?",
        ],
        "lowercase": ["{s} discovery year", "year {s} was discovered"],
        "indirect": [
            "Our museum exhibit on {s} opens with the year it was first identified. Which year goes on the sign?",
            "My essay starts with when {s} was found. Which year should I write?",
        ],
    },
}

# Paragraph prompts: the asked items in the family's words, in a drawn order.
ITEM: dict[str, str] = {
    "capital": "its capital",
    "continent": "the part of the world it lies in",
    "calling_code": "the code you dial to phone it",
    "population": "how many people live there",
    "currency": "the money used there",
    "official_language": "the languages that are official",
    "shares_border_with": "which countries are next to it",
    "element_symbol": "its symbol",
    "atomic_number": "its atomic number",
    "discovery_year": "when it was discovered",
    "us_state_capital": "its capital city",
    "us_state_abbreviation": "its two-letter postal code",
    "us_statehood_year": "the year it was admitted to the Union",
}
LONG: dict[str, list[str]] = {
    "conversational": [
        "Can you tell me a bit about {s}? I'd like to know {items}.",
        "What's {s} like? Mention {items}.",
    ],
    "extra_words": [
        "I'm preparing notes for a class talk and would love a short paragraph on {s}, covering {items}. Thanks!",
        "For a travel blog post I'm drafting, please describe {s} in a few sentences: {items}.",
    ],
    "lowercase": ["paragraph on {s}: {items}", "describe {s} - {items}"],
    "indirect": [
        "My friend is moving to {s} and knows nothing about it. Write her a few sentences that cover {items}.",
        "I'm giving a two-minute talk about {s} tomorrow. Write what I should say, including {items}.",
    ],
}


def subject_of(row: dict, family: str) -> str:
    subject = row["subject"]
    return subject.lower() if family == "lowercase" and row.get("relation") != "element_from_symbol" else subject


def fact_question(row: dict, family: str, rng: random.Random) -> str:
    return rng.choice(FACT[row["relation"]][family]).format(s=subject_of(row, family))


def long_question(row: dict, family: str, rng: random.Random) -> str:
    asked = [ITEM[c["relation"]] for c in row["claims"]]
    rng.shuffle(asked)
    items = ", ".join(asked[:-1]) + (" and " if len(asked) > 1 else "") + asked[-1]
    text = rng.choice(LONG[family]).format(s=subject_of(row, family), items=items)
    return text.lower() if family == "lowercase" else text


def write(rows: list[dict], family: str, make, out: Path, seed: int) -> None:
    with out.open("w") as sink:
        for row in rows:
            rng = random.Random(f"{seed}:{family}:{row['id']}")
            sink.write(
                json.dumps(
                    row
                    | {
                        "question": make(row, family, rng),
                        "family": family,
                        "held_out": family in HELD_OUT,
                        "template_question": row["question"],
                    }
                )
                + "\n"
            )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=str(ROOT.parent / "shared/data"))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(ROOT / "results/phrasings/sets"))
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    data = Path(args.data)
    facts = [json.loads(line) for line in (data / "factqa_dev.jsonl").open()]
    longs = [json.loads(line) for line in (data / "longform_dev.jsonl").open()]
    for family in FAMILIES:
        write(facts, family, fact_question, out / f"factqa_{family}.jsonl", args.seed)
        write(longs, family, long_question, out / f"longform_{family}.jsonl", args.seed)
        print(f"{family}: {len(facts)} fact questions, {len(longs)} paragraph prompts", flush=True)


if __name__ == "__main__":
    main()
