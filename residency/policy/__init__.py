"""The retention policy: allocator telemetry and `BoundedAllocatorCache` with its arms."""
