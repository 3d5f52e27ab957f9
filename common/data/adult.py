"""UCI Adult (Census Income) from the original CSV files (numpy + csv, no pandas).

Files: `<data-dir>/adult/adult.data` (train) and `<data-dir>/adult/adult.test`
(test), the UCI originals. Each record has 15 comma-separated fields (a space
follows each comma): age, workclass, fnlwgt, education, education-num,
marital-status, occupation, relationship, race, sex, capital-gain,
capital-loss, hours-per-week, native-country, income.

Cleaning, in this order:

1. `adult.test` starts with the non-data line "|1x3 Cross validator": lines
   starting with "|" are skipped. Blank lines (both files end with one) are
   skipped. Fields are stripped of surrounding spaces.
2. Test labels end in "." ("<=50K." / ">50K."); the trailing "." is stripped.
   Label 1 = ">50K", 0 = "<=50K" (int64). Any other label is an error.
3. Rows with a missing value ("?") in any field are dropped: 32,561 -> 30,162
   train rows and 16,281 -> 15,060 test rows.

The readers are for the UCI originals: a file with another number of records
(a truncated copy), a numeric field that is not a finite number, an unknown
label or a line of the wrong shape raises DataFileCorrupt naming the file.

Encoding (fitted on the cleaned train rows only, applied to both splits):

- The 6 numeric columns, in file order (age, fnlwgt, education-num,
  capital-gain, capital-loss, hours-per-week), are standardised with the train
  mean and population std (ddof = 0); a zero std leaves the column centred.
- The 8 categorical columns, in file order (workclass, education,
  marital-status, occupation, relationship, race, sex, native-country), are
  one-hot encoded with the vocabulary of values seen in the cleaned train
  rows, sorted alphabetically. A test value not in that vocabulary encodes as
  all zeros in its block.
- Feature vector = the 6 standardised numerics, then the 8 one-hot blocks in
  the order above. With the UCI files this gives 6 + 98 = 104 float32
  features (block sizes 7, 16, 7, 14, 6, 5, 2, 41); `meta["feature_names"]`
  names every column ("age", "workclass=Private", ...).
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

from .errors import DataFileCorrupt, require_file
from .provenance import file_records
from .splits import Splits

FOLDER = "adult"
TRAIN_FILE = "adult.data"
TEST_FILE = "adult.test"
COLUMNS = (
    "age", "workclass", "fnlwgt", "education", "education-num", "marital-status",
    "occupation", "relationship", "race", "sex", "capital-gain", "capital-loss",
    "hours-per-week", "native-country", "income",
)
NUMERIC = ("age", "fnlwgt", "education-num", "capital-gain", "capital-loss", "hours-per-week")
CATEGORICAL = ("workclass", "education", "marital-status", "occupation", "relationship", "race",
               "sex", "native-country")
POSITIVE, NEGATIVE = ">50K", "<=50K"
RECORDS = {TRAIN_FILE: 32_561, TEST_FILE: 16_281}  # the UCI originals' record counts
_NUMERIC_AT = tuple(COLUMNS.index(c) for c in NUMERIC)


MAX_NUMERIC = 1e12  # far above every UCI value (fnlwgt < 1.5e6); standardising 48,842 of them stays finite


def check_fields(fields: list[str], path: str | Path, lineno: int) -> None:
    """Raise DataFileCorrupt unless `fields` is one well-formed record (label already stripped of '.');
    a numeric '?' is refused too (the UCI files have none, and no encoding is defined for it)."""
    if len(fields) != len(COLUMNS):
        raise DataFileCorrupt(path, "adult", f"line {lineno}: expected {len(COLUMNS)} fields, got {len(fields)}")
    if fields[-1] not in (POSITIVE, NEGATIVE):
        raise DataFileCorrupt(path, "adult", f"line {lineno}: unexpected income label {fields[-1]!r}")
    for i in _NUMERIC_AT:
        try:
            ok = abs(float(fields[i])) <= MAX_NUMERIC  # also refuses NaN; beyond it the column's mean overflows
        except ValueError:
            ok = False
        if not ok:
            raise DataFileCorrupt(path, "adult", f"line {lineno}: {COLUMNS[i]} = {fields[i]!r} is not a number "
                                  f"of at most {MAX_NUMERIC:g} in size")


def check_records(path: str | Path, n: int) -> None:
    """Raise DataFileCorrupt unless the file held the UCI original's number of records."""
    expected = RECORDS[Path(path).name]
    if n != expected:
        raise DataFileCorrupt(path, "adult", f"{n} records where the UCI original has {expected} (truncated copy?)")


