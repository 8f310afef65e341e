"""Every bad input to every command is one clean error: exit 2, one line on stderr, no traceback, the
field or flag named (with a suggestion for a near-miss name), and nothing created (no tracking store,
no sweep or checkpoint directory, no output file).

Each row runs the real CLI in-process in an empty directory that is also ``$HOME``; the files a row
needs are written first and are the only ones allowed to exist afterwards.
"""

from __future__ import annotations

import gzip
import io
import shlex
import struct
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

from lcfed.config import load_config
from lcfed.run import checkpoint
from tune_jobs.cli import main

# -- rows: (id, argv, input files {relative path: text or bytes}, text (or texts) the error must contain) --

R = "run --no-track"  # run rows that would otherwise be refused for the missing store first

CONFIG_VALUES = [
    ("data.dataset=imagenet", "data.dataset"),
    ("data.dataset=5", "data.dataset"),
    ("data.partition=random", "data.partition"),
    ("data.alpha=0", "data.alpha"),
    ("data.alpha=-1", "data.alpha"),
    ("data.alpha=.inf", "data.alpha"),
    ("data.alpha=.nan", "data.alpha"),
    ("data.alpha=abc", "data.alpha"),
    ("data.alpha=[1]", "data.alpha"),
    ("data.classes_per_device=0", "data.classes_per_device"),
    ("data.classes_per_device=1.5", "data.classes_per_device"),
    ("data.num_devices=0", "data.num_devices"),
    ("data.num_devices=-5", "data.num_devices"),
    ("data.num_devices=true", "data.num_devices"),
    ("data.min_samples=1", "data.min_samples"),
    ("data.test_fraction=0", "data.test_fraction"),
    ("data.test_fraction=1", "data.test_fraction"),
    ("data.test_fraction=1.5", "data.test_fraction"),
    ("data.val_fraction=-0.1", "data.val_fraction"),
    ("data.val_fraction=1.0", "data.val_fraction"),
    ("data.holdout_fraction=-0.1", "data.holdout_fraction"),
    ("data.holdout_fraction=1.0", "data.holdout_fraction"),
    ("data.holdout_fraction=0.99", "data.holdout_fraction"),  # 20 devices x 0.99 -> all 20 held out
    ("data.holdout_fraction=0.01", "data.holdout_fraction"),  # 20 x 0.01 -> none held out
    ("data.subset=-1", "data.subset"),
    ("data.samples_per_device=[350, 50]", "data.samples_per_device"),
    ("data.samples_per_device=[1, 50]", "data.samples_per_device"),
    ("data.samples_per_device=[50]", "data.samples_per_device"),
    ("data.samples_per_device=[20.5, 50]", "data.samples_per_device"),
    ("data.primary=[0.6, 0.4]", "data.primary"),
    ("data.primary=[0.1, .inf]", "data.primary"),
    ("data.secondary=[0.5, 0.6]", "data.secondary"),
    ("data.download=maybe", "data.download"),
    ("data.bogus=1", "data.bogus"),
    ("model.name=resnet", "model.name"),
    ("model.depth=3", "model.depth"),
    ("train.rounds=0", "train.rounds"),
    ("train.rounds=2.5", "train.rounds"),
    ("train.lr=-0.1", "train.lr"),
    ("train.lr=0", "train.lr"),
    ("train.lr=inf", "train.lr"),
    ("train.lr=.nan", "train.lr"),
    ("train.batch_size=0", "train.batch_size"),
    ("train.local_steps=0", "train.local_steps"),
    ("train.local_epochs=2", "train.local_steps"),
    ("train.participation=0", "train.participation"),
    ("train.participation=1.2", "train.participation"),
    ("train.eval_every=0", "train.eval_every"),
    ("engine.kind=spark", "engine.kind"),
    ("engine.num_actors=-2", "engine.num_actors"),
    ("engine.devices_per_actor=-1", "engine.devices_per_actor"),
    ("engine.cpus_per_actor=0", "engine.cpus_per_actor"),
    ("engine.gpus_per_actor=2", "engine.gpus_per_actor"),
    ("engine.gpus=-2", "engine.gpus"),
    ("engine.gpus=.inf", "engine.gpus"),
    ("engine.actors_per_gpu=0", "engine.actors_per_gpu"),
    ("engine.placement_timeout_s=0", "engine.placement_timeout_s"),
    ("engine.torch_threads=0", "engine.torch_threads"),
    ("engine.workers=-1", "engine.workers"),
    ("engine.vectorize=sometimes", "engine.vectorize"),
    ("engine.vectorize=on", "quote the word"),
    ("engine.vectorize_max=0", "engine.vectorize_max"),
    ("engine.device=tpu", "engine.device"),
    ("engine.device=cuda", "engine.device"),
    ("engine.num_cpus=-1", "engine.num_cpus"),
    ("engine.object_store_mb=10", "engine.object_store_mb"),
    ("engine.max_failures=-1", "engine.max_failures"),
    ("tracking.enabled=maybe", "tracking.enabled"),
    ("tracking.uri=foo://bar", "tracking.uri"),
    ("tracking.uri=' '", "tracking.uri"),
    ("tracking.experiment=", "tracking.experiment"),
    ("tracking.experiment=../../x", "tracking.experiment"),
    ("tracking.experiment=/abs", "tracking.experiment"),
    ("tracking.experiment=a//b", "tracking.experiment"),
    ("tracking.experiment='a\\x'", "tracking.experiment"),
    ("tracking.run_name=''", "tracking.run_name"),
    ("tracking.run_name='a\tb'", "tracking.run_name"),
    ("checkpoint.every=0", "checkpoint.every"),
    ("checkpoint.dir=inputs/afile", "checkpoint.dir"),
    ("network.bandwidth_mbps=0", "network.bandwidth_mbps"),
    ("network.device_gflops=-1", "network.device_gflops"),
    ("seed=-3", "seed"),
    ("seed=18446744073709551616", "seed"),
    ("seed=1.5", "seed"),
    ("name=../x", "name"),
    ("name=a/b", "name"),
    ("name=.hidden", "name"),
    ("name=''", "name"),
    ("nosuch.key=1", "nosuch"),
    ("method=5", "method"),
    ("data=5", "data"),
    ("method.name=nope", "method.name"),
    ("method.mu=-1", "method.mu"),
    ("method.lam=-0.5", "method.lam"),
    ("method.num_clusters=0", "method.num_clusters"),
    ("method.num_clusters=500", "method.num_clusters"),
    ("method.rank=0", "method.rank"),
    ("method.sample_size=1", "method.sample_size"),
    ("method.refit_every=-1", "method.refit_every"),
    ("method.bogus=1", "method.bogus"),
    # near misses: the refusal also suggests the closest name
    ("method.mu_=1", "method.mu_: got 1; unknown field; allowed: mu, lam, num_clusters, rank, sample_size, "
                     "refit_every, coverage; did you mean method.mu?"),
    ("trian.rounds=3", "trian: got {'rounds': 3}; unknown section; allowed: checkpoint, data, devices, engine, method, "
                       "model, name, network, privacy, seed, tracking, train; did you mean train?"),
    ("method.name=lcfd", ("method.name: got 'lcfd'; unknown method 'lcfd': one of [", "path; did you mean lcfed?")),
    ("data.dataset=mnsit", ("data.dataset: got 'mnsit'; unknown dataset 'mnsit': one of [", "path; did you mean mnist?")),
    # a list or mapping where a scalar belongs (and the reverse): refused by type, not a TypeError later
    ("method.name=[lcfed]", "method.name"),
    ("method.name={lcfed: 1}", "method.name"),
    ("name=[a, b]", "name"),
    ("seed=[1]", "seed"),
    ("seed={a: 1}", "seed"),
    ("train.lr={a: 1}", "train.lr"),
    ("train.rounds=[3]", "train.rounds"),
    ("data.dataset=[digits]", "data.dataset"),
    ("engine.kind={ray: 1}", "engine.kind"),
    ("tracking.uri=[a]", "tracking.uri"),
    ("data.primary={low: 0.1}", "data.primary"),
    ("data.samples_per_device=[[10, 20], [30, 40]]", "data.samples_per_device"),
    ("method.mu=[0.1]", "method.mu"),
    # beyond any machine: libgomp's 'Out of memory' crash, Ray's ValueError at start
    ("engine.torch_threads=100000", "engine.torch_threads"),
    ("engine.num_cpus=100000", "engine.num_cpus"),
    ("engine.object_store_mb=1000000000", "engine.object_store_mb"),
    # work that never ends (issue 39): the budget is bounded, a round stops only when it ends
    ("train.rounds=1000000", ("train.rounds: got 1000000", "<= 100,000")),
    ("train.local_steps=1000000000", ("train.local_steps: got 1000000000", "<= 100,000")),
    # found by tests/test_fuzz.py: numpy's Dirichlet draw overflows to nan; 40 images of 100,000^2 pixels
    ("data.alpha=1e308", ("data.alpha: got 1e+308", "<= 1e+06")),
    ("data.image_size=[100000, 100000]", ("data.image_size", "each 1-4096")),
]

