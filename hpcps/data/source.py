"""Pick the reader named by a job's ``[data]`` section (no MPI)."""

from __future__ import annotations


def load_split(data_cfg, split: str, part: int, n_parts: int):
    """Rows of ``split`` ("train" or "test") that belong to worker ``part`` of ``n_parts``.

    Parameters
    ----------
    data_cfg : hpcps.config.DataConfig
    split : {"train", "test"}
    part, n_parts : int
        Every row of the split belongs to exactly one part; a part may be empty.

    Returns
    -------
    X : scipy.sparse.csr_matrix (n, data_cfg.num_features), float64
    y : ndarray (n,), float64 in {0, 1}

    Raises
    ------
    hpcps.data.DataError
        On malformed input (the message names the file and line). Train and test files of
        an svmlight job are read with the same ``index_base``, ``n_features`` and
        ``duplicate_indices``.
    """
    if data_cfg.format == "adult_csv":
        from hpcps.data.adult import load_adult_partition

        return load_adult_partition(
            data_cfg.path, split, part, n_parts,
            hash_bits=data_cfg.hash_bits, numeric_bins=data_cfg.numeric_bins,
            crosses=data_cfg.crosses, test_fraction=data_cfg.test_fraction,
            split_seed=data_cfg.split_seed, max_rows=data_cfg.max_rows,
        )
    if data_cfg.format == "svmlight":
        from hpcps.data.svmlight import read_svmlight_part

        path = data_cfg.path if split == "train" else data_cfg.test_path
        return read_svmlight_part(path, part, n_parts, n_features=data_cfg.num_features,
                                  index_base=data_cfg.index_base,
                                  duplicates=data_cfg.duplicate_indices)
    if data_cfg.format == "prepared":
        from hpcps.data.prepared import read_part

        return read_part(data_cfg.path, split, part, n_parts, max_rows=data_cfg.max_rows)
    raise ValueError(f"unknown data format {data_cfg.format!r}")


def block_partitioned(data_cfg) -> bool:
    """True when worker ``p`` of ``P`` reads block ``p`` of ``numpy.array_split`` of the split's
    rows (adult_csv, prepared), so partition sizes follow from the row count alone
    (:func:`hpcps.data.partition_rows.block_bounds`); svmlight parts are byte ranges."""
    return data_cfg.format in ("adult_csv", "prepared")
