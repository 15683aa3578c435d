"""Choosing the schedule and width of each call: acceptance statistics and expected throughput."""
