"""Method registry: name -> (Strategy class, typed hyper-parameters). Explicit, no discovery magic.

One module a method; what they build on: :mod:`~lcfed.methods.base` (the Strategy, the round's messages
and plans, device selection), :mod:`~lcfed.methods.clustered` (ClusteredStrategy: K cluster models and
an assignment) and :mod:`~lcfed.methods.traffic` (bytes moved, per layer).
"""

from __future__ import annotations

from lcfed.methods.apfl import APFL, APFLParams
from lcfed.methods.base import MethodSpec, Strategy
from lcfed.methods.cfl import CFL, CFLParams
from lcfed.methods.cgpfl import CGPFL, CGPFLParams
from lcfed.methods.clusterfl import ClusterFL, ClusterFLParams
from lcfed.methods.dcpfl import DCPFL, DCPFLParams
from lcfed.methods.ditto import Ditto, DittoParams
from lcfed.methods.fedac import FedAC, FedACParams
from lcfed.methods.fedavg import FedAvg, FedAvgParams
from lcfed.methods.fedem import FedEM, FedEMParams
from lcfed.methods.fedgroup import FedGroup, FedGroupParams
from lcfed.methods.fedper import FedPer, FedPerParams
from lcfed.methods.fedprox import FedProx, FedProxParams
from lcfed.methods.fedrep import FedRep, FedRepParams
from lcfed.methods.fedsoft import FedSoft, FedSoftParams
from lcfed.methods.fesem import FeSEM, FeSEMParams
from lcfed.methods.flhc import FLHC, FLHCParams
from lcfed.methods.ifca import IFCA, IFCAParams
from lcfed.methods.lcfed import LCFed, LCFedParams
from lcfed.methods.pacfl import PACFL, PACFLParams
from lcfed.methods.perfedavg import PerFedAvg, PerFedAvgParams
from lcfed.methods.scaffold import Scaffold, ScaffoldParams
from lcfed.methods.standalone import Standalone, StandaloneParams

METHODS: dict[str, MethodSpec] = {
    "lcfed": MethodSpec(LCFed, LCFedParams),
    "fedavg": MethodSpec(FedAvg, FedAvgParams),
    "standalone": MethodSpec(Standalone, StandaloneParams),
    "ifca": MethodSpec(IFCA, IFCAParams),
    "fesem": MethodSpec(FeSEM, FeSEMParams),
    "fedper": MethodSpec(FedPer, FedPerParams),
    "cgpfl": MethodSpec(CGPFL, CGPFLParams),
    "fedgroup": MethodSpec(FedGroup, FedGroupParams),
    "flhc": MethodSpec(FLHC, FLHCParams),
    "perfedavg": MethodSpec(PerFedAvg, PerFedAvgParams),
    "clusterfl": MethodSpec(ClusterFL, ClusterFLParams),
    "fedac": MethodSpec(FedAC, FedACParams),
    "dcpfl": MethodSpec(DCPFL, DCPFLParams),
    "fedprox": MethodSpec(FedProx, FedProxParams),
    "scaffold": MethodSpec(Scaffold, ScaffoldParams),
    "ditto": MethodSpec(Ditto, DittoParams),
    "apfl": MethodSpec(APFL, APFLParams),
    "fedrep": MethodSpec(FedRep, FedRepParams),
    "cfl": MethodSpec(CFL, CFLParams),
    "fedem": MethodSpec(FedEM, FedEMParams),
    "pacfl": MethodSpec(PACFL, PACFLParams),
    "fedsoft": MethodSpec(FedSoft, FedSoftParams),
}

__all__ = ["METHODS", "MethodSpec", "Strategy"]