METHOD_VALUES = [
    ("ifca", "method.num_clusters=0", "method.num_clusters"),
    ("fesem", "method.num_clusters=-1", "method.num_clusters"),
    ("cgpfl", "method.mu=-0.1", "method.mu"),
    ("fedgroup", "method.pretrain_fraction=0", "method.pretrain_fraction"),
    ("fedgroup", "method.svd_rank=-1", "method.svd_rank"),
    ("flhc", "method.linkage=median", "method.linkage"),
    ("flhc", "method.distance_threshold=-1", "method.distance_threshold"),
    ("flhc", "method.warmup_rounds=-1", "method.warmup_rounds"),
    ("perfedavg", "method.alpha=0", "method.alpha"),
    ("perfedavg", "method.variant=so", "method.variant"),
    ("clusterfl", "method.recluster_every=0", "method.recluster_every"),
    ("fedac", "method.gap_low=0.9", "method.gap"),
    ("fedac", "method.min_clusters=0", "method.min_clusters"),
    ("fedac", "method.tune_every=-1", "method.tune_every"),
    ("dcpfl", "method.window=0", "method.window"),
    ("dcpfl", "method.gamma_step=0", "method.gamma_step"),
    ("dcpfl", "method.low_ratio=-1", "method.low_ratio"),
    ("standalone", "method.mu=0.1", "method.mu"),
]



def _laughs(levels: int = 9) -> list[str]:
    """Flow-style YAML lists, each anchored and listing the one before ten times: a few lines that expand
    to 10**levels items ("billion laughs")."""
    return [f"&l0 [{', '.join(['lol'] * 10)}]"] + [f"&l{i} [{', '.join([f'*l{i - 1}'] * 10)}]"
                                                  for i in range(1, levels)]


BOMB_FILE = "".join(f"l{i}: {text}\n" for i, text in enumerate(_laughs()))
BOMB_VALUE = f"[{', '.join(_laughs())}]"
BOMB = "alias bomb"

CONFIG_FILES = [
    ("empty", "", "is empty"),
    ("only-comment", "# nothing\n", "is empty"),
    ("list", "- 1\n- 2\n", "mapping of sections"),
    ("scalar", "42\n", "mapping of sections"),
    ("syntax", "data:\n  alpha: [1, 2\n", "valid YAML"),
    ("tabs", "data:\n\talpha: 1\n", "valid YAML"),
    ("dup-key", "train:\n  lr: 0.1\n  lr: 0.2\n", "duplicate key 'lr'"),
    ("dup-section", "train:\n  lr: 0.1\ndata:\n  alpha: 1\ntrain:\n  rounds: 3\n", "duplicate key 'train'"),
    ("dup-flow", "data: {alpha: 1, alpha: 2}\n", "duplicate key 'alpha'"),
    ("recursive-anchor", "data: &d\n  x: *d\n", "recursive"),
    ("undefined-alias", "data: *nothing\n", "undefined alias"),
    ("non-utf8", b"name: caf\xe9\n", "UTF-8"),
    ("binary", b"\x00\x01\x02\xff\xfe", "UTF-8"),
    ("unknown-section", "trian:\n  lr: 0.1\n", "unknown section"),
    ("section-not-mapping", "train: 5\n", "train"),
    ("python-tag", "train: !!python/object:os.system {}\n", "valid YAML"),
    ("inf-in-file", "train:\n  lr: .inf\n", "train.lr"),
    ("complex-key", "? [a]\n: 1\n", "plain value"),
    ("field-typo", "train:\n  rouns: 3\n", ("train.rouns: got 3; unknown field", "; did you mean train.rounds?")),
    ("alias-bomb", BOMB_FILE, BOMB),
    ("alias-bomb-in-section", "method:\n" + "".join(f"  {line}" for line in BOMB_FILE.splitlines(True)), BOMB),
    ("alias-bomb-one-line", f"data: {{primary: {BOMB_VALUE}}}\n", BOMB),
]

SPACES = [
    ("loguniform-scalar", "method.mu: {loguniform: 5}\n", "space.method.mu"),
    ("loguniform-zero", "method.mu: {loguniform: [0, 1]}\n", "0 < low"),
    ("loguniform-reversed", "method.mu: {loguniform: [1, 0.1]}\n", "space.method.mu"),
    ("uniform-reversed", "method.mu: {uniform: [1, 0]}\n", "low < high"),
    ("uniform-equal", "method.mu: {uniform: [0.5, 0.5]}\n", "low < high"),
    ("uniform-three", "method.mu: {uniform: [0, 0.5, 1]}\n", "[low, high]"),
    ("uniform-text", "method.mu: {uniform: [a, b]}\n", "finite numbers"),
    ("uniform-inf", "method.mu: {uniform: [0, .inf]}\n", "finite numbers"),
    ("choice-empty", "method.mu: {choice: []}\n", "non-empty list"),
    ("choice-scalar", "method.mu: {choice: 0.1}\n", "non-empty list"),
    ("grid-empty", "method.mu: {grid: []}\n", "non-empty list"),
    ("randint-empty-range", "method.num_clusters: {randint: [2, 2]}\n", "low < high"),
    ("randint-floats", "method.num_clusters: {randint: [1.5, 3]}\n", "integers"),
    ("quniform-q0", "method.mu: {quniform: [0, 1, 0]}\n", "q > 0"),
    ("unknown-domain", "method.mu: {normal: [0, 1]}\n", "one of"),
    ("two-domains", "method.mu: {uniform: [0, 1], choice: [1]}\n", "one of"),
    ("out-of-bounds", "method.mu: {uniform: [-1, 1]}\n", "method.mu"),
    ("bad-choice", "method.mu: {choice: [0.1, -5]}\n", "method.mu"),
    ("not-a-field", "train.lrr: {uniform: [0.01, 0.1]}\n", "space.train.lrr"),
    ("empty-space", "", "is empty"),
    ("list-space", "- 1\n", "must map config fields"),
    ("dup-key-space", "method.mu: 0.1\nmethod.mu: 0.2\n", "duplicate key"),
    ("empty-mapping-space", "{}\n", "maps no field"),
    ("alias-bomb", BOMB_FILE, BOMB),
    ("alias-bomb-as-choice", f"method.mu: {{choice: {BOMB_VALUE}}}\n", BOMB),
    # a range drawing floats for a field that takes integers: its bounds are valid, its draws are not
    ("uniform-int-field", "train.local_steps: {uniform: [1, 10]}\n", "randint"),
    ("loguniform-int-field", "method.num_clusters: {loguniform: [1, 10]}\n", "randint"),
    ("quniform-int-field", "method.rank: {quniform: [2, 10, 2]}\n", "randint"),
    ("uniform-rounds", "train.rounds: {uniform: [1, 5]}\n", "train.rounds takes int"),
    ("uniform-batch-size", "train.batch_size: {uniform: [16, 64]}\n", "randint"),
    ("uniform-num-devices", "data.num_devices: {uniform: [10, 20]}\n", "randint"),
    ("uniform-seed", "seed: {uniform: [0, 5]}\n", "randint"),
    ("uniform-str-field", "data.dataset: {uniform: [0, 1]}\n", "use choice"),
    ("uniform-bool-field", "data.download: {uniform: [0, 1]}\n", "use choice"),
    ("quniform-off-grid", "method.mu: {quniform: [0, 1, 0.3]}\n", "multiples of q"),
    ("qrandint-q1", "method.num_clusters: {qrandint: [2, 10, 1]}\n", "q = 1 is randint"),
    ("qrandint-off-grid", "method.num_clusters: {qrandint: [2, 9, 2]}\n", "multiples of q"),
    ("qrandint-floats", "method.num_clusters: {qrandint: [2, 10, 2.0]}\n", "integers"),
]

