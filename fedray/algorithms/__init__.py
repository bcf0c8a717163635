"""Algorithm registry: importing this package registers every shipped algorithm."""

from fedray.algorithms.base import Algorithm, ClientContext, ClientUpdate  # noqa: F401
from fedray.algorithms.registry import ALGORITHMS, algorithm_of, build_algorithm, register  # noqa: F401
from fedray.algorithms.registry import register as register_algorithm  # noqa: F401  (the public name, fedray.register_algorithm)
from fedray.algorithms import fedavg  # noqa: F401
from fedray.algorithms import fedrcl, baselines  # noqa: F401  (FedRCL, FedSCL, FedCL; FitNet, MOON, FedLC, FedNTD, FedDecorr, FedMLB, FedProc, FedDyn)
from fedray.algorithms import prototypes, fedccl  # noqa: F401  (FedProto, FPL, FedPCL, FedCCL, FedCCL+, FedAvg+)
from fedray.algorithms import split, logit  # noqa: F401  (SCALA, SplitFed V1/V2/V3, SFL local loss; FedLogit, FedLA)
from fedray.algorithms.server_opt import SERVER_OPTIMIZERS, build_server_optimizer, register_server_optimizer  # noqa: F401
