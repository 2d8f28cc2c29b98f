"""gpuledger: the accountability layer above a GPU cluster's scheduler."""

__version__ = "0.1.0"
