"""The round loop's optional observer hooks (lcfed/run/loop.py): declared as Protocols, used where an
observer has them, their defaults where it has not."""

from __future__ import annotations

from lcfed.engines.hosted import HostedDevices
from lcfed.engines.local import LocalPool, LocalServer, run_local
from lcfed.run.contracts import MAX_PERSONAL_BYTES, ErrorObserver, LocatingObserver, ModelsObserver, PersonalLimit
from lcfed.run.loop import run_rounds
from lcfed.run.progress import ProgressBar
from lcfed.run.setup import prepare
from lcfed.tracking import MLflowObserver
from tests.conftest import tiny_config


class Plain:
    """The three hooks every observer has, nothing else."""

    def __init__(self) -> None:
        self.rounds: list[int] = []

    def on_start(self, cfg, fed) -> None: ...

    def on_round(self, rnd, metrics, stats) -> None:
        self.rounds.append(rnd)

    def on_end(self, result) -> None: ...


class Told(Plain):
    def __init__(self) -> None:
        super().__init__()
        self.errors: list[BaseException] = []

    def on_error(self, exc: BaseException) -> None:
        self.errors.append(exc)


class Wanting(Plain):
    wants_models = True


def test_the_existing_observers_implement_the_optional_hooks_they_define(tmp_path):
    tracker = MLflowObserver(f"sqlite:///{tmp_path / 'mlflow.db'}")
    assert isinstance(tracker, ErrorObserver) and isinstance(tracker, LocatingObserver)
    assert isinstance(tracker, ModelsObserver)  # an instance attribute, set again in on_start
    bar = ProgressBar(disable=True)
    assert isinstance(bar, ErrorObserver) and not isinstance(bar, LocatingObserver | ModelsObserver)
    assert not isinstance(Plain(), ErrorObserver | LocatingObserver | ModelsObserver)


def test_a_failing_round_tells_the_observers_that_listen_and_spares_the_others():
    cfg = tiny_config()
    setup = prepare(cfg)
    hosted = HostedDevices(setup, range(setup.federation.num_devices))

    class Broken(LocalServer):
        def aggregate(self, plan, msgs):
            raise RuntimeError("aggregation failed")

    plain, told = Plain(), Told()
    try:
        run_rounds(cfg, setup.federation, Broken(setup.strategy()), LocalPool(hosted), [plain, told])
    except RuntimeError as exc:
        assert told.errors == [exc] and plain.rounds == []
    else:
        raise AssertionError("the round did not fail")
    finally:
        hosted.close()


def test_final_models_only_when_an_observer_wants_them():
    # (a plain observer beside one that wants them: every personal model, the last run of the next test)
    assert run_local(tiny_config("train.rounds=1", "train.local_steps=1"), [Plain()]).models is None


class Capped(Wanting):
    def __init__(self, limit: float) -> None:
        super().__init__()
        self.max_personal_bytes = limit


def test_no_personal_model_is_built_past_what_every_wanting_observer_would_use(tmp_path):
    """m personal models of P float32 parameters are m * P * 4 bytes: at or under the largest limit they are
    built, past it only the server's state is (the MLflow observer's cap, for 10^5 devices)."""
    cfg = tiny_config("train.rounds=1", "train.local_steps=1")  # (the models' sizes do not depend on training)
    fed = prepare(cfg).federation
    size = fed.num_devices * fed.spec.size * 4
    assert isinstance(Capped(1.0), PersonalLimit) and not isinstance(Wanting(), PersonalLimit)
    assert MLflowObserver(f"sqlite:///{tmp_path / 'mlflow.db'}").max_personal_bytes == MAX_PERSONAL_BYTES
    at = run_local(cfg, [Capped(size)]).models
    assert at is not None and sorted(at.personal) == list(range(cfg.data.num_devices))
    past = run_local(cfg, [Capped(size - 1)]).models
    assert past is not None and past.personal == {} and past.server_state is not None
    one_unlimited = run_local(cfg, [Plain(), Capped(size - 1), Wanting()]).models
    assert one_unlimited is not None and sorted(one_unlimited.personal) == list(range(cfg.data.num_devices))
