"""The shipped operating point, written from `surprisegate calibrate` on the dev labels.

Source: 1859 labelled replies of SmolLM2-135M-Instruct (factqa_dev, wikidata_cloze_dev[:400],
150 arith_dev items), `surprisegate calibrate --labels ... --min-precision 0.85`. Cross-validated
AUROC 0.827; precision 0.852 at recall 0.838.
Recalibrate for another model: the numbers are this model's.
"""

SIGNAL = "entropy"
STATISTIC = "mean"
WINDOW = 4
MIN_TOKENS = 4
THRESHOLD = 1.0659
# Per kind of question (signals.question_kind), in bits of the window statistic.
KIND_THRESHOLDS = {
    'atomic number': -2.2662,
    'capital': -0.3996,
    'capital state': -0.4177,
    'chemical element has symbol': -0.9773,
    'chemical symbol': 2.72,
    'continent located': 3.233,
    'country': -2.8,
    'country citizenship': -2.3169,
    'country city': 5.662,
    'divided': -0.4782,
    'instrument': 0.1376,
    'international telephone calling code': -5.89,
    'language': -7.4381,
    'minus': -1.5174,
    'name one country shares': 4.6325,
    'native language': 0.5845,
    'official currency': 0.0649,
    'official language': 5.7594,
    'plus': -4.6224,
    'population': -1.7781,
    'religion': -2.0054,
    'times': -4.7246,
    'two-letter postal abbreviation': 1.9564,
    'year discovered': -5.7585,
    'year state': -1.6912,
}
