"""Fashion-MNIST: read the IDX files and write a prepared HDF5 data set (no MPI).

Fashion-MNIST (Xiao, Rasul & Vollgraf, "Fashion-MNIST: a Novel Image Dataset for
Benchmarking Machine Learning Algorithms", arXiv:1708.07747, 2017; MIT licence) has 60,000
training and 10,000 test images of 28 × 28 grey levels (uint8, 0 = background) in 10
classes of clothing. It is distributed as four gzip-compressed IDX files (the format of
LeCun's MNIST page, <http://yann.lecun.com/exdb/mnist/>)::

    train-images-idx3-ubyte.gz  train-labels-idx1-ubyte.gz
    t10k-images-idx3-ubyte.gz   t10k-labels-idx1-ubyte.gz

Debian ships them in the package ``dataset-fashion-mnist`` under
``/usr/share/datasets/fashion-mnist`` (:data:`DEFAULT_SOURCE`).

IDX layout (all integers big-endian): a 4-byte magic number ``0x00 0x00 TYPE NDIM`` with
``TYPE = 0x08`` (unsigned byte), then ``NDIM`` int32 dimension sizes, then the values in
C order. Images are ``NDIM = 3`` (n, 28, 28), labels ``NDIM = 1`` (n,).

:func:`prepare_fashion_mnist` writes :mod:`hpcps.data.prepared`'s layout with

- ``/train/X`` uint8 (60000, 784), ``/train/y`` int64 (60000,): the official training
  images, rows flattened in C order (row-major pixels), in the order of
  ``numpy.random.default_rng(seed).permutation(60000)`` (:data:`SHUFFLE_SEED` by default),
  so that the contiguous blocks workers read hold every class;
- ``/test/X``, ``/test/y``: the official 10,000 test images in file order;
- attributes ``dataset = "fashion-mnist"``, ``task = "classification"``,
  ``n_features = 784``, ``n_classes = 10``, ``image_shape = "28x28"``, ``shuffle_seed``,
  ``source`` (the directory read) and ``source_sha256`` (SHA-256 of the concatenated
  SHA-256 hex digests of the four files, in the order of :data:`FILES`).
"""

from __future__ import annotations

import gzip
import hashlib
import zlib
from pathlib import Path

import numpy as np

from hpcps.data import DataError

#: Where ``apt-get install dataset-fashion-mnist`` puts the files.
DEFAULT_SOURCE = Path("/usr/share/datasets/fashion-mnist")
#: The four source files: ``{split: (images, labels)}``.
FILES = {
    "train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
    "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"),
}
#: Default seed of the training-row shuffle.
SHUFFLE_SEED = 0
N_CLASSES = 10
IMAGE_SHAPE = (28, 28)
CLASS_NAMES = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt",
               "Sneaker", "Bag", "Ankle boot")

_UBYTE = 0x08


def read_idx(path, ndim: int) -> np.ndarray:
    """Read one gzip-compressed IDX file of unsigned bytes.

    Parameters
    ----------
    path : str or os.PathLike
        A ``.gz`` IDX file (an uncompressed file is also accepted, detected by its first
        two bytes).
    ndim : int
        Expected number of dimensions (3 for images, 1 for labels).

    Returns
    -------
    ndarray, uint8, shape given by the file's header

    Raises
    ------
    hpcps.data.DataError
        Missing or unreadable file, corrupt gzip stream, wrong magic number (not unsigned
        bytes, or not ``ndim`` dimensions), or a payload whose length differs from the
        product of the header's sizes; the message names the file.
    """
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise DataError(f"{path}: cannot read ({e.strerror or e}); install it with "
                        "`apt-get install dataset-fashion-mnist` or pass --from DIR") from None
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError, zlib.error) as e:
            raise DataError(f"{path}: corrupt gzip stream ({e})") from None
    if len(raw) < 4:
        raise DataError(f"{path}: {len(raw)} bytes, too short for an IDX header")
    zero, dtype, nd = int.from_bytes(raw[:2], "big"), raw[2], raw[3]
    if zero != 0 or dtype != _UBYTE or nd != ndim:
        raise DataError(f"{path}: bad IDX magic number 0x{raw[:4].hex()} (expected "
                        f"0x000008{ndim:02x}: unsigned bytes, {ndim} dimension(s))")
    head = 4 + 4 * ndim
    if len(raw) < head:
        raise DataError(f"{path}: {len(raw)} bytes, too short for an IDX header of {ndim} "
                        "dimension(s)")
    shape = tuple(int(d) for d in np.frombuffer(raw, dtype=">u4", count=ndim, offset=4))
    expected = int(np.prod(shape, dtype=np.int64))
    if len(raw) - head != expected:
        raise DataError(f"{path}: header says shape {shape} ({expected} bytes of data) but the "
                        f"file holds {len(raw) - head} bytes after the header")
    return np.frombuffer(raw, dtype=np.uint8, offset=head).reshape(shape)


