"""The data layer: datasets as arrays (uint8 images or float32 features), non-IID and natural partitions,
testbeds with known clusters, and local imports (IDX files, LEAF's JSON).

Nothing here touches the network unless a loader is asked to download.
"""

from lcfed.data.formats import FILE_FORMATS, FileSource, load_file
from lcfed.data.importer import DEFAULT_IDX_DIRS, IDX_DIRS_ENV, import_idx
from lcfed.data.leaf import import_leaf
from lcfed.data.partition import (
    PARTITIONERS,
    Partition,
    PartitionParams,
    make_partition,
    partition_schemes,
    split_validation,
)
from lcfed.data.partition_stats import format_groups, format_stats, partition_stats
from lcfed.data.schemes import (
    DIRICHLET_CONVENTIONS,
    USER_SELECTIONS,
    PartitionError,
    dirichlet,
    dirichlet_niid_bench,
    dominant_label,
    group_layout,
    iid,
    natural,
    pathological,
)
from lcfed.data.sources import SOURCES, DataError, Dataset, Scaling, load_dataset, to_float
from lcfed.data.split import split_train_test
from lcfed.data.testbeds import TESTBEDS, apply_testbed

__all__ = [
    "DEFAULT_IDX_DIRS",
    "DIRICHLET_CONVENTIONS",
    "FILE_FORMATS",
    "IDX_DIRS_ENV",
    "PARTITIONERS",
    "SOURCES",
    "TESTBEDS",
    "USER_SELECTIONS",
    "DataError",
    "Dataset",
    "FileSource",
    "Partition",
    "PartitionError",
    "PartitionParams",
    "apply_testbed",
    "dirichlet",
    "dirichlet_niid_bench",
    "dominant_label",
    "format_groups",
    "format_stats",
    "group_layout",
    "iid",
    "import_idx",
    "import_leaf",
    "load_dataset",
    "load_file",
    "make_partition",
    "natural",
    "partition_schemes",
    "partition_stats",
    "pathological",
    "split_train_test",
    "split_validation",
    "Scaling",
    "to_float",
]
