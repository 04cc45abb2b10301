"""Link rates of the emulated hosts as the experiments take them (``--rates 1gbit,100mbit``), and the
cost model's network for such a link; shared by the scaling and commbench grids on emulated hosts."""

from __future__ import annotations

from ..emulation.netns import parse_rate
from . import costmodel


class RateError(ValueError):
    """A bad ``--rates`` value; the message names the flag."""


def parse_rates(text: str) -> list[str]:
    rates = [r.strip() for r in text.split(",") if r.strip()]
    if not rates:
        raise RateError("--rates: give at least one rate, e.g. 1gbit,100mbit")
    for r in rates:
        try:
            parse_rate(r)
        except ValueError as e:
            raise RateError(str(e).replace("--link-rate", "--rates")) from None
    return rates


def link_network(rate: str) -> costmodel.Network:
    """The cost model's network for emulated links of ``rate``: no latency is added, B = rate / 8."""
    bits = parse_rate(rate)
    return costmodel.Network(alpha=0.0, bandwidth=bits / 8 if bits else float("inf"))
