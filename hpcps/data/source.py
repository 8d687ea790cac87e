"""Pick the reader named by a job's ``[data]`` section (no MPI)."""

from __future__ import annotations


_INDEXES: dict = {}


def stream_index(data_cfg, split: str, cache_dir=None):
    """The :class:`hpcps.data.lines.LineIndex` of a streamed split's files (kept per process;
    read from / saved to ``cache_dir``)."""
    from hpcps.data.lines import load_index

    path = data_cfg.path if split == "train" else data_cfg.test_path
    key = (str(path), str(cache_dir))
    if key not in _INDEXES:
        _INDEXES[key] = load_index(path, cache_dir)
    return _INDEXES[key]


def streamed(data_cfg) -> bool:
    """Whether this job's data is streamed (:func:`hpcps.data.lines.streams`, kept per
    process)."""
    from hpcps.data.lines import streams

    key = ("streams", str(data_cfg.path), str(data_cfg.test_path))
    if key not in _INDEXES:
        _INDEXES[key] = streams(data_cfg)
    return _INDEXES[key]


def load_split(data_cfg, split: str, part: int, n_parts: int, cache_dir=None):
    """Rows of ``split`` ("train" or "test") that belong to worker ``part`` of ``n_parts``.

    Parameters
    ----------
    data_cfg : hpcps.config.DataConfig
    split : {"train", "test"}
    part, n_parts : int
        Every row of the split belongs to exactly one part; a part may be empty.

    cache_dir : path-like or None
        Streamed data: where the line index of the files is kept.

    Returns
    -------
    X : scipy.sparse.csr_matrix (n, data_cfg.num_features), float64
        Streamed data (:func:`streamed`): a :class:`hpcps.data.lines.StreamedRows` of the
        part's lines (``X[rows]`` reads them), and ``y`` its ``labels``.
    y : ndarray (n,), float64 in {0, 1}

    Raises
    ------
    hpcps.data.DataError
        On malformed input (the message names the file and line). Train and test files of
        an svmlight job are read with the same ``index_base``, ``n_features`` and
        ``duplicate_indices``.
    """
    if data_cfg.format in ("svmlight", "criteo") and streamed(data_cfg):
        from hpcps.data.lines import Parser, StreamedRows
        index = stream_index(data_cfg, split, cache_dir)
        n = min(index.n_lines, data_cfg.max_rows) if data_cfg.max_rows else index.n_lines
        lo, hi = index.part_bounds(n, part, n_parts)
        X = StreamedRows(index, Parser(data_cfg), lo, hi, unit=data_cfg.shuffle_buffer,
                         depth=data_cfg.prefetch)
        return X, X.labels
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
        # no n_features (a dynamic table): None, the whole id space, named so in errors
        return read_svmlight_part(path, part, n_parts, n_features=data_cfg.n_features,
                                  index_base=data_cfg.index_base,
                                  duplicates=data_cfg.duplicate_indices)
    if data_cfg.format == "criteo":
        from hpcps.data.criteo import read_criteo_part

        path = data_cfg.path if split == "train" else data_cfg.test_path
        return read_criteo_part(path, part, n_parts, hash_bits=data_cfg.hash_bits)
    if data_cfg.format == "prepared":
        from hpcps.data.prepared import read_part

        return read_part(data_cfg.path, split, part, n_parts, max_rows=data_cfg.max_rows)
    raise ValueError(f"unknown data format {data_cfg.format!r}")


def block_partitioned(data_cfg) -> bool:
    """True when worker ``p`` of ``P`` reads block ``p`` of ``numpy.array_split`` of the split's
    rows (adult_csv, prepared; streamed data: contiguous blocks of lines whose cuts avoid the
    inside of compressed files, :meth:`hpcps.data.lineindex.LineIndex.part_bounds`), so
    partition sizes follow from the row count (and the line index); svmlight parts read in
    memory are byte ranges."""
    return data_cfg.format in ("adult_csv", "prepared") or (
        data_cfg.format in ("svmlight", "criteo") and streamed(data_cfg))
