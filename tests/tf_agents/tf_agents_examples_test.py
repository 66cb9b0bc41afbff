"""TF-Agents' own example programs, run with tfbuffers by changing their buffer import (scripts/tf_agents_examples.py).

Each program runs a few iterations in a child process; the programs and their
arguments are the script's. They train, evaluate, write summaries and, where
the program does, checkpoint the buffer and restore it.
"""

from __future__ import annotations

import importlib
import pathlib
import sys

import numpy as np
import pytest

SCRIPTS = pathlib.Path(__file__).resolve().parents[2] / "scripts"
sys.path.insert(0, str(SCRIPTS))
examples = importlib.import_module("tf_agents_examples")

TIMEOUT = 300.0
# TF-Agents 0.19's CategoricalProjectionNetwork calls int() on a one-element array; numpy 1.25 deprecated that and
# numpy 2.4 refuses it: TF-Agents' discrete actor networks (REINFORCE's here) fail from numpy 2.4 on, any buffer.
NUMPY_REFUSES_ARRAY_INT = np.lib.NumpyVersion(np.__version__) >= "2.4.0"
CATEGORICAL_FAILURE = "TypeError: only 0-dimensional arrays can be converted to Python scalars"


def rows(outcomes):
    return [(outcome.name, outcome.returncode, outcome.why) for outcome in outcomes]


@pytest.mark.parametrize("name", sorted(examples.EXAMPLES))
def test_the_buffer_import_is_the_one_line_swapped(name):
    example = examples.EXAMPLES[name]
    original = examples.program_source(example, "tf-agents")
    swapped = examples.program_source(example, "tfbuffers")
    assert original.count(examples.IMPORT) == 1 and examples.IMPORT not in swapped
    assert swapped == original.replace(examples.IMPORT, examples.SWAPPED)
    assert "tf_uniform_replay_buffer.TFUniformReplayBuffer(" in swapped


@pytest.mark.parametrize("name", ["ppo", "ddpg", "sac"])
def test_a_program_trains_with_tfbuffers(name, tmp_path):
    assert rows(examples.run_programs([name], "tfbuffers", tmp_path, TIMEOUT)) == [(name, 0, "")]


def test_dqn_checkpoints_its_tfbuffers_buffer_and_a_second_run_restores_it(tmp_path):
    outcomes = examples.run_programs(["dqn", "dqn-resumed"], "tfbuffers", tmp_path, TIMEOUT)
    assert rows(outcomes) == [("dqn", 0, ""), ("dqn-resumed", 0, "")]
    checkpoints = tmp_path / "dqn" / "train" / "replay_buffer"
    first, resumed = (outcome.log.read_text() for outcome in outcomes)
    assert f"No checkpoint available at {checkpoints}\n" in first
    # The first run checkpoints every 100 of its 200 iterations; the second restores the newest and goes on to 400.
    assert f"Checkpoint available: {checkpoints / 'ckpt-200'}\n" in resumed
    assert (checkpoints / "ckpt-400.index").exists()


def test_reinforce_trains_with_tfbuffers_where_tf_agents_itself_runs(tmp_path):
    outcomes = examples.run_programs(["reinforce"], "tfbuffers", tmp_path / "tfbuffers", TIMEOUT)
    if not NUMPY_REFUSES_ARRAY_INT:
        assert rows(outcomes) == [("reinforce", 0, "")]
        return
    # TF-Agents' own failure, raised before any buffer exists: the same with TF-Agents' buffer.
    theirs = examples.run_programs(["reinforce"], "tf-agents", tmp_path / "tf-agents", TIMEOUT)
    for outcome in [*outcomes, *theirs]:
        assert (outcome.returncode, outcome.why) == (1, CATEGORICAL_FAILURE)
        assert "tf_agents/networks/categorical_projection_network.py" in outcome.log.read_text()


def test_the_script_refuses_unknown_programs_and_a_resumed_run_alone(capsys):
    with pytest.raises(SystemExit):
        examples.main(["dqn", "pong"])
    assert (
        "examples: expected names of dqn, dqn-resumed, reinforce, ppo, ddpg, sac, got 'pong'" in capsys.readouterr().err
    )
    with pytest.raises(SystemExit):
        examples.main(["dqn-resumed"])
    assert "examples: a resumed run needs its first run; add dqn" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        examples.main(["--timeout", "0"])
    assert "--timeout: expected a positive number of seconds, got 0" in capsys.readouterr().err
