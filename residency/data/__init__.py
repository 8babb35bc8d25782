"""Package data: the published NPU figures (`h3_ref2va_910b1.json`, provenance in README.md)."""
