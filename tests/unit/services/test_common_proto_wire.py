"""The types moved to common.proto keep the wire format of the copies they replaced.

The expected bytes were encoded by the stubs of commit 2d086e2, before the move, when
api.proto and worker.proto each declared their own SampleStats and FinishReason: a worker or
client built before the move reads these messages unchanged, and the other way round.
"""

import pytest

from attnstore.api.v1 import api_pb2 as api
from attnstore.worker.v1 import worker_pb2 as worker


def _sampled_stats(module):  # a TurnStats with a finish reason and one SampleStats
    sample = module.SampleStats(
        sample_index=1, generated_tokens=300, finish_reason=module.FINISH_REASON_LENGTH
    )
    return module.TurnStats(finish_reason=module.FINISH_REASON_STOP_STRING, samples=[sample])


@pytest.mark.parametrize(
    ("module", "before_move"),
    [(worker, "6003920107080110ac021802"), (api, "40037207080110ac021802")],
)
def test_turn_stats_encode_as_before_the_move(module, before_move: str) -> None:
    stats = _sampled_stats(module)
    assert stats.SerializeToString().hex() == before_move
    assert module.TurnStats.FromString(bytes.fromhex(before_move)) == stats


def test_public_message_finish_reason_encodes_as_before_the_move() -> None:
    message = api.Message(role=api.ROLE_ASSISTANT, content="hi", finish_reason=api.FINISH_REASON_STOP)
    assert message.SerializeToString().hex() == "0803120268691801"


def test_worker_samples_pass_to_the_public_api_unchanged() -> None:
    # The scheduler forwards a worker's endings to the application: one type on both sides.
    assert api.SampleStats is worker.SampleStats
    assert api.TurnStats(samples=_sampled_stats(worker).samples).samples[0].generated_tokens == 300
