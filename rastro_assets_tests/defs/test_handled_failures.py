"""A failure the product handles reads as one line naming its cause and the guide's section:
in the step's failure event Dagster stores, and in the demo's terminal, which passes on no
stack of Dagster's frames for it."""

from __future__ import annotations

import re

from rastro_assets.demo.dagster_output import DagsterOutput
from rastro_assets_tests.conftest import TOKEN
from rastro_assets_tests.defs import waves
from rastro_assets_tests.defs.waves import live

WORDS = (
    "every account of the wave failed (2): META_TOKEN_INVALID on act_101, act_202"
    ' (docs/errors.md, "META_TOKEN_INVALID")'
)


def test_a_dead_token_fails_the_wave_in_one_line_of_the_products_words(
    instance, rastro, linked_world, capfd
):
    linked_world.kill_token(TOKEN)
    capfd.readouterr()
    result = waves.run_wave(
        instance, rastro, [live("act_101"), live("act_202")], raise_on_error=False
    )
    printed = capfd.readouterr().err
    assert not result.success

    [failure] = [event for event in result.all_events if event.event_type_value == "STEP_FAILURE"]
    data = failure.step_failure_data
    assert data.user_failure_data.description == WORDS
    # The product's words, not a wrapper around an exception of its own.
    assert data.error.cls_name == "Failure"
    assert data.error.message.strip() == f"dagster._core.definitions.events.Failure: {WORDS}"
    assert data.error.cause is None
    assert TOKEN not in printed

    # What the run worker printed, as the demo passes it on.
    assert 'File "' in printed  # Dagster prints its frames: the sifting is what is tested
    sifter = DagsterOutput()
    shown = [out for line in printed.splitlines(True) for out in sifter.sift(line)]
    shown += sifter.finish()
    assert not [line for line in shown if "Traceback" in line or 'File "' in line], shown
    errors = [line for line in shown if " - ERROR - " in line]
    assert len(errors) == 1, shown
    assert re.search(r"STEP_FAILURE - Execution of step \"sync_wave\" failed: ", errors[0])
    assert errors[0].rstrip().endswith(WORDS)
