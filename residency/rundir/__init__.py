"""The run directory: its layout and manifest, the seal, loading and verification, and the
assignment of decisions to requests."""
