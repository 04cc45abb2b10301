"""The parameter-server exchange: :mod:`.exchange` (the workers' side and the roles), :mod:`.server`
(the servers' side and the wire format), :mod:`.optimizer` (the user's optimizer sent to the servers,
held on the workers and gathered back), :mod:`..bucketing` (which server owns which bytes)."""

from .exchange import ParameterServer

__all__ = ["ParameterServer"]
