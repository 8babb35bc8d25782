"""Orchestration: service files, starting services, the HTTP client and the paired designs that
write run directories."""
