"""hoprl: train and serve multi-hop retrieval agents with reinforcement learning."""

__version__ = "0.1.0"
