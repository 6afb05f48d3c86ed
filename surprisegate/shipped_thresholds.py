"""The shipped operating point, written from `surprisegate calibrate` on the dev labels.

Source: 2486 labelled replies of SmolLM2-135M-Instruct (factqa_dev 1309, wikidata_cloze_dev 1027,
arith_dev 150), `surprisegate calibrate --labels ... --objective recall --min-precision 0.90`. Cross-validated
AUROC 0.840; precision 0.901 at recall 0.809 (trigger rate 0.676).
Chosen by the A/B trade-off (results/tradeoff/factqa_dev): factqa 0.74 with 1% regressions, where the
0.85 point gets 0.78 with 2% and the highest-precision point 0.51.
Recalibrate for another model: the numbers are this model's.
"""

SIGNAL = "entropy"
STATISTIC = "mean"
WINDOW = 4
MIN_TOKENS = 4
THRESHOLD = 1.9211
# Per kind of question (signals.question_kind), in bits of the window statistic.
KIND_THRESHOLDS = {
    "atomic number": -1.2634,
    "capital": 1.0303,
    "capital state": 0.8876,
    "chemical element has symbol": 0.5607,
    "chemical symbol": 3.955,
    "continent": 5.6196,
    "continent located": 4.4641,
    "country": 0.2218,
    "country citizenship": -0.6927,
    "country city": 6.9852,
    "divided": -0.0111,
    "eye color": 3.4062,
    "genre": 2.9381,
    "instrument": 0.5653,
    "international telephone calling code": -6.1429,
    "language": -6.5016,
    "language used": 6.5436,
    "minus": -1.1485,
    "name one country shares": 5.5615,
    "native language": 2.6379,
    "official currency": 1.3426,
    "official language": 8.2189,
    "plus": -4.5622,
    "population": -0.9578,
    "religion": -1.6004,
    "sport played": 1.5607,
    "times": -4.6005,
    "two-letter postal abbreviation": 3.2773,
    "year discovered": -5.0125,
    "year state": -0.7012,
}

# Sentence scope (claim_scope): a sentence that speaks of what was asked is grounded when its highest
# claim-token value exceeds this (bits of the signal above). Fitted on half A of longform_dev (the 93
# prompts random.Random(0) puts first, off replies at 160 tokens): the highest threshold that still fires on
# >= 95% of its sentences stating a wrong claim (87 of 91, 144 of 264 sentences fired); on half B, not
# read while fitting, 88 of 96 (155 of 281 fired). scripts/fit_sentence_threshold.py
SENTENCE_THRESHOLD = 1.5
