"""The data layer: datasets as arrays (uint8 images or float32 features), non-IID partitions, and local
IDX import.

Nothing here touches the network unless a loader is asked to download.
"""

from lcfed.data.formats import FILE_FORMATS, FileSource, load_file
from lcfed.data.importer import DEFAULT_IDX_DIRS, IDX_DIRS_ENV, import_idx
from lcfed.data.partition import (
    DIRICHLET_CONVENTIONS,
    PARTITIONERS,
    Partition,
    PartitionError,
    PartitionParams,
    dirichlet,
    dirichlet_niid_bench,
    dominant_label,
    format_stats,
    make_partition,
    partition_stats,
    pathological,
    split_train_test,
    split_validation,
)
from lcfed.data.sources import SOURCES, DataError, Dataset, Scaling, load_dataset, to_float

__all__ = [
    "DEFAULT_IDX_DIRS",
    "DIRICHLET_CONVENTIONS",
    "FILE_FORMATS",
    "IDX_DIRS_ENV",
    "PARTITIONERS",
    "SOURCES",
    "DataError",
    "Dataset",
    "FileSource",
    "Partition",
    "PartitionError",
    "PartitionParams",
    "dirichlet",
    "dirichlet_niid_bench",
    "dominant_label",
    "format_stats",
    "import_idx",
    "load_dataset",
    "load_file",
    "make_partition",
    "partition_stats",
    "pathological",
    "split_train_test",
    "split_validation",
    "Scaling",
    "to_float",
]