def read_split(src_dir, split: str):
    """The images and labels of one split, validated against each other.

    Parameters
    ----------
    src_dir : str or os.PathLike
        Directory holding the files of :data:`FILES`.
    split : {"train", "test"}

    Returns
    -------
    X : ndarray uint8 (n, 784), pixels of each image in row-major order
    y : ndarray int64 (n,), labels in ``[0, 10)``

    Raises
    ------
    hpcps.data.DataError
        As :func:`read_idx`; also images that are not 28 × 28, image and label files of
        different lengths (names both), or a label outside ``[0, 10)`` (names the file and
        the item index).
    """
    src_dir = Path(src_dir)
    img_name, lab_name = FILES[split]
    img_path, lab_path = src_dir / img_name, src_dir / lab_name
    images = read_idx(img_path, 3)
    labels = read_idx(lab_path, 1)
    if images.shape[1:] != IMAGE_SHAPE:
        raise DataError(f"{img_path}: images are {images.shape[1]}x{images.shape[2]}, "
                        f"expected {IMAGE_SHAPE[0]}x{IMAGE_SHAPE[1]}")
    if images.shape[0] != labels.shape[0]:
        raise DataError(f"{img_path} has {images.shape[0]} images but {lab_path} has "
                        f"{labels.shape[0]} labels")
    bad = np.flatnonzero(labels >= N_CLASSES)
    if bad.size:
        raise DataError(f"{lab_path}: item {bad[0]} has label {labels[bad[0]]}, expected 0..."
                        f"{N_CLASSES - 1}")
    return images.reshape(images.shape[0], -1), labels.astype(np.int64)


def source_digest(src_dir) -> str:
    """SHA-256 (hex) of the concatenated SHA-256 hex digests of the four files in
    :data:`FILES` order — one fingerprint of the source that a prepared file records."""
    from hpcps.data.prepared import sha256_file

    h = hashlib.sha256()
    for split in ("train", "test"):
        for name in FILES[split]:
            h.update(sha256_file(Path(src_dir) / name).encode())
    return h.hexdigest()


def prepare_fashion_mnist(src_dir=DEFAULT_SOURCE, out="data/fashion-mnist.h5",
                          seed: int = SHUFFLE_SEED) -> Path:
    """Read the four IDX files of ``src_dir`` and write the prepared HDF5 file ``out``.

    Layout: see the module docstring and :mod:`hpcps.data.prepared`. The file is written
    atomically (:func:`hpcps.data.prepared.write_prepared`).

    Parameters
    ----------
    src_dir : str or os.PathLike
        Directory holding the files of :data:`FILES` (:data:`DEFAULT_SOURCE`).
    out : str or os.PathLike
        Output file; parent directories are created.
    seed : int
        Seed of the training-row permutation (numpy PCG64).

    Returns
    -------
    pathlib.Path
        ``out``.

    Raises
    ------
    hpcps.data.DataError
        A file is missing, unreadable or malformed (see :func:`read_split`); the message
        names it.
    """
    from hpcps.data.prepared import write_prepared

    src_dir = Path(src_dir)
    if not src_dir.is_dir():
        raise DataError(f"{src_dir}: no such directory (Fashion-MNIST's IDX files: "
                        "`apt-get install dataset-fashion-mnist`, or pass --from DIR)")
    Xtr, ytr = read_split(src_dir, "train")
    Xte, yte = read_split(src_dir, "test")
    perm = np.random.default_rng(seed).permutation(Xtr.shape[0])
    attrs = {
        "dataset": "fashion-mnist",
        "task": "classification",
        "n_features": int(Xtr.shape[1]),
        "n_classes": N_CLASSES,
        "image_shape": f"{IMAGE_SHAPE[0]}x{IMAGE_SHAPE[1]}",
        "shuffle_seed": int(seed),
        "source": str(src_dir.resolve()),
        "source_sha256": source_digest(src_dir),
    }
    return write_prepared(out, {"train": (Xtr[perm], ytr[perm]), "test": (Xte, yte)}, attrs)
