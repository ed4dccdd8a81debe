"""Distributed training profiled rank by rank."""
