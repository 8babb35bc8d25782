"""Trace files to timelines: discovery, the Kineto and torch-npu decoders, busy definitions, memory
records and intervals."""
