"""The run directory: its layout and manifest, the seal, loading and verification, and the
attribution of decisions to requests."""
