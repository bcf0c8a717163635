"""Flower ServerApp and ClientApp of the benchmark workload.

Server: ``flwr.serverapp.strategy.FedAvg`` with two overrides that the workload needs: ``configure_train``
sends round ``r``'s messages to the clients sampled by ``default_rng([0, r])`` (in that order, empty
clients dropped) and ``aggregate_train`` hands the replies to FedAvg's own aggregation in that sampled
order (WORKLOAD.md §5: that is exactly ``aggregate_arrayrecords``, so the weights match the floor).
The simulation engine maps its SuperNodes to partitions at random and does not tell the ServerApp, so
the server fixes its own bijection (partition i <-> the i-th smallest node id) and names the partition
in each message's config; the ClientApp trains that partition. No federated evaluation; the global
model is evaluated centrally once, after the last round.

The workload (W1 / W2 / pfl-shape, and pfl-shape's data file) is set in :data:`CONFIG` by the launcher (the ServerApp runs in the launcher's
process under ``run_simulation``); timings are recorded in :data:`TIMES` (perf_counter at the start of
round 1 and at the end of every round's aggregation).
"""

from __future__ import annotations

import time

import torch

from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MessageType, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

from bench.flower_app import task

CONFIG: dict = {"workload": "W1", "data": ""}
TIMES: dict = {"round_end": []}
RESULT: dict = {}

# ---------------------------------------------------------------------------------------------- client
client_app = ClientApp()


@client_app.train()
def train(msg: Message, context: Context) -> Message:
    torch.set_num_threads(1)
    cfg = msg.content["config"]
    cid, rnd, workload, data = int(cfg["partition-id"]), int(cfg["server-round"]), cfg["workload"], cfg["data"]
    model = task.initial_model(workload)
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    n = task.train_client(model, workload, data, cid, rnd)
    content = RecordDict({
        "arrays": ArrayRecord(model.state_dict()),
        "metrics": MetricRecord({"num-examples": n}),
        "client": ConfigRecord({"partition-id": cid}),
    })
    return Message(content=content, reply_to=msg)


# ---------------------------------------------------------------------------------------------- server
class SampledOrderFedAvg(FedAvg):
    """FedAvg with the workload's sampling and sampled-order aggregation (see the module docstring)."""

    def __init__(self, num_clients: int, per_round: int):
        super().__init__(fraction_train=1.0, fraction_evaluate=0.0, min_available_nodes=num_clients)
        self.num_clients = num_clients
        self.per_round = per_round
        self.node_of: dict[int, int] = {}
        self.order: list[int] = []

    def configure_train(self, server_round, arrays, config, grid: Grid):
        if not self.node_of:
            # FedAvg's own sampling waits until min_available_nodes are registered; this override samples
            # itself, so it waits the same way (the engine may still be registering SuperNodes: 1,000 of them
            # under load were not there yet at round 1). Counted in start-up, before round 1's clock starts.
            deadline = time.monotonic() + 600
            while len(nodes := sorted(grid.get_node_ids())) < self.num_clients and time.monotonic() < deadline:
                time.sleep(0.1)
            if len(nodes) < self.num_clients:
                raise RuntimeError(f"{len(nodes)} SuperNodes for {self.num_clients} clients")
            self.node_of = {i: nodes[i] for i in range(self.num_clients)}
        if server_round == 1:
            TIMES["rounds_start"] = time.perf_counter()
        self.order = task.sampled_clients(CONFIG["workload"], CONFIG["data"], server_round)
        messages = []
        for cid in self.order:
            cfg = ConfigRecord({"server-round": server_round, "partition-id": cid, "workload": CONFIG["workload"],
                                "data": CONFIG["data"]})
            record = RecordDict({self.arrayrecord_key: arrays, self.configrecord_key: cfg})
            messages.append(Message(content=record, message_type=MessageType.TRAIN, dst_node_id=self.node_of[cid]))
        return messages

    def aggregate_train(self, server_round, replies):
        replies = list(replies)
        errors = [m for m in replies if m.has_error()]
        if errors:
            raise RuntimeError(f"round {server_round}: {len(errors)} client errors, first: {errors[0].error.reason}")
        rank = {cid: i for i, cid in enumerate(self.order)}
        replies.sort(key=lambda m: rank[int(m.content["client"]["partition-id"])])
        out = super().aggregate_train(server_round, replies)
        TIMES["round_end"].append(time.perf_counter())
        return out


server_app = ServerApp()


@server_app.main()
def main(grid: Grid, context: Context) -> None:
    w = task.WORKLOADS[CONFIG["workload"]]
    TIMES["server_main"] = time.perf_counter()
    model = task.initial_model(CONFIG["workload"])
    strategy = SampledOrderFedAvg(w.num_clients, w.per_round)
    result = strategy.start(grid=grid, initial_arrays=ArrayRecord(model.state_dict()), num_rounds=w.rounds)
    model.load_state_dict(result.arrays.to_torch_state_dict())
    RESULT["accuracy"] = task.accuracy(model, CONFIG["workload"], CONFIG["data"])
    RESULT["weights_hash"] = task.weights_hash(model.state_dict())
