"""A device that answers values outside what its manual allows is refused by name, at once.

Issue 36, item 9: an MCP39F511N whose accumulation-interval register read 9 recorded, then
raised in a thread at the end when putting 9 back, and was left changed; a WT300E whose
integration timer answered INF raised a bare OverflowError.
"""

from __future__ import annotations

import pytest

from tests.test_mcp39f511_protocol import OPEN, PORT, reply, request
from tests.test_wt300e_protocol import connected
from wattlab.acquisition.acquirers.mcp39f511_acquirer import Mcp39f511Acquirer
from wattlab.errors import MeterError, MeterProtocolError
from wattlab.testing import ExpectedProtocol

pytestmark = pytest.mark.fast


@pytest.mark.parametrize("n", [9, 0xFFFF])
def test_mcp39f511_accumulation_interval_outside_0_to_8_is_refused_at_open(n):
    found = [OPEN[0], (request(0x00A8, 2), reply(n.to_bytes(2, "little")))]
    proto = ExpectedProtocol(found)
    acq = Mcp39f511Acquirer(PORT, transport_factory=lambda port: proto)
    with pytest.raises(MeterError, match=rf"{PORT}: .*0x00A8.* N = {n}, outside 0\.\.8"):
        acq.open()
    proto.assert_consumed()  # nothing written: the chip is left as it was found


@pytest.mark.parametrize("answer", ["INF,0,0", "0,NAN,0", "1e400,0,0", "-1,0,0", "1,2"])
def test_wt300e_integration_timer_answer_that_is_not_a_time_is_a_protocol_error(answer):
    meter, t = connected([(":INTEG:TIM?", answer)])
    with pytest.raises(MeterProtocolError, match=r":INTEG:TIM\? answered"):
        _ = meter.integration_timer_s
    t.assert_consumed()
