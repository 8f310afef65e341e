"""The driver's handles on a federation's actors, the round loop's two seams on Ray: :class:`RayServer` (the
ServerActor, :class:`lcfed.run.contracts.Server`) and :class:`RayPool` (the DeviceActors,
:class:`lcfed.run.contracts.DevicePool`), the round's plan as an object ref (:class:`RayPlan`), and the actors
as the hosts a generated setup asks (:class:`ActorHosts`). The server ``ray.put``\\ s each round's broadcast
once; device messages go from the actors straight to the ServerActor as object refs, never through the driver.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import ray
import torch

from actors.hosts import Hosts
from actors.liveness import get
from lcfed.devices.clock import RoundTiming, SimClock
from lcfed.learning.local_update import EvalResult
from lcfed.methods.round import RoundPlan, RoundStats
from lcfed.run.checkpoint import state_chunks
from lcfed.run.result import Newcomer
from lcfed.run.shards import NodeShard


@dataclass(frozen=True)
class RayPlan:
    plan: RoundPlan
    payload_ref: Any

    @property
    def devices(self) -> tuple[int, ...]:
        """The round's participants, as :class:`RoundPlan` names them (the engine counts coverage)."""
        return self.plan.devices

    @property
    def timing(self) -> RoundTiming | None:
        return self.plan.timing


class RayServer:
    """Driver-side handle on the ServerActor (implements :class:`lcfed.run.contracts.Server`)."""

    def __init__(self, hosts: Hosts) -> None:
        self.hosts = hosts

    def configure(self, rnd: int, clock: SimClock | None = None, clip: float | None = None) -> RayPlan:
        plan, (ref,) = self.hosts.call(lambda: get(self.hosts.server.configure.remote(rnd, clock, clip)))
        return RayPlan(plan, ref)

    def aggregate(self, plan: RayPlan, msgs: list[Any]) -> RoundStats:
        return self.hosts.call(lambda: get(self.hosts.server.aggregate.remote(plan.plan, *msgs)))

    def eval_payload(self) -> Any:
        (ref,) = self.hosts.call(lambda: get(self.hosts.server.eval_payload.remote()))
        return ref

    def get_state(self) -> Any:
        return self.hosts.call(lambda: get(self.hosts.server.get_state.remote()))

    def set_state(self, state: Any) -> None:
        self.hosts.call(lambda: get(self.hosts.server.set_state.remote(state)))

    def recover(self, state: Any | None, pending: Any = None) -> None:
        self.hosts.restart_lost()
        get(self.hosts.server.recover.remote(state, pending))

    def get_pending(self) -> Any:
        return self.hosts.call(lambda: get(self.hosts.server.get_pending.remote()))

    def set_pending(self, pending: Any) -> None:
        self.hosts.call(lambda: get(self.hosts.server.set_pending.remote(pending)))


class RayPool:
    """Driver-side handle on the DeviceActors (implements :class:`lcfed.run.contracts.DevicePool`)."""

    def __init__(self, hosts: Hosts) -> None:
        self.hosts = hosts
        self.blocks = hosts.layout.blocks  # ranges: membership in O(1), no set of every device

    def train(self, plan: RayPlan) -> list[Any]:
        p = plan.plan
        refs = []
        for actor, block in zip(self.hosts.devices, self.blocks, strict=True):
            mine = tuple(d for d in p.devices if d in block)
            if mine:
                instr = {d: p.instructions[d] for d in mine if d in p.instructions}
                refs.append(actor.train.remote(p.rnd, mine, plan.payload_ref, instr))
        return refs

    def _gather(self, method: str, *args: Any) -> dict[int, Any]:
        def run() -> dict[int, Any]:
            out: dict[int, Any] = {}
            for part in get([getattr(a, method).remote(*args) for a in self.hosts.devices]):
                out.update(part)
            return out

        return self.hosts.call(run)

    def evaluate(self, payload_ref: Any, devices: Sequence[int] | None = None) -> dict[int, EvalResult]:
        if devices is None:
            return self._gather("evaluate", payload_ref)
        wanted = set(devices)

        def run() -> dict[int, EvalResult]:  # only the actors hosting a sampled device
            parts = [(a, tuple(sorted(d for d in wanted if d in b))) for a, b in zip(self.hosts.devices, self.blocks,
                                                                                     strict=True)]
            out: dict[int, EvalResult] = {}
            for part in get([a.evaluate.remote(payload_ref, mine) for a, mine in parts if mine]):
                out.update(part)
            return out

        return self.hosts.call(run)

    def personalized(self, payload_ref: Any) -> dict[int, torch.Tensor]:
        return self._gather("personalized", payload_ref)

    def join(self, devices: Sequence[int], newcomer: Newcomer) -> dict[int, EvalResult]:
        ref = ray.put(newcomer)  # one copy of the final models for every actor
        return self._gather("join", tuple(devices), ref)

    def get_states(self) -> dict[int, Any]:
        return self._gather("get_states")

    def iter_states(self) -> Iterator[dict[int, Any]]:
        """One actor's stored states at a time: the driver never holds every device's."""
        for actor in self.hosts.devices:
            yield self.hosts.call(lambda actor=actor: get(actor.get_states.remote()))

    def _send(self, states: Mapping[int, Any]) -> None:
        """``states`` to the actors hosting them, a part (of a checkpoint's) at a time."""
        for chunk in state_chunks(states):
            get([a.set_states.remote(mine) for a, b in zip(self.hosts.devices, self.blocks, strict=True)
                 if (mine := {d: s for d, s in chunk.items() if d in b})])

    def set_states(self, states: Mapping[int, Any]) -> None:
        self.hosts.call(lambda: self._send(states))

    def recover(self, states: Mapping[int, Any] | None) -> None:
        self.hosts.restart_lost()
        get([a.recover.remote(None) for a in self.hosts.devices])
        if states is not None:
            self._send(states)


class ActorHosts:
    """The device actors as :class:`lcfed.run.shards.GeneratingHosts`: each call asks all of them at once."""

    def __init__(self, actors: Sequence[Any]) -> None:
        self.actors = list(actors)

    def test_split(self) -> list[tuple[np.ndarray, np.ndarray]]:
        return list(get([a.test_split.remote() for a in self.actors]))

    def partition(self, shards: Sequence[NodeShard], held_out: Sequence[Sequence[int]]) -> list[dict[str, Any]]:
        return list(get([a.partition.remote(sh, list(h)) for a, sh, h in zip(self.actors, shards, held_out, strict=True)]))

    def feature_pieces(self, before: Sequence[int], total: int, mean: np.ndarray | None) -> list[Any]:
        return list(get([a.feature_pieces.remote(b, total, mean) for a, b in zip(self.actors, before, strict=True)]))