# issue 49: the device model's numbers past what float32 arrays, ints and memory hold, refused by the config check
HUGE = "9" * 400  # an int of hundreds of digits: no float holds it
DEVICE_VALUES = [
    ("devices.speed_sigma=1000", "devices.speed_sigma: got 1000.0; must be in [0, 5]"),
    ("devices.bandwidth_sigma=50", "devices.bandwidth_sigma: got 50.0; must be in [0, 5]"),
    ("devices.latency_ms=1e300", "devices.latency_ms: got 1e+300; must be in [0, 3.6e+06]"),
    (f"devices.latency_ms={HUGE}", ("devices.latency_ms", "must be a finite number")),
    (f"devices.phase_jitter={HUGE}", ("devices.phase_jitter", "must be a finite number")),
    (f"devices.dropout=-{HUGE}", ("devices.dropout", "must be a finite number")),
    ("devices.period_hours=1e300", "devices.period_hours: got 1e+300; must be in [0.000277778, 8760]"),
    ("devices.period_hours=1e-9", "devices.period_hours: got 1e-09; must be in [0.000277778, 8760]"),
    ("devices.slot_minutes=1e-300", "devices.slot_minutes: got 1e-300; must be in [0.0166667, 525600]"),
    ("devices.overcommit=1e300", "devices.overcommit: got 1e+300; must be in [0, 100]"),
    ("devices.deadline_seconds=1e300", "devices.deadline_seconds: got 1e+300; must be in [0, 3.2e+07]"),
    ("network.device_gflops=1e-300", "network.device_gflops: got 1e-300; must be in [1e-06, 1e+15]"),
    ("network.bandwidth_mbps=1e300", "network.bandwidth_mbps: got 1e+300; must be in [1e-06, 1e+15]"),
    (f"network.bandwidth_mbps={HUGE}", ("network.bandwidth_mbps", "must be a finite number")),
    ("devices.online_fraction=0", "devices.online_fraction: got 0.0; must be in (0, 1]"),
    ("devices.availability=iid --set devices.online_fraction=0.5 --set devices.slot_minutes=0.5",
     ("devices.slot_minutes: got 0.5", "into 2,880 slots; at most 1,440")),
    ("devices.availability=iid --set devices.online_fraction=0.5 --set devices.slot_minutes=1 "
     "--set data.num_devices=100000000", ("devices.slot_minutes: got 1.0", "must fit this machine's memory")),
]
NEVER_ONLINE = '{"1": {"active": [], "inactive": [], "finish_time": 100}, "2": {"active": [], "inactive": [], "finish_time": 50}}'
TRACE_AV = f"{R} --set devices.simulate=true --set devices.availability=trace --set devices.availability_trace="
ASYNC = "--set method.name=fedavg --set devices.aggregation=async --set devices.async_buffer=2"
SHORT_WINDOWS = "--set devices.availability=diurnal --set devices.online_fraction=0.0001 --set devices.period_hours=0.01"
# issue 49: schedules that can never keep any work, refused before the first round (sync and async)
SCHEDULE_ROWS = [
    ("devices-never-online-trace", f"{TRACE_AV}av.json", {"av.json": NEVER_ONLINE},
     ("devices.availability_trace: got 'av.json'; no training device is ever online",)),
    ("devices-never-online-trace-async", f"{TRACE_AV}av.csv {ASYNC}",
     {"av.csv": "id,active,inactive,finish_time\n1,,,100\n"}, "no training device is ever online"),
    ("devices-windows-too-short", f"{R} --set devices.simulate=true {SHORT_WINDOWS}", {},
     ("devices.online_fraction: got 0.0001", "no training device can finish a round inside an online window")),
    ("devices-windows-too-short-async", f"{R} --set devices.simulate=true {SHORT_WINDOWS} {ASYNC}", {},
     ("devices.online_fraction: got 0.0001", "no training device can finish a round inside an online window")),
    ("devices-trace-windows-too-short", f"{TRACE_AV}av.json {ASYNC}",
     {"av.json": '{"1": {"active": [0], "inactive": [1e-6], "finish_time": 100}}'},
     ("devices.availability_trace: got 'av.json'", "no training device can finish a round")),
    ("devices-capacity-below-float32", f"{R} --set devices.simulate=true --set devices.capacity_trace=cap.json",
     {"cap.json": '{"1": {"computation": 5, "communication": 100}, "7": {"computation": 5, "communication": 1e-45}}'},
     ("devices.capacity_trace: cap.json: client 7: communication 1e-45 kbit/s", "outside float32's normal range")),
    ("devices-capacity-slow-below-float32", f"{R} --set devices.simulate=true --set devices.capacity_trace=cap.csv",
     {"cap.csv": "id,computation,communication\n3,1e300,100\n"},
     ("devices.capacity_trace: cap.csv: client 3: computation 1e+300 ms per sample", "FLOP/s")),
]


def _shared_pickle(clients: int, intervals: int) -> bytes:
    """An availability pickle of a few KB whose clients all share one list: expanded, clients x intervals."""
    import pickle

    times = list(range(0, 2 * intervals, 2))
    ends = [t + 1 for t in times]
    return pickle.dumps({c: {"active": times, "inactive": ends, "finish_time": 2 * intervals} for c in range(clients)},
                        protocol=2)


DEEP = 100_000  # a pickle list nested this deep: refused by depth, not by the interpreter's stack
CAP = f"{R} --set devices.simulate=true --set devices.capacity_trace="
ONE_CAP = '{"computation": 5, "communication": 100}'
# issue 49: a trace file's budget (depth, clients, intervals) and ids that would collide or wrap
TRACE_BUDGET_ROWS = [
    ("devices-trace-pickle-too-deep", f"{CAP}cap.pkl",
     {"cap.pkl": b"\x80\x02}(K\x01}(X\x0b\x00\x00\x00computation" + b"]" * DEEP + b"a" * (DEEP - 1)
      + b"X\r\x00\x00\x00communicationK\x05uu."}, ("devices.capacity_trace: cap.pkl: nests deeper than 16 levels",)),
    ("devices-trace-json-too-deep", f"{CAP}cap.json", {"cap.json": "[" * 20 + "]" * 20},
     "devices.capacity_trace: cap.json: nests deeper than 16 levels"),
    ("devices-trace-pickle-shared-expansion", f"{TRACE_AV}av.pkl", {"av.pkl": _shared_pickle(2100, 5000)},
     ("devices.availability_trace: av.pkl: holds more than 10,000,000 online intervals",)),
    ("devices-trace-json-duplicate-id", f"{CAP}cap.json", {"cap.json": f'{{"1": {ONE_CAP}, "1": {ONE_CAP}}}'},
     ("devices.capacity_trace: cap.json: the key '1' appears more than once",)),
    ("devices-trace-json-id-beyond-64-bits", f"{CAP}cap.json", {"cap.json": f'{{"18446744073709551617": {ONE_CAP}}}'},
     "devices.capacity_trace: cap.json: client id 18446744073709551617 is beyond 64 bits"),
    ("devices-trace-csv-id-wraps", f"{CAP}cap.csv", {"cap.csv": "id,computation,communication\n18446744073709551615,5,100\n"},
     "devices.capacity_trace: cap.csv: client id 18446744073709551615 is beyond 64 bits"),
]

IDX_LABELS_255 = "idx/train-labels-idx1-ubyte"


def _idx_files(bad: str) -> dict[str, bytes]:
    """A complete tiny MNIST IDX set (2 train, 1 test) with one defect."""
    def images(n: int) -> bytes:
        return struct.pack(">IIII", 2051, n, 28, 28) + bytes(n * 784)

    def labels(values: list[int]) -> bytes:
        return struct.pack(">II", 2049, len(values)) + bytes(values)

    files = {
        "idx/train-images-idx3-ubyte": images(2), "idx/train-labels-idx1-ubyte": labels([1, 2]),
        "idx/t10k-images-idx3-ubyte": images(1), "idx/t10k-labels-idx1-ubyte": labels([3]),
    }
    if bad == "label255":
        files[IDX_LABELS_255] = labels([1, 255])
    elif bad == "magic":
        files["idx/t10k-images-idx3-ubyte"] = struct.pack(">IIII", 7, 1, 28, 28) + bytes(784)
    elif bad == "short":
        files["idx/t10k-images-idx3-ubyte"] = images(1)[:-10]
    elif bad == "count":
        files["idx/t10k-labels-idx1-ubyte"] = labels([3, 4])
    elif bad == "empty":
        files["idx/t10k-images-idx3-ubyte"], files["idx/t10k-labels-idx1-ubyte"] = images(0), labels([])
    elif bad == "gzip":
        files = {k + ".gz": gzip.compress(v) for k, v in files.items()}
        files["idx/train-labels-idx1-ubyte.gz"] = b"not gzip at all"
    return files