def records(path: str | Path):
    """(line number, stripped fields) of every record; blank and '|' lines skipped."""
    try:
        with open(path, newline="", encoding="utf-8") as fh:
            for lineno, record in enumerate(csv.reader(fh, skipinitialspace=True), start=1):
                if not record or all(not f.strip() for f in record) or record[0].startswith("|"):
                    continue
                yield lineno, [f.strip() for f in record]
    except (UnicodeDecodeError, csv.Error) as e:  # binary garbage, NUL bytes
        raise DataFileCorrupt(path, "adult", f"not a text CSV file ({e})") from None


def read_rows(path: str | Path) -> tuple[list[list[str]], int]:
    """Parse one Adult file -> (clean rows of 15 stripped strings, number of rows dropped for '?')."""
    rows, dropped = [], 0
    for lineno, fields in records(path):
        if len(fields) == len(COLUMNS) and "?" in fields:
            dropped += 1
            continue
        fields[-1] = fields[-1].rstrip(".")
        check_fields(fields, path, lineno)
        rows.append(fields)
    return rows, dropped


def _columns(rows: list[list[str]]) -> dict[str, list[str]]:
    return {name: [r[i] for r in rows] for i, name in enumerate(COLUMNS)}


def _encode(cols: dict[str, list[str]], mean: np.ndarray, std: np.ndarray,
            vocab: dict[str, list[str]]) -> tuple[np.ndarray, np.ndarray]:
    n = len(cols["income"])
    numeric = np.array([cols[c] for c in NUMERIC], dtype=np.float64).T.reshape(n, len(NUMERIC))
    blocks = [(numeric - mean) / std]
    for c in CATEGORICAL:
        index = {v: j for j, v in enumerate(vocab[c])}
        onehot = np.zeros((n, len(vocab[c])), dtype=np.float64)
        pos = np.array([index.get(v, -1) for v in cols[c]], dtype=np.int64)
        known = pos >= 0
        onehot[np.flatnonzero(known), pos[known]] = 1.0
        blocks.append(onehot)
    x = np.concatenate(blocks, axis=1).astype(np.float32)
    y = np.array([v == POSITIVE for v in cols["income"]], dtype=np.int64)
    return x, y


def load_adult(data_dir: str | Path) -> Splits:
    folder = Path(data_dir) / FOLDER
    train_path = require_file(folder / TRAIN_FILE, "adult")
    test_path = require_file(folder / TEST_FILE, "adult")
    train_rows, train_dropped = read_rows(train_path)
    test_rows, test_dropped = read_rows(test_path)
    check_records(train_path, len(train_rows) + train_dropped)
    check_records(test_path, len(test_rows) + test_dropped)
    if not train_rows:
        raise ValueError(f"{train_path}: no complete rows")
    train, test = _columns(train_rows), _columns(test_rows)

    numeric = np.array([train[c] for c in NUMERIC], dtype=np.float64).T
    mean = numeric.mean(axis=0)
    std = numeric.std(axis=0)
    std[std == 0] = 1.0
    vocab = {c: sorted(set(train[c])) for c in CATEGORICAL}

    x_train, y_train = _encode(train, mean, std, vocab)
    x_test, y_test = _encode(test, mean, std, vocab)
    names = list(NUMERIC) + [f"{c}={v}" for c in CATEGORICAL for v in vocab[c]]
    unknown = {c: sorted(set(test[c]) - set(vocab[c])) for c in CATEGORICAL}
    return Splits(
        x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test,
        num_classes=2, name="adult",
        meta={
            "feature_names": names,
            "numeric_mean": mean.tolist(),
            "numeric_std": std.tolist(),
            "vocabulary": vocab,
            "unknown_test_categories": {c: v for c, v in unknown.items() if v},
            "dropped_rows": {"train": train_dropped, "test": test_dropped},
            "folder": str(folder),
            "files": file_records([train_path, test_path]),
        },
    )
