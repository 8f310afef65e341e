"""The data layer: datasets as arrays (uint8 images or float32 features), non-IID and natural partitions,
testbeds with known clusters, and local imports (IDX files, LEAF's JSON).

Nothing here touches the network unless a loader is asked to download.

This package is the data layer's face for other code: it re-exports the names imported below from the
modules that define them. The modules of this package import from each other, never through this file.
"""

from types import ModuleType as _ModuleType

from lcfed.data.dataset import DataError, Dataset
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
from lcfed.data.sources import SOURCES, Scaling, load_dataset, to_float
from lcfed.data.split import split_train_test
from lcfed.data.testbeds import TESTBEDS, apply_testbed

#: the face: every name imported above, listed once (by its import)
__all__ = sorted(name for name, value in globals().items()
                 if not name.startswith("_") and not isinstance(value, _ModuleType))
