"""Round programs: how one round runs on the coordinator. The coordinator picks one at construction
(:func:`program_for`): the federated program or the split program."""

from __future__ import annotations

from fedray.engine.programs.federated import FederatedProgram
from fedray.engine.programs.split import SplitProgram

__all__ = ["FederatedProgram", "SplitProgram", "program_for"]

PROGRAMS = {"federated": FederatedProgram, "split": SplitProgram}


def program_for(algorithm):
    """The program class an algorithm declares (``Algorithm.program``)."""
    try:
        return PROGRAMS[algorithm.program]
    except KeyError:
        raise ValueError(f"algorithm {algorithm.name!r} declares an unknown round program "
                         f"{algorithm.program!r} (known: {', '.join(PROGRAMS)})") from None
