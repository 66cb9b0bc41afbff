"""tfbuffers: replay buffers for TensorFlow and TF-Agents.

Drop-in replacements for `tf_agents.replay_buffers` that check their input,
keep every sampled window inside one environment's segment, and share one API
across an in-graph buffer and a numpy buffer.
"""

from tfbuffers.manager import ReplayBufferManager
from tfbuffers.prioritized import importance_weights
from tfbuffers.py_prioritized_replay_buffer import PyPrioritizedReplayBuffer
from tfbuffers.py_uniform_replay_buffer import PyUniformReplayBuffer
from tfbuffers.replay_buffer import BufferInfo, ReplayBuffer
from tfbuffers.reverb_replay_buffer import ReverbReplayBuffer, sharded_dataset
from tfbuffers.state import BufferState
from tfbuffers.tf_prioritized_replay_buffer import TFPrioritizedReplayBuffer
from tfbuffers.tf_uniform_replay_buffer import TFUniformReplayBuffer

__all__ = [
    "BufferInfo",
    "BufferState",
    "PyPrioritizedReplayBuffer",
    "PyUniformReplayBuffer",
    "ReplayBuffer",
    "ReplayBufferManager",
    "ReverbReplayBuffer",
    "TFPrioritizedReplayBuffer",
    "TFUniformReplayBuffer",
    "importance_weights",
    "sharded_dataset",
]

__version__ = "0.1.0"
