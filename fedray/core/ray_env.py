"""Starting or joining Ray, in one place (``fedray run``, sweeps, studies, jobs)."""

from __future__ import annotations

import os

__all__ = ["ensure_ray"]


def ensure_ray(object_store_memory: int | None = None, *, private: bool = False, log_to_driver: bool = True,
               **init_kwargs) -> None:
    """Use the Ray instance this process already joined; else the cluster named by ``RAY_ADDRESS``
    (under ``ray job submit`` or a configured cluster: connect, size nothing); else start a local one.

    ``private`` starts the local instance with ``address="local"``, so a ``ray start`` cluster recorded on
    this host is never joined (client-count sweeps measure a machine of their own). ``init_kwargs`` go to
    ``ray.init`` for a local start only."""
    import ray

    if ray.is_initialized():
        return
    if os.environ.get("RAY_ADDRESS"):
        ray.init()
        return
    kwargs = dict(include_dashboard=False, log_to_driver=log_to_driver)
    if object_store_memory:
        kwargs["object_store_memory"] = int(object_store_memory)
    kwargs.update(init_kwargs)
    if private:
        kwargs["address"] = "local"
    ray.init(**kwargs)
