"""Algorithm registry: importing this package registers every shipped algorithm."""

from fedray.algorithms.base import ALGORITHMS, Algorithm, ClientContext, ClientUpdate, build_algorithm, register  # noqa: F401
from fedray.algorithms import fedavg  # noqa: F401
from fedray.algorithms.server_opt import SERVER_OPTIMIZERS, build_server_optimizer  # noqa: F401
