"""Online sequence packing: several short sequences share one fixed-length row.

Best-fit decreasing over a histogram of free space, in the spirit of Krell et al.'s
shortest-pack-first histogram packing: sequences are taken longest first, and each goes
into the open row whose free space is the smallest that still fits it (found with one
array scan of the free-space histogram), else it opens a new row. A row closes when it
holds `max_per_row` sequences. The masked-LM slots of a row are a second capacity.
"""

from __future__ import annotations

import numpy as np


def pack(lengths: np.ndarray, predictions: np.ndarray, row_len: int, max_per_row: int,
         row_predictions: int) -> list[list[int]]:
    """Rows as lists of sequence indices; every index appears in exactly one row."""
    if lengths.size and (lengths.max() > row_len or predictions.max() > row_predictions):
        raise ValueError("a sequence is longer than a row (or has more predictions than a row holds)")
    rows: list[list[int]] = []
    free: list[int] = []
    free_predictions: list[int] = []
    open_at: list[list[int]] = [[] for _ in range(row_len + 1)]  # free space -> open rows
    has_open = np.zeros(row_len + 1, dtype=bool)
    for index in np.argsort(-lengths, kind="stable"):
        index = int(index)
        need, need_pred = int(lengths[index]), int(predictions[index])
        row = _best_fit(open_at, has_open, free_predictions, need, need_pred)
        if row is None:
            row = len(rows)
            rows.append([])
            free.append(row_len)
            free_predictions.append(row_predictions)
        else:
            open_at[free[row]].remove(row)
            has_open[free[row]] = bool(open_at[free[row]])
        rows[row].append(index)
        free[row] -= need
        free_predictions[row] -= need_pred
        if len(rows[row]) < max_per_row and free[row] > 0:
            open_at[free[row]].append(row)
            has_open[free[row]] = True
    return rows


def _best_fit(open_at: list[list[int]], has_open: np.ndarray, free_predictions: list[int], need: int,
              need_pred: int) -> int | None:
    space = need
    while True:
        hits = np.flatnonzero(has_open[space:])
        if not hits.size:
            return None
        space += int(hits[0])
        for row in open_at[space]:
            if free_predictions[row] >= need_pred:
                return row
        space += 1