def _npz(**arrays: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


def _checkpoint(run_id: object, uri: object) -> bytes:
    """A checkpoint of the default config after 2 rounds (states left out: the rows are refused before
    they are read) whose MLflow run ``run_id`` was logged to ``uri``."""
    with tempfile.TemporaryDirectory() as tmp:
        path = checkpoint.save(Path(tmp) / "latest.pt", checkpoint.Snapshot(
            2, None, {}, [{"round": 0.0}, {"round": 1.0}], load_config().digest(),
            {"tracking_uri": uri, "run_id": run_id, "experiment_id": "1"}))
        return path.read_bytes()


ELSEWHERE = "sqlite:////srv/lcfed/mlflow.db"
SQLITE_CKPT = {"ck/latest.pt": _checkpoint("3f2a1b9c0d4e", ELSEWHERE)}
SERVER_CKPT = {"ck/latest.pt": _checkpoint("3f2a1b9c0d4e", "http://127.0.0.1:5000")}
RESUME = "run --set checkpoint.dir=ck --resume"
# resuming under another store than the checkpoint's run is in: refused naming the store (MLflow: run not found)
RESUME_ROWS = [
    ("resume-into-another-sqlite-store", f"{RESUME} --set tracking.uri=sqlite:///other.db", SQLITE_CKPT,
     ("tracking.uri", f"is in {ELSEWHERE}: set tracking.uri={ELSEWHERE}", "--no-track")),
    ("resume-into-the-default-store", RESUME, SQLITE_CKPT, ("tracking.uri", "mlflow.db'", ELSEWHERE)),
    ("resume-server-run-into-sqlite", f"{RESUME} --set tracking.uri=sqlite:///m.db", SERVER_CKPT,
     ("tracking.uri", "set tracking.uri=http://127.0.0.1:5000")),
    ("resume-sqlite-run-into-a-server", f"{RESUME} --set tracking.uri=http://127.0.0.1:9", SQLITE_CKPT,
     ("tracking.uri", "http://127.0.0.1:9", ELSEWHERE)),
    ("resume-checkpoint-names-no-run-id", RESUME, {"ck/latest.pt": _checkpoint(["x"], ELSEWHERE)},
     ("checkpoint ck/latest.pt names its MLflow run as ['x']", "use another checkpoint.dir")),
]

# a plugin author's mistakes (section 7b): each module subclasses FedAvg or Strategy with one thing wrong
_PLUGIN_HEAD = "from dataclasses import dataclass\n\nfrom lcfed.methods.base import Strategy\nfrom lcfed.methods.fedavg import FedAvg\n\n\n"
NO_DEFAULT = {"plugnodef.py": _PLUGIN_HEAD + "class Mine(FedAvg):\n    @dataclass(frozen=True)\n    class Params:\n"
                              "        mu: float\n"}
UNANNOTATED = {"plugunann.py": _PLUGIN_HEAD + "class Mine(FedAvg):\n    @dataclass(frozen=True)\n    class Params:\n"
                               "        mu = 0.1\n"}
NO_HOOKS = {"plughooks.py": _PLUGIN_HEAD + "class Mine(Strategy):\n    @dataclass(frozen=True)\n    class Params:\n"
                            "        pass\n\n    def init(self):\n        return None\n"}
NO_PERSONALIZED = {"plugpers.py": _PLUGIN_HEAD + "class Mine(Strategy):\n    @dataclass(frozen=True)\n    class Params:\n"
                                  "        pass\n\n" + "".join(f"    def {h}(self, *a):\n        return None\n\n"
                                                                  for h in ("init", "configure", "local", "aggregate"))}
NO_SPACE = {"plugnospace.py": _PLUGIN_HEAD + "class Mine(FedAvg):\n    pass\n"}
BAD_SPACE = {"plugbadspace.py": _PLUGIN_HEAD + "class Mine(FedAvg):\n    compare_space = 'nope.yaml'\n"}
TYPO = {"plugtypo.py": _PLUGIN_HEAD + "class FedProx(FedAvg):\n    pass\n"}

ROWS: list[tuple[str, str, dict[str, str | bytes], str | tuple[str, ...]]] = []
ROWS += [(f"run-set-{v}", f"{R} --set {shlex.quote(v)}", {"inputs/afile": "x"}, want) for v, want in CONFIG_VALUES]
ROWS += [(f"config-set-{v}", f"config --set {shlex.quote(v)}", {"inputs/afile": "x"}, want)
         for v, want in CONFIG_VALUES[::4]]
ROWS += [(f"{m}-{v}", f"{R} --set method.name={m} --set {shlex.quote(v)}", {}, want) for m, v, want in METHOD_VALUES]
ROWS += [(f"config-file-{name}", f"{R} --config c.yaml", {"c.yaml": text}, want) for name, text, want in CONFIG_FILES]
ROWS += [(f"space-{name}", "sweep --space s.yaml", {"s.yaml": text}, want) for name, text, want in SPACES]
ROWS += RESUME_ROWS
ROWS += [(f"devices-set-{v}", f"{R} --set devices.simulate=true --set {v}", {}, want) for v, want in DEVICE_VALUES]
ROWS += SCHEDULE_ROWS
ROWS += TRACE_BUDGET_ROWS

# privacy.mode: central (the default config: 20 training devices, all in every round)
P = f"{R} --set privacy.mode=central"
PRIVACY_ROWS = [
    ("privacy-epsilon-zero", f"{P} --set privacy.target_epsilon=0", {},
     "privacy.target_epsilon: got 0.0; must be in (0, 1000]"),
    ("privacy-epsilon-negative", f"{P} --set privacy.target_epsilon=-1", {},
     "privacy.target_epsilon: got -1.0; must be in (0, 1000]"),
    ("privacy-delta-over-1/n", f"{P} --set privacy.noise_multiplier=1 --set privacy.delta=0.05", {},
     "privacy.delta: got 0.05; must be in (0, 1/population) = (0, 0.05) for a population of 20 training devices"),
    ("privacy-clip-zero", f"{P} --set privacy.noise_multiplier=1 --set privacy.clip=0", {},
     "privacy.clip: got 0.0; must be > 0"),
    ("privacy-clip-negative", f"{P} --set privacy.noise_multiplier=1 --set privacy.clip=-2", {},
     "privacy.clip: got -2.0; must be > 0"),
    ("privacy-noise-cohort-below", f"{P} --set privacy.noise_multiplier=1 --set privacy.noise_cohort=5", {},
     "privacy.noise_cohort: got 5; must be 0 or >= the real cohort (20 devices per round)"),
    ("privacy-neither-sigma-nor-epsilon", P, {}, "set exactly one of privacy.noise_multiplier"),
    ("privacy-mode-typo", f"{R} --set privacy.mode=local", {}, "privacy.mode: got 'local'; must be one of ['off', 'central']"),
    ("privacy-method-reads-directions", f"{P} --set privacy.noise_multiplier=1 --set method.name=fedgroup", {},
     "privacy.mode: got 'central'; method fedgroup reads per-device update directions beyond the clipped and noised "
     "aggregate; those that can run under central: "),
    ("privacy-clip-quantile-one", f"{P} --set privacy.noise_multiplier=1 --set privacy.clip_quantile=1", {},
     "privacy.clip_quantile: got 1.0; must be in (0, 1)"),
    ("privacy-clip-quantile-zero", f"{P} --set privacy.noise_multiplier=1 --set privacy.clip_quantile=0", {},
     "privacy.clip_quantile: got 0.0; must be in (0, 1)"),
    ("privacy-clip-lr-zero", f"{P} --set privacy.noise_multiplier=1 --set privacy.clip_quantile=0.5 "
     "--set privacy.clip_lr=0", {}, "privacy.clip_lr: got 0.0; must be in (0, 10]"),
    ("privacy-count-noise-negative", f"{P} --set privacy.noise_multiplier=1 --set privacy.clip_quantile=0.5 "
     "--set privacy.count_noise=-1", {}, "privacy.count_noise: got -1.0; must be in (0, 1e9]"),
    # LCFed's two sums at σ = 1: the count's noise must exceed 1 / (2 sqrt 2)
    ("privacy-count-noise-spends-sigma", f"{P} --set privacy.noise_multiplier=1 --set privacy.clip_quantile=0.5 "
     "--set privacy.count_noise=0.3", {}, "privacy.count_noise: got 0.3; must be > 0.3536 for a noise multiplier of 1 "
     "over 2 sum(s)"),
    ("privacy-count-noise-spends-solved-sigma", f"{P} --set privacy.target_epsilon=0.05 --set privacy.clip_quantile=0.5 "
     "--set privacy.count_noise=0.1 --set method.name=fedavg", {},
     ("privacy.count_noise: got 0.1; must be > ", "over 1 sum(s)")),
    # sample-level DP-SGD (privacy.sample_noise), with or without privacy.mode: central
    ("privacy-sample-noise-zero", f"{R} --set privacy.sample_noise=0", {},
     "privacy.sample_noise: got 0.0; must be in (0, 1e4]"),
    ("privacy-sample-clip-zero", f"{R} --set privacy.sample_noise=1 --set privacy.sample_clip=0", {},
     "privacy.sample_clip: got 0.0; must be > 0"),
    ("privacy-sample-delta-one", f"{R} --set privacy.sample_noise=1 --set privacy.sample_delta=1", {},
     "privacy.sample_delta: got 1.0; must be in (0, 1)"),
    ("privacy-sample-delta-over-1/n", f"{R} --set privacy.sample_noise=1 --set privacy.sample_delta=0.5", {},
     ("privacy.sample_delta: got 0.5; must be below 1/n = ", "for the smallest training device's n = ")),
    ("privacy-sample-method-reads-losses", f"{R} --set privacy.sample_noise=1 --set method.name=ifca", {},
     "privacy.sample_noise: got 1.0; method ifca reads its devices' samples outside the shared local SGD"),
    ("privacy-sample-vectorized", f"{R} --set privacy.sample_noise=1 --set engine.vectorize=always", {},
     "engine.vectorize: got 'always'; must be auto or never with privacy.sample_noise"),
    ("privacy-method-unclipped-sums", f"{P} --set privacy.noise_multiplier=1 --set method.name=scaffold", {},
     "method scaffold sums updates, control variates without clipping and noise"),
]
ROWS += PRIVACY_ROWS
ROWS += [
    # run flags
    ("run-config-missing", f"{R} --config nope.yaml", {}, "--config"),
    ("run-config-dir", f"{R} --config inputs", {"inputs/x": ""}, "--config"),
    # argparse's errors: one line naming the subcommand and the flag
    ("run-engine-choice", "run --engine spark", {},
     "lcfed: usage error: run: --engine: invalid choice 'spark' (choose from local, ray) (see lcfed run --help)"),
    ("run-unknown-flag", "run --bogus", {},
     "lcfed: usage error: run: unrecognized arguments: --bogus (see lcfed run --help)"),
    ("run-unknown-flag-value", "run --rounds 5", {},
     "lcfed: usage error: run: unrecognized arguments: --rounds 5 (see lcfed run --help)"),
    ("run-flag-needs-value", "run --json", {}, "lcfed: usage error: run: --json: expected one argument"),
    ("data-stats-unknown-flag", "data stats --bogus", {},
     "lcfed: usage error: data stats: unrecognized arguments: --bogus"),
    ("top-unknown-flag", "--bogus", {}, "lcfed: usage error: unrecognized arguments: --bogus (see lcfed --help)"),
    ("command-typo", "rn", {}, ("lcfed: usage error: COMMAND: invalid choice 'rn' (choose from run, config, ",
                               "; did you mean run? (see lcfed --help)")),
    ("run-set-no-equals", f"{R} --set method.mu", {}, "--set"),
    ("run-set-empty-key", f"{R} --set =1", {}, "--set"),
    ("run-set-alias-bomb", f"{R} --set {shlex.quote('data.primary=' + BOMB_VALUE)}", {}, BOMB),
    ("run-set-recursive-anchor", f"{R} --set 'data.primary=&p [*p]'", {}, "recursive"),
    ("run-set-dup-key", f"{R} --set 'method={{mu: 0.1, mu: 0.2}}'", {}, "duplicate key"),
    ("run-json-dir", f"{R} --json inputs", {"inputs/x": ""}, "--json"),
    ("run-json-no-parent", f"{R} --json nodir/out.json", {}, "--json"),
    ("run-json-is-config", f"{R} --config c.yaml --json c.yaml", {"c.yaml": "seed: 1\n"}, "--json"),
    ("run-resume-no-ckpt-dir", f"{R} --resume", {}, "--resume"),
    ("run-ckpt-under-file", f"{R} --set checkpoint.dir=inputs/afile/sub", {"inputs/afile": "x"}, "checkpoint.dir"),
    ("run-devices-over-data", f"{R} --set data.num_devices=200 --set data.min_samples=10", {}, "data.num_devices"),
    ("run-val-fraction-leaves-no-val", f"{R} --set data.val_fraction=0.01", {}, "data.val_fraction"),  # 21 x 0.01 -> 0
    ("run-classes-over-data", f"{R} --set data.partition=pathological --set data.classes_per_device=11",
     {}, "data.classes_per_device"),
    ("run-missing-dataset", f"{R} --set data.dataset=mnist --set data.data_dir=nodata", {}, "lcfed data import"),
    ("run-idx-empty-placed-by-hand", f"{R} --set data.dataset=mnist --set data.data_dir=d",
     {f"d/MNIST/raw/{k.split('/')[1]}": v for k, v in _idx_files("empty").items()},
     ("d/MNIST/raw/t10k-images-idx3-ubyte: holds no images (an empty IDX file)", "lcfed data import")),
    ("run-idx-label-255", f"{R} --set data.dataset=mnist --set data.data_dir=d", {
        "d/MNIST/raw/train-images-idx3-ubyte": _idx_files("")["idx/train-images-idx3-ubyte"],
        "d/MNIST/raw/train-labels-idx1-ubyte": _idx_files("label255")[IDX_LABELS_255],
        "d/MNIST/raw/t10k-images-idx3-ubyte": _idx_files("")["idx/t10k-images-idx3-ubyte"],
        "d/MNIST/raw/t10k-labels-idx1-ubyte": _idx_files("")["idx/t10k-labels-idx1-ubyte"],
    }, "label 255"),
    # paths that look usable and are not: a probe file proves them before any work
    ("run-ckpt-in-proc", f"{R} --set checkpoint.dir=/proc/self/lcfed-ckpt", {}, "cannot hold files"),
    ("run-json-in-proc", f"{R} --json /proc/self/out.json", {}, "cannot hold files"),
    ("data-import-into-proc", "data import --data-dir /proc/self/lcfed --from idx", _idx_files(""),
     "cannot hold files"),
    ("sweep-storage-in-proc", "sweep --space s.yaml --storage /proc/self/tune",
     {"s.yaml": "method.mu: {grid: [0.1]}\n"}, "--storage"),
    ("compare-out-in-proc", "compare --methods fedavg,standalone --out /proc/self/cmp", {}, "--out"),
    ("run-tracking-uri-plain-dir", "run --set tracking.uri=store", {"store/x": ""}, ("tracking.uri", "sqlite:///")),
    ("run-tracking-uri-file-scheme", "run --set tracking.uri=file:///tmp/lcfed-mlruns", {},
     ("tracking.uri", "file store")),
    ("run-sqlite-store-in-proc", "run --set tracking.uri=sqlite:////proc/self/lcfed/m.db", {}, "cannot hold files"),
    ("run-sqlite-store-is-a-dir", "run --set tracking.uri=sqlite:///store", {"store/x": ""}, "is a directory"),
    ("sweep-sqlite-store-in-proc", "sweep --space s.yaml --set tracking.uri=sqlite:////proc/self/m.db",
     {"s.yaml": "method.mu: {grid: [0.1]}\n"}, ("tracking.uri", "cannot hold files")),
    ("compare-sqlite-store-in-proc", "compare --methods fedavg,standalone --set tracking.uri=sqlite:////proc/self/m.db",
     {}, ("tracking.uri", "cannot hold files")),
    # lcfed head
    ("head-port-privileged", "head start --port 80", {}, "--port 80: must be a port in 1024-65535"),
    ("head-ports-equal", "head start --port 7001 --dashboard-port 7001", {}, "they must differ"),
    ("head-stop-timeout-neg", "head stop --timeout -1", {}, "--timeout"),
    ("run-tracked-bad-value-no-store", "run --set train.lr=-1", {}, "train.lr"),
    ("run-tracked-bad-seed-no-store", "run --set seed=18446744073709551616", {}, "seed"),
    # devices: traces and the round's policies (section 2c)
    ("devices-capacity-negative", f"{R} --set devices.simulate=true --set devices.capacity_trace=cap.json",
     {"cap.json": '{"1": {"computation": -5, "communication": 100}}'}, ("devices.capacity_trace", "computation")),
    # file datasets whose samples hold nothing (a model would train on nothing and score chance)
    ("file-zero-size-images", f"{R} --set data.dataset=file --set data.path=z.npz --set data.data_dir=.",
     {"z.npz": _npz(x=np.zeros((40, 0, 0), np.uint8), y=np.arange(40) % 2)}, ("z.npz", "its samples hold no values")),
    ("file-table-without-features", f"{R} --set data.dataset=file --set data.path=t.csv --set data.data_dir=.",
     {"t.csv": "label\n" + "0\n1\n" * 20}, ("t.csv", "no feature columns")),
    ("synthetic-samples-beyond-memory", f"{R} --set data.dataset=synthetic --set data.synthetic_samples=1000000000000000", {},
     ("data.synthetic_samples", "must fit this machine's memory")),
    ("spill-dir-without-spilling", f"{R} --set engine.spill_dir=/tmp", {},
     ("engine.spill_dir", "engine.state_memory_mb, which is 0")),
    ("data-reads-unknown", f"{R} --engine ray --set engine.data_reads=workers", {},
     ("engine.data_reads", "auto", "nodes", "driver")),
    ("placement-timeout-beyond-a-day", f"{R} --engine ray --set engine.placement_timeout_s=1e300", {},
     ("engine.placement_timeout_s", "86,400")),
    ("image-size-on-a-built-in", f"{R} --set data.image_size=[8,8]", {},
     ("data.image_size", "resizes the images of data.dataset=file only")),
    ("devices-capacity-nan", f"{R} --set devices.simulate=true --set devices.capacity_trace=cap.csv",
     {"cap.csv": "id,computation,communication\n1,nan,100\n"}, ("devices.capacity_trace", "computation")),
    ("devices-capacity-zero-link", f"{R} --set devices.simulate=true --set devices.capacity_trace=cap.json",
     {"cap.json": '{"1": {"computation": 5, "communication": 0}}'}, ("devices.capacity_trace", "communication")),
    ("devices-trace-unknown-format", f"{R} --set devices.simulate=true --set devices.capacity_trace=cap.xml",
     {"cap.xml": "<x/>"}, "devices.capacity_trace"),
    ("devices-trace-format-choice", f"{R} --set devices.simulate=true --set devices.trace_format=xml", {},
     "devices.trace_format"),
    ("devices-availability-overlap", f"{R} --set devices.simulate=true --set devices.availability=trace "
     "--set devices.availability_trace=av.json",
     {"av.json": '{"1": {"duration": 9, "active": [0, 2], "inactive": [3, 5], "finish_time": 9}}'},
     "devices.availability_trace"),
    ("devices-hostile-pickle", f"{R} --set devices.simulate=true --set devices.capacity_trace=cap.pkl",
     {"cap.pkl": b"cos\nsystem\n(S'touch pwned'\ntR."}, ("devices.capacity_trace", "refused")),
    ("devices-deadline-below-all", f"{R} --set devices.simulate=true --set devices.deadline_seconds=0.000001", {},
     "devices.deadline_seconds"),
    ("devices-overcommit-negative", f"{R} --set devices.simulate=true --set devices.overcommit=-0.3", {},
     "devices.overcommit"),
    ("devices-off-but-set", f"{R} --set devices.dropout=0.1", {}, ("devices.dropout", "devices.simulate: true")),
    ("devices-async-buffer-0", f"{R} --set devices.simulate=true --set devices.aggregation=async "
     "--set method.name=fedavg", {}, "devices.async_buffer"),
    ("devices-async-buffer-over", f"{R} --set devices.simulate=true --set devices.aggregation=async "
     "--set devices.async_buffer=999 --set method.name=fedavg", {}, "devices.async_buffer"),
    ("devices-async-method", f"{R} --set devices.simulate=true --set devices.aggregation=async "
     "--set devices.async_buffer=2 --set method.name=fesem", {}, ("devices.aggregation", "those that do: ")),
    # work that never ends: a round's local work and lcfed check's rounds are bounded
    ("run-final-eval-devices-negative", f"{R} --set train.final_eval_devices=-2", {},
     ("train.final_eval_devices: got -2", "-1 (auto")),
    ("run-local-epochs-beyond-bound", f"{R} --set train.local_steps=null --set train.local_epochs=5000", {},
     ("train.local_epochs: got 5000", "<= 1,000")),
    ("check-rounds-beyond-bound", "check fedavg --rounds 100000", {}, ("--rounds: got 100000", "[2, 500]")),
    ("check-set-rounds-beyond-bound", "check fedavg --set train.rounds=600", {}, ("train.rounds: got 600", "[2, 500]")),
    # found by tests/test_fuzz.py: tracebacks from the partition schemes and the generator, refused before any work
    ("pathological-device-below-min-samples", f"{R} --set data.partition=pathological --set data.classes_per_device=1 "
     "--set data.num_devices=21 --set data.min_samples=21 --set data.subset=582", {},
     ("data.min_samples: got 21", "the pathological split gives device")),
    ("pathological-classes-beyond-the-subset", f"{R} --set data.partition=pathological --set data.classes_per_device=10 "
     "--set data.num_devices=1 --set data.min_samples=2 --set data.subset=12 --set method.name=fedavg", {},
     ("data.classes_per_device: got 10", "distinct classes")),
    ("primary-secondary-under-3-classes", f"{R} --set data.partition=primary_secondary --set data.num_devices=1 "
     "--set data.min_samples=2 --set data.subset=2 --set method.name=fedavg", {},
     ("data.partition: got 'primary_secondary'", "needs labels of >= 3 distinct classes")),
    ("leaf-synthetic-min-samples-over-40", f"{R} --set data.dataset=leaf_synthetic --set data.partition=natural "
     "--set data.min_samples=50", {}, ("data.min_samples: got 50", "must be <= 40")),
    ("leaf-synthetic-devices-beyond-memory", f"{R} --set data.dataset=leaf_synthetic --set data.partition=natural "
     "--set data.num_devices=1000000000", {}, ("data.num_devices: got 1000000000", "must fit this machine's memory")),
    ("resume-truncated-checkpoint", f"{R} --set checkpoint.dir=ck --resume", {"ck/latest.pt": b"P"},
     "lcfed: checkpoint error: cannot read checkpoint ck/latest.pt (damaged or not a checkpoint): UnpicklingError: "
     "Unsupported operand 80"),
    # config / methods
    ("config-missing-file", "config --config nope.yaml", {}, "--config"),
    ("methods-extra-arg", "methods extra", {}, "lcfed: usage error: methods: unrecognized arguments: extra"),
    ("unknown-command", "frobnicate", {}, "COMMAND: invalid choice 'frobnicate'"),
    ("config-set-alias-bomb", f"config --set {shlex.quote('method.mu=' + BOMB_VALUE)}", {}, BOMB),
    # data import
    ("import-from-missing", "data import --data-dir out --from nodir", {}, "nodir"),
    ("import-data-dir-file", "data import --data-dir inputs/afile --from idx", {"inputs/afile": "x", **_idx_files("")},
     "--data-dir"),
    ("import-label-255", "data import --data-dir out --from idx", _idx_files("label255"), "label 255"),
    ("import-bad-magic", "data import --data-dir out --from idx", _idx_files("magic"), "magic"),
    ("import-truncated", "data import --data-dir out --from idx", _idx_files("short"), "bytes"),
    ("import-count-mismatch", "data import --data-dir out --from idx", _idx_files("count"), "labels"),
    ("import-bad-gzip", "data import --data-dir out --from idx", _idx_files("gzip"), "train-labels"),
    ("import-empty-set", "data import --data-dir out --from idx", _idx_files("empty"),
     ("t10k-images-idx3-ubyte", "holds no images")),
    ("import-no-idx", "data import --data-dir out --from inputs", {"inputs/readme": "x"}, "inputs"),
    ("import-from-empty-dir", "data import --data-dir out --from .", {}, "no complete mnist IDX set"),
    ("import-incomplete-set", "data import --data-dir out --from idx",
     {k: v for k, v in _idx_files("").items() if "t10k-labels" not in k}, "missing t10k-labels-idx1-ubyte"),
    # tracking replay
    ("replay-missing", "tracking replay nope.json", {}, "FILE"),
    ("replay-not-json", "tracking replay u.json", {"u.json": "{not json"}, "u.json"),
    ("replay-wrong-shape", "tracking replay u.json", {"u.json": "[1, 2]"}, "u.json"),
    ("replay-missing-keys", "tracking replay u.json", {"u.json": '{"run_id": "abc"}'}, "u.json"),
    ("replay-non-utf8", "tracking replay u.json", {"u.json": b"\xff\xfe{"}, "u.json"),
    ("replay-bad-uri", "tracking replay u.json",
     {"u.json": '{"tracking_uri": "foo://x", "run_id": "abc", "metrics": []}'}, "tracking_uri"),
    # sweep flags
    ("sweep-space-missing", "sweep --space nope.yaml", {}, "--space"),
    ("sweep-no-space", "sweep", {},
     "lcfed: usage error: sweep: the following arguments are required: --space (see lcfed sweep --help)"),
    ("sweep-name-dotdot", "sweep --space mu_lambda.yaml --name ../x", {}, "--name"),
    ("sweep-name-slash", "sweep --space mu_lambda.yaml --name a/b", {}, "--name"),
    ("sweep-config-name-dotdot", "sweep --space mu_lambda.yaml --set name=../../x", {}, "name"),
    ("sweep-num-samples-0", "sweep --space mu_lambda.yaml --num-samples 0", {}, "--num-samples"),
    ("sweep-num-samples-text", "sweep --space mu_lambda.yaml --num-samples many", {}, "--num-samples"),
    ("sweep-max-concurrent-neg", "sweep --space mu_lambda.yaml --max-concurrent -1", {}, "--max-concurrent"),
    ("sweep-gpus-neg", "sweep --space mu_lambda.yaml --gpus-per-trial -1", {}, "--gpus-per-trial"),
    ("sweep-gpus-nan", "sweep --space mu_lambda.yaml --gpus-per-trial nan", {}, "--gpus-per-trial"),
    ("sweep-scheduler", "sweep --space mu_lambda.yaml --scheduler pbt", {}, "--scheduler"),
    ("sweep-scheduler-typo", "sweep --space mu_lambda.yaml --scheduler ashaa", {},
     ("sweep: --scheduler: invalid choice 'ashaa'", "; did you mean asha?")),
    ("sweep-storage-file", "sweep --space mu_lambda.yaml --storage inputs/afile", {"inputs/afile": "x"}, "--storage"),
    ("sweep-json-dir", "sweep --space mu_lambda.yaml --json inputs", {"inputs/x": ""}, "--json"),
    ("sweep-json-is-space", "sweep --space s.yaml --json s.yaml", {"s.yaml": "method.mu: 0.1\n"}, "--json"),
    ("sweep-bad-base", "sweep --space mu_lambda.yaml --set train.rounds=0", {}, "train.rounds"),
    ("sweep-set-alias-bomb", f"sweep --space mu_lambda.yaml --set {shlex.quote('method.mu=' + BOMB_VALUE)}", {},
     BOMB),
    ("sweep-grid-combination-invalid", "sweep --space s.yaml",
     {"s.yaml": "data.num_devices: {grid: [12, 20]}\ntrain.eval_devices: {grid: [2, 15]}\n"},
     ("--space: got 'data.num_devices=12, train.eval_devices=15'; this combination gives an invalid config",
      "train.eval_devices: got 15")),
    ("sweep-bounds-combination-invalid", "sweep --space s.yaml --set devices.simulate=true --set method.name=fedavg "
     "--set devices.aggregation=async --set devices.async_buffer=2",
     {"s.yaml": "devices.async_buffer: {randint: [1, 4]}\ntrain.participation: {choice: [0.1, 1.0]}\n"},
     ("--space: got 'devices.async_buffer=3, train.participation=0.1'", "devices.async_buffer: got 3")),
    ("sweep-int-field-of-other-method", "sweep --space s.yaml --set method.name=fedac",
     {"s.yaml": "method.min_clusters: {uniform: [1, 3]}\n"}, "method.min_clusters takes int"),
    ("sweep-metric-unknown", "sweep --space mu_lambda.yaml --metric accuracy", {}, "--metric"),
    ("sweep-metric-per-layer", "sweep --space mu_lambda.yaml --metric cluster_size_0", {}, "--metric"),
    ("sweep-mode-choice", "sweep --space mu_lambda.yaml --mode up", {}, "--mode"),
    ("sweep-mode-needed", "sweep --space mu_lambda.yaml --metric num_clusters", {}, "--mode"),
    ("sweep-grace-0", "sweep --space mu_lambda.yaml --grace-period 0", {}, "--grace-period"),
    ("sweep-grace-text", "sweep --space mu_lambda.yaml --grace-period soon", {}, "--grace-period"),
    ("sweep-grace-over-max-t", "sweep --space mu_lambda.yaml --set train.rounds=4 --max-t 2 --grace-period 3", {},
     "--grace-period"),
    ("sweep-max-t-over-rounds", "sweep --space mu_lambda.yaml --set train.rounds=4 --max-t 5", {}, "--max-t"),
    ("sweep-max-t-0", "sweep --space mu_lambda.yaml --scheduler hyperband --max-t 0", {}, "--max-t"),
    ("sweep-grace-with-fifo", "sweep --space mu_lambda.yaml --scheduler fifo --grace-period 2", {}, "--grace-period"),
    ("sweep-search-unknown", "sweep --space mu_lambda.yaml --search bayes", {}, "--search"),
    ("sweep-search-grid-range", "sweep --space mu_lambda.yaml --search grid", {}, "space.method.mu"),
    ("sweep-search-optuna-grid", "sweep --space s.yaml --search optuna", {"s.yaml": "method.mu: {grid: [0.1, 1]}\n"},
     "space.method.mu"),
    ("sweep-search-hyperopt-fixed", "sweep --space s.yaml --search hyperopt", {"s.yaml": "method.mu: 0.1\n"},
     "--space"),
    ("sweep-keep-checkpoints-0", "sweep --space mu_lambda.yaml --keep-checkpoints 0", {}, ("--keep-checkpoints: got 0", ">= 1")),
    ("sweep-keep-checkpoints-text", "sweep --space mu_lambda.yaml --keep-checkpoints all", {}, "--keep-checkpoints"),
    ("sweep-register-slash", "sweep --space mu_lambda.yaml --register a/b", {}, ("--register: got 'a/b'", "without '/'")),
    ("sweep-register-stops-early", "sweep --space mu_lambda.yaml --set train.rounds=4 --max-t 2 --register best", {},
     ("--max-t: got 2", "with --register")),
    # compare
    ("compare-keep-checkpoints-0", "compare --methods fedavg,standalone --keep-checkpoints 0", {}, "--keep-checkpoints"),
    ("compare-register-colon", "compare --methods fedavg,standalone --register a:b", {}, ("--register: got 'a:b'", "without '/' or ':'")),
    ("compare-one-method", "compare --methods lcfed", {}, "--methods"),
    ("compare-unknown-method", "compare --methods lcfed,nope", {}, "--methods"),
    ("compare-no-space", "compare --methods lcfed,flhc", {}, "--methods"),
    ("compare-budget-0", "compare --methods fedavg,standalone --budget 0", {}, "--budget"),
    ("compare-parallel-0", "compare --methods fedavg,standalone --parallel 0", {}, ("--parallel: got 0", ">= 1")),
    ("compare-seeds-repeated", "compare --methods fedavg,standalone --seeds 1,1", {}, "--seeds"),
    ("compare-target", "compare --methods fedavg,standalone --target 2", {}, "--target"),
    ("compare-search", "compare --methods fedavg,standalone --search bayes", {}, "--search"),
    ("compare-scheduler", "compare --methods fedavg,standalone --scheduler pbt", {}, "--scheduler"),
    ("compare-missing-dataset", "compare --methods fedavg,standalone --set data.dataset=mnist --set data.data_dir=nodata",
     {}, "lcfed data import"),
    # reproduce
    ("repro-seeds", "reproduce table1 --seeds 0 --no-track", {}, "--seeds"),
    ("repro-datasets", "reproduce table1 --datasets imagenet --no-track", {}, "--datasets"),
    ("repro-partitions", "reproduce table1 --partitions dirichlet:x --no-track", {}, "--partitions"),
    ("repro-partition-kind", "reproduce table1 --partitions zipf:1 --no-track", {}, "--partitions"),
    ("repro-methods", "reproduce table1 --methods lcfed,nope --no-track", {}, "--methods"),
    ("repro-rounds-0", "reproduce table1 --rounds 0 --no-track", {}, "--rounds"),
    ("repro-method-set", "reproduce table1 --method-set mu=-1 --methods lcfed --no-track", {}, "mu"),
    ("repro-method-set-syntax", "reproduce table1 --method-set mu --no-track", {}, "--method-set"),
    ("repro-method-set-alias-bomb", f"reproduce table1 --method-set {shlex.quote('mu=' + BOMB_VALUE)} --no-track",
     {}, BOMB),
    ("repro-out-file", "reproduce table1 --out inputs/afile --no-track", {"inputs/afile": "x"}, "--out"),
    ("repro-table-typo", "reproduce tabel1", {},
     ("reproduce: TABLE: invalid choice 'tabel1'", "; did you mean table1?")),
    # plugins (method.name / model.name / data.dataset as package.module:attr in the working directory)
    ("plugin-module-missing", f"{R} --set method.name=nosuchplugin:FedProx", {}, "No module named 'nosuchplugin'"),
    ("plugin-import-exits", f"{R} --set method.name=plugexit:FedProx", {"plugexit.py": "raise SystemExit(0)\n"},
     "cannot import 'plugexit': SystemExit: 0"),
    ("plugin-import-fails", f"{R} --set method.name=plugbroken:FedProx", {"plugbroken.py": "import no_such_dep_xyz\n"},
     "cannot import 'plugbroken'"),
    ("plugin-attr-missing", f"{R} --set method.name=plugattr:FedProx", {"plugattr.py": "x = 1\n"},
     "has no attribute 'FedProx'"),
    ("plugin-not-a-strategy", f"{R} --set method.name=plugnot:FedProx", {"plugnot.py": "class FedProx:\n    pass\n"},
     "not a Strategy subclass"),
    ("plugin-params-not-dataclass", f"{R} --set method.name=plugparams:Mine",
     {"plugparams.py": "from lcfed.methods.fedavg import FedAvg\n\n\nclass Mine(FedAvg):\n    Params = dict\n"},
     "Params must be the dataclass"),
    ("plugin-path-syntax", f"{R} --set method.name=1plug:X", {}, "not a plugin path"),
    ("plugin-model-not-callable", f"{R} --set model.name=plugmodel:mlp", {"plugmodel.py": "mlp = 3\n"}, "model.name"),
    ("plugin-model-no-decision-layer", f"{R} --set model.name=plugmodel2:build",
     {"plugmodel2.py": "import torch\n\n\ndef build(shape, k):\n    return torch.nn.Sequential(torch.nn.Flatten(), "
                       "torch.nn.Linear(784, k))\n"}, "decision_layer"),
    ("plugin-model-wrong-output", f"{R} --set model.name=plugmodel3:build",
     {"plugmodel3.py": "import torch\n\n\nclass M(torch.nn.Module):\n    decision_layer = 'fc'\n\n"
                       "    def __init__(self):\n        super().__init__()\n        self.fc = torch.nn.Linear(784, 3)\n\n"
                       "    def forward(self, x):\n        return self.fc(x.flatten(1))\n\n\ndef build(shape, k):\n"
                       "    return M()\n"}, "not logits of shape (1, 10)"),
    ("plugin-dataset-not-callable", f"{R} --set data.dataset=plugdata:load", {"plugdata.py": "load = 'x'\n"},
     "data.dataset"),
    ("plugin-dataset-returns-a-list", f"{R} --set data.dataset=plugdata2:load",
     {"plugdata2.py": "def load(data_dir, download):\n    return [1, 2]\n"}, "not an lcfed.data.Dataset"),
    # a plugin author's mistakes: refused when the name is resolved, naming the method and what to fix
    ("plugin-params-no-default", f"{R} --set method.name=plugnodef:Mine", NO_DEFAULT,
     ("method 'plugnodef:Mine': Mine.Params.mu has no default", "every field of a method's Params needs one")),
    ("config-plugin-params-no-default", "config --set method.name=plugnodef:Mine", NO_DEFAULT,
     ("Mine.Params.mu has no default", "needs one")),
    ("check-plugin-params-no-default", "check plugnodef:Mine", NO_DEFAULT, ("METHOD", "Mine.Params.mu has no default")),
    ("plugin-params-unannotated", f"{R} --set method.name=plugunann:Mine --set method.mu=0.2", UNANNOTATED,
     ("method 'plugunann:Mine': Mine.Params.mu = 0.1 has no type annotation", "annotate it")),
    ("plugin-hooks-missing", f"{R} --set method.name=plughooks:Mine", NO_HOOKS,
     ("method 'plughooks:Mine'", "does not implement the Strategy hooks configure, local, aggregate, personalized")),
    ("plugin-hook-personalized-missing", f"{R} --set method.name=plugpers:Mine", NO_PERSONALIZED,
     "Mine does not implement the Strategy hook personalized ("),
    ("sweep-plugin-hooks-missing", "sweep --space s.yaml --set method.name=plughooks:Mine",
     {**NO_HOOKS, "s.yaml": "train.lr: {grid: [0.1]}\n"}, ("method.name", "does not implement the Strategy hooks")),
    ("check-plugin-hooks-missing", "check plughooks:Mine", NO_HOOKS, "does not implement the Strategy hooks"),
    ("plugin-attr-typo", f"{R} --set method.name=plugtypo:FedProxx", TYPO,
     "module 'plugtypo' has no attribute 'FedProxx'; did you mean plugtypo:FedProx?"),
    ("plugin-model-package-missing", f"{R} --set model.name=nosuchpkg.models:mlp", {},
     ("No module named 'nosuchpkg'", "looked in the working directory", "on PYTHONPATH", "nosuchpkg.py")),
    ("compare-plugin-no-space", "compare --methods plugnospace:Mine,fedavg", NO_SPACE,
     ("method plugnospace:Mine has no search space among the built-in ones", "compare_space", "--space-dir")),
    ("compare-plugin-space-not-a-file", "compare --methods plugbadspace:Mine,fedavg", BAD_SPACE,
     ("compare_space names ", "nope.yaml, which is not a file (a relative path is read next to the strategy's module)")),
    ("compare-builtin-no-space-dir", "compare --methods lcfed,flhc --space-dir sp", {"sp/lcfed.yaml": "train.lr: 0.1\n"},
     ("--methods: got 'flhc'", "write sp/flhc.yaml")),
    # untracked (--no-track, tracking.enabled=false): what needs MLflow is refused naming both
    ("sweep-no-track-register", "sweep --space mu_lambda.yaml --no-track --register best", {},
     ("--register: got 'best'", "--no-track")),
    ("sweep-tracking-off-register", "sweep --space mu_lambda.yaml --set tracking.enabled=false --register best", {},
     ("--register: got 'best'", "tracking.enabled=false")),
    ("compare-no-track-register", "compare --methods fedavg,standalone --no-track --register best", {},
     ("--register: got 'best'", "--no-track")),
    # mlflow-server
    ("server-port-neg", "mlflow-server --port -1", {}, "--port"),
    ("server-port-big", "mlflow-server --port 70000", {}, "--port"),
    ("server-port-text", "mlflow-server --port http", {}, "--port"),
    ("server-workers-0", "mlflow-server --workers 0", {}, "--workers"),
    ("server-timeout-0", "mlflow-server --timeout 0", {}, "--timeout"),
    ("server-timeout-nan", "mlflow-server --timeout nan", {}, "--timeout"),
    ("server-store-file", "mlflow-server --store-dir inputs/afile", {"inputs/afile": "x"}, "--store-dir"),
    ("server-backend-scheme", "mlflow-server --backend-store-uri foo://x", {}, "--backend-store-uri"),
    ("final-eval-devices-beyond", "config --set train.final_eval_devices=100000000000000000000000", {},
     "train.final_eval_devices: got 100000000000000000000000; must be at most the training devices (20"),
    ("eval-devices-beyond", "config --set train.eval_devices=21", {},
     "train.eval_devices: got 21; must be at most the training devices (20"),
    ("numerics-threads-big", "numerics --threads 100000", {}, "--threads: got 100000; must be in [1, "),
    ("numerics-threads-0", "numerics --threads 0", {}, "--threads: got 0; must be in [1, "),
    ("numerics-json-dir", "numerics --json inputs", {"inputs/afile": "x"}, "--json: got 'inputs'; is a directory"),
    ("check-set-method-name", "check fedavg --set method.name=standalone", {}, "--set method.name: got 'standalone'"),
    ("check-set-method-section", "check fedavg --set 'method={name: standalone}'", {},
     "--set method: got 'standalone'; lcfed check checks fedavg (its METHOD argument)"),
    # submit / job
    ("submit-no-entrypoint", "submit --address http://127.0.0.1:9 --", {}, "entrypoint"),
    ("submit-env-syntax", "submit --address http://127.0.0.1:9 --env NOEQUALS -- lcfed methods", {}, "--env"),
    ("submit-env-bad-key", "submit --address http://127.0.0.1:9 --env 1A=b -- lcfed methods", {}, "--env"),
    ("submit-working-dir-missing", "submit --address http://127.0.0.1:9 --working-dir nodir -- lcfed methods", {},
     "--working-dir"),
    ("submit-cpus-neg", "submit --address http://127.0.0.1:9 --entrypoint-num-cpus -1 -- lcfed methods", {},
     "--entrypoint-num-cpus"),
    ("submit-gpus-neg", "submit --address http://127.0.0.1:9 --entrypoint-num-gpus -1 -- lcfed methods", {},
     "--entrypoint-num-gpus"),
    ("submit-address-scheme", "submit --address ftp://127.0.0.1:9 -- lcfed methods", {}, "--address"),
    ("job-status-no-id", "job status", {},
     "lcfed: usage error: job status: the following arguments are required: JOB_ID"),
    ("job-unknown-action", "job frobnicate", {}, "job: ACTION: invalid choice 'frobnicate'"),
    ("job-action-typo", "job stauts", {}, "; did you mean status?"),
]


@pytest.fixture(autouse=True)
def _home(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "dont_write_bytecode", True)  # a plugin row's import would leave __pycache__ behind


def _tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def test_the_table_is_large_and_distinct():
    argvs = [(argv, tuple(sorted((k, v if isinstance(v, bytes) else v.encode()) for k, v in files.items())))
             for _, argv, files, _ in ROWS]
    assert len(ROWS) >= 120
    assert len(set(argvs)) == len(argvs), "two rows are the same input"
    assert len({r[0] for r in ROWS}) == len(ROWS)


@pytest.mark.parametrize("argv,files,want", [r[1:] for r in ROWS], ids=[r[0] for r in ROWS])
def test_bad_input_is_one_clean_error(argv, files, want, tmp_path, capsys):
    for rel, content in files.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
    before = _tree(tmp_path)
    try:
        code = main(shlex.split(argv))
    except SystemExit as exc:  # argparse's own usage errors
        code = exc.code
    out, err = capsys.readouterr()
    assert code == 2, f"exit {code}\n{out}\n{err}"
    assert "Traceback" not in out + err
    assert all(w in err for w in ((want,) if isinstance(want, str) else want)), err
    assert len(err.splitlines()) == 1, err  # one message: no usage dump, no second error
    assert _tree(tmp_path) == before, f"created {sorted(_tree(tmp_path) - before)}"
