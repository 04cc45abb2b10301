"""The parameter-server exchange: :mod:`.exchange` (workers and servers), :mod:`.sharding` (which
server owns which bytes)."""

from .exchange import ParameterServer

__all__ = ["ParameterServer"]
